"""CUDA only (`gpu` marker; skipped without a CUDA device): uneven evaluation, prediction, generation and the saved
model under FSDP1 and DeepSpeed ZeRO-3, against a plain single-GPU run.

Each scenario runs tests/scripts/sharded_eval.py (its docstring lists the runs: eval sets of 1, 3, 9 and 101 rows in
batches of 2 and 3, `predict()` on each, T5 and decoder-only generation with `synced_gpus`, `save_model()` of a GPT-2
with a tied `lm_head`) on min(2, GPUs) devices with HF's `fsdp_config={"version": 1}` or a ZeRO-3 `deepspeed`
config, and once plainly on one GPU.

What one GPU proves: the FSDP1 root and the ZeRO-3 engine evaluate, predict and generate through the strategy's
own eval step (the path the padding steps take), FSDP1's `generate` runs inside `summon_full_params`, and both
save the tied weight once. What only a machine with 2 or more GPUs proves: that the short rank's padding steps pair
with the busiest rank's last forwards over NCCL (no hang) under FSDP1 and ZeRO-3, and that both ranks then hold the
single-process results (the CPU proves this for FSDP2 over gloo: tests/test_sharded_eval.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "sharded_eval.py"
SCENARIOS = {"fsdp1": "FSDPStrategy", "zero3": "HFDeepSpeedStrategy"}


def _run(out: Path, devices: int, strategy: str) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_CACHE": str(out / "cache")}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), str(devices), strategy, "gpu"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(devices)]


def _close(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    """Counts and order exactly; floats to float32 rounding (another CUDA kernel may sum in another order)."""
    assert got.keys() == want.keys(), what
    for key, value in want.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (what, key)
        elif key != "sha":  # the bytes of the logits: float rounding again, compared through "sum"
            assert got[key] == value, (what, key)


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", list(SCENARIOS))
def test_uneven_eval_predict_and_generation_under_a_sharded_strategy_match_one_plain_gpu(
        tmp_path: Path, strategy: str) -> None:
    devices = min(2, torch.cuda.device_count())
    ranks = _run(tmp_path / strategy, devices, strategy)
    (plain,) = _run(tmp_path / "plain", 1, "plain")
    assert ranks[0]["strategy"] == SCENARIOS[strategy]
    for result in ranks:
        for batch_size in (2, 3):
            got, want = result[f"facade_bs{batch_size}"], plain[f"facade_bs{batch_size}"]
            for n in (1, 3, 9, 101):
                if devices > 1 and n == 3 and batch_size == 3:
                    continue  # fewer batches than processes: other batches, see tests/test_sharded_eval.py
                assert got[f"eval_n{n}_n"] == n and got[f"eval_n{n}_in_order"] == 1.0
                _close({k: v for k, v in got.items() if k.startswith(f"eval_n{n}_")},
                       {k: v for k, v in want.items() if k.startswith(f"eval_n{n}_")}, f"eval bs{batch_size} n{n}")
                _close(result[f"predict_bs{batch_size}_n{n}"]["metrics"] | {"shape": 0},
                       plain[f"predict_bs{batch_size}_n{n}"]["metrics"] | {"shape": 0}, f"predict bs{batch_size} n{n}")
                for key in ("shape", "label_ids"):
                    assert result[f"predict_bs{batch_size}_n{n}"][key] == plain[f"predict_bs{batch_size}_n{n}"][key]
        for name in ("t5", "gpt2"):
            assert result[f"gen_{name}_predictions"] == plain[f"gen_{name}_predictions"], name
            assert result[f"gen_{name}_labels"] == plain[f"gen_{name}_labels"], name
            assert result[f"gen_{name}_synced"] is (devices > 1), name  # HF's default: synced when sharded
    if devices > 1:  # every rank called generate equally often (evaluate + predict: 2 batches each)
        assert {r["gen_t5_calls"] for r in ranks} == {4} and {r["gen_gpt2_calls"] for r in ranks} == {4}
    from safetensors.torch import load_file

    saved = load_file(str(Path(ranks[0]["saved_model"]) / "model.safetensors"))
    reference = load_file(str(Path(plain["saved_model"]) / "model.safetensors"))
    assert saved.keys() == reference.keys() and "lm_head.weight" not in saved
