"""DeepSpeed's real ZeRO-2 / ZeRO-3 engines on the CPU (deepspeed's CPU accelerator, one gloo process): the scheduler
HF builds for a config with an `optimizer` section, and weights loaded into a running engine (best model, weight
loads). Lightning's `DeepSpeedStrategy` itself is CUDA only: the whole runs are in tests/test_gpu.py.

The engine runs in a subprocess (tests/scripts/deepspeed_cpu.py): it initialises a process group and DeepSpeed's
global communication state, which must not leak into the other tests of this worker.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "deepspeed_cpu.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("deepspeed_cpu") / "result.json"
    env = {**os.environ, "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("stage", [2, 3])
def test_hf_scheduler_is_built_on_the_engines_basic_optimizer(engines, stage):
    """DeepSpeed's ZeRO wrapper is not a torch optimizer (torch's schedulers refuse it, the bug); HF's schedule on the
    basic optimizer reaches the wrapper's steps: the LR of each update is the oracle's (HF's schedule, plain torch)."""
    result = engines[f"stage{stage}"]["scheduler"]
    assert result["wrapper"] == {2: "DeepSpeedZeroOptimizer", 3: "DeepSpeedZeroOptimizer_Stage3"}[stage]
    assert result["is_torch_optimizer"] is False
    assert "error" not in result, result.get("error")
    assert result["lrs"] == pytest.approx(result["oracle_lrs"], rel=1e-12, abs=0)
    assert result["lrs"][0] == 0.0 and max(result["lrs"]) == pytest.approx(1e-2)  # warmup then decay: not constant


@pytest.mark.parametrize("stage", [2, 3])
def test_weights_loaded_into_a_running_engine_survive_its_next_step(engines, stage):
    """The fp32 master weights are refreshed from the loaded weights: an update with LR 0 (which copies the masters
    back into the model) leaves the loaded weights, not the ones from before the load."""
    result = engines[f"stage{stage}"]["load"]
    assert result["moved"] > 0  # the first update changed the weights: the check can tell the two apart
    assert result["loaded_equal"] is True
    assert result["after_step_equal"] is True


def test_a_wrapper_without_a_torch_optimizer_is_refused_by_name():
    from hf_lightning.parallel.strategies import scheduler_base_optimizer

    class Engine:
        basic_optimizer = None

    with pytest.raises(TypeError, match="Add a `scheduler` section"):
        scheduler_base_optimizer(Engine())
