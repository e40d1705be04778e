"""TRL's `SFTTrainer` (plain, packing, with an eval set, with a LoRA adapter) and `DPOTrainer`, run unchanged on
hf_lightning (`hf_lightning.use_as_transformers_trainer()` before `import trl`), equal the same TRL trainers on the
real `transformers.Trainer`: every logged value (losses, grad norms, learning rates, TRL's own metrics: entropy,
token accuracy, token counts, DPO rewards and log-probabilities, evaluation metrics), the checkpoint folders, TRL's
model card (written by its `_save_checkpoint` override) and the checkpoint weights; a run resumed from its mid-run
checkpoint ends where the uninterrupted one does; 2 processes (gloo) match HF's 2 processes.

The swap is process-wide, so each base runs in its own process (tests/scripts/trl_train.py), both started together,
every kind in one process per base (TRL's imports cost most of a run). trl 1.16.0, transformers 5.24.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import child_result
from safetensors.torch import load_file

SCRIPT = Path(__file__).parent / "scripts" / "trl_train.py"
KINDS = ["sft", "sft_packing", "sft_eval", "sft_peft", "dpo"]
VOLATILE = ("runtime", "per_second")
"""Log keys that differ between equal runs (timings)."""


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1"}


def _start(spec: dict, launcher: list[str] | None = None) -> subprocess.Popen:
    command = [*(launcher or [sys.executable]), str(SCRIPT), json.dumps(spec)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())


def _result(process: subprocess.Popen, timeout: float = 1200) -> dict:
    return child_result(process, timeout, "the TRL run")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every kind on both bases (ours also resumed from checkpoint-3), the two processes side by side."""
    root = tmp_path_factory.mktemp("trl")
    hf = _start({"base": "hf", "root": str(root / "hf"), "kinds": KINDS, "resume": True})
    ours = _start({"base": "ours", "root": str(root / "ours"), "kinds": KINDS, "resume": True})
    return root, _result(hf), _result(ours)


def stable(log: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if not any(word in k for word in VOLATILE)} for entry in log]


def assert_same_log(got: list[dict], want: list[dict]) -> None:
    got, want = stable(got), stable(want)
    assert [sorted(e) for e in got] == [sorted(e) for e in want] and got
    for ours, hf in zip(got, want):
        assert ours == pytest.approx(hf, rel=1e-6, abs=1e-9), hf["step"]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    names = [name for name in ("adapter_model.safetensors", "model.safetensors") if (folder / name).is_file()]
    assert names, f"no weights in {folder}: {sorted(p.name for p in folder.iterdir())}"
    return load_file(str(folder / names[0]))


def assert_same_weights(got: Path, want: Path) -> None:
    ours, hf = weights(got), weights(want)
    assert sorted(ours) == sorted(hf)
    for name, tensor in hf.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=1e-6, msg=name)


def _ok(result: dict, kind: str) -> dict:
    assert "error" not in result[kind], result[kind].get("error")
    return result[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_trl_trainer_on_hf_lightning_equals_it_on_transformers(runs, kind):
    root, hf, ours = runs
    want, got = _ok(hf, kind), _ok(ours, kind)
    assert_same_log(got["log"], want["log"])
    assert got["checkpoints"] == want["checkpoints"] == ["checkpoint-3", "checkpoint-6"]
    assert got["card"] and want["card"]  # TRL's `_save_checkpoint` override wrote its model card
    for name in want["checkpoints"]:
        assert_same_weights(root / "ours" / kind / name, root / "hf" / kind / name)
    if kind == "sft_eval":
        assert any("eval_loss" in e and "eval_mean_token_accuracy" in e for e in got["log"])
    if kind == "dpo":
        assert any("rewards/margins" in e for e in got["log"])


@pytest.mark.parametrize("kind", KINDS)
def test_trl_run_resumed_from_its_mid_run_checkpoint_ends_as_the_uninterrupted_one(runs, kind):
    """Resumed from checkpoint-3: the same updates 4-6 and final weights as without the stop, and the same log as
    HF's resumed run (TRL's own counters, such as `num_tokens`, start again at 0 on both bases: TRL does not
    checkpoint them)."""
    root, hf, ours = runs
    resumed, hf_resumed = _ok(ours, kind + "-resumed"), _ok(hf, kind + "-resumed")
    assert_same_log(resumed["log"], hf_resumed["log"])
    counters = ("num_tokens", "eval_num_tokens")
    after = [{k: v for k, v in e.items() if k not in counters} for e in resumed["log"] if e["step"] > 3]
    whole = [{k: v for k, v in e.items() if k not in counters} for e in _ok(ours, kind)["log"] if e["step"] > 3]
    assert_same_log([e for e in after if "train_loss" not in e], [e for e in whole if "train_loss" not in e])
    assert_same_weights(root / "ours" / f"{kind}-resumed" / "checkpoint-6", root / "hf" / kind / "checkpoint-6")


@pytest.mark.distributed
def test_sft_on_two_processes_equals_hfs_two_processes(tmp_path):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    oracle = [*launcher, str(Path(__file__).parent / "scripts" / "oracle_clean_exit.py")]  # see its docstring
    hf = _start({"base": "hf", "root": str(tmp_path / "hf"), "kinds": ["sft"]}, launcher=oracle)
    hf_result = _result(hf)
    ours = _start({"base": "ours", "root": str(tmp_path / "ours"), "kinds": ["sft"]}, launcher=launcher)
    got, want = _ok(_result(ours), "sft"), _ok(hf_result, "sft")
    assert_same_log(got["log"], want["log"])
    assert got["checkpoints"] == want["checkpoints"]
    for name in want["checkpoints"]:
        assert_same_weights(tmp_path / "ours" / "sft" / name, tmp_path / "hf" / "sft" / name)
