"""The CPU twins of tests/test_gpu.py's sharded scenarios: what one GPU cannot show (collectives and sharding across
ranks: tests/test_gpu.py runs on min(2, GPUs) ranks, 1 on a one-GPU machine), on 2 CPU processes (gloo).

ONE torchrun launch of tests/scripts/sharded_twins.py runs every scenario (see its docstring); each test reads its
scenario's JSON. The FSDP2 32-true resume is tests/test_checkpoint_processes.py's "fsdp2", FSDP1 32-true
tests/test_fsdp1.py's, uneven evaluation tests/test_sharded_eval.py's. DeepSpeed has no CPU twin (Lightning refuses
DeepSpeed without CUDA); its optimizers are checked on the CPU in tests/test_deepspeed_cpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]

EXPECTED = {
    "fsdp2-bf16": ("HFFSDP2Strategy", "bf16-mixed", ["torch.bfloat16"]),
    "fsdp2-fp16": ("HFFSDP2Strategy", "16-mixed", ["torch.float16"]),
    "fsdp1-bf16": ("HFFSDPStrategy", "bf16-mixed", ["torch.bfloat16"]),
}
"""Per scenario: the strategy, the Lightning precision, the dtype of a layer's weight inside its forward."""


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("twins")
    env = {**os.environ, "HF_DATASETS_CACHE": str(out / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*LAUNCH, str(REPO / "tests" / "scripts" / "sharded_twins.py"), str(out)], cwd=out, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _losses(history: list[dict], after: int = 0) -> list[tuple]:
    return [(e["step"], e["loss"], e["grad_norm"], e["learning_rate"]) for e in history
            if "loss" in e and e["step"] > after]


@pytest.mark.distributed
@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_sharded_mixed_precision_on_two_ranks_resumes_exactly(twins: Path, scenario: str) -> None:
    """Sharded over 2 ranks, gathering in the policy's dtype, and the run resumed from checkpoint-4 replays updates
    5 and 6 of the uninterrupted one exactly (same processes, same kernels: bit for bit on the CPU)."""
    data = json.loads((twins / f"{scenario}.json").read_text())
    strategy, precision, dtypes = EXPECTED[scenario]
    assert (data["strategy"], data["precision"], data["seen_dtypes"]) == (strategy, precision, dtypes)
    assert data["world_size"] == 2 and data["sharded"] is True
    assert data["scaler"] is (precision == "16-mixed")
    full, resumed = _losses(data["full"]), _losses(data["resumed"], after=4)
    assert [e[0] for e in full] == [1, 2, 3, 4, 5, 6] and resumed == full[4:]
    files = set(os.listdir(twins / scenario / "full" / "checkpoint-4"))
    assert "optimizer_sharded" in files and ("scaler.pt" in files) is (precision == "16-mixed")  # the scaler's state
    for step in (4, 6):
        saved = load_file(str(twins / scenario / "full" / f"checkpoint-{step}" / "model.safetensors"))
        assert {str(t.dtype) for t in saved.values()} == {"torch.float32"}  # the fp32 masters, gathered
    final = load_file(str(twins / scenario / "resumed" / "checkpoint-6" / "model.safetensors"))
    for name, tensor in load_file(str(twins / scenario / "full" / "checkpoint-6" / "model.safetensors")).items():
        assert final[name].equal(tensor), name


@pytest.mark.distributed
def test_fp16_under_fsdp2_skips_overflowing_updates_on_every_rank_alike(twins: Path) -> None:
    """The fp16 loss times the grad scaler's 2^16 overflows float16 in the backward: the first updates are skipped
    (grad norm not finite, as HF logs it), counted as updates, and the learning rate waits for the first real step."""
    entries = [e for e in json.loads((twins / "fsdp2-fp16.json").read_text())["full"] if "loss" in e]
    skipped = [e["step"] for e in entries if e["grad_norm"] != e["grad_norm"]]
    assert skipped and skipped == list(range(1, len(skipped) + 1)) and len(skipped) < 6
    rates = [e["learning_rate"] for e in entries]
    assert rates[: len(skipped) + 1] == [rates[0]] * (len(skipped) + 1)  # the scheduler was not stepped


@pytest.mark.distributed
def test_fsdp2_bf16_on_two_ranks_trains_as_hfs_cpu_run(twins: Path) -> None:
    """HF's `fsdp` on CPU processes is DDP (accelerate's MULTI_CPU) with bf16 autocast: our DDP bf16 twin. FSDP2's
    policy gathers bf16 weights and casts the root's outputs (the loss) to bf16 (accelerate's `output_dtype`), so the
    values agree to bf16's resolution (2^-7 relative), not bit for bit; FSDP1 (no output cast) agrees closer."""
    reference = _losses(json.loads((twins / "ddp-bf16.json").read_text())["full"])
    fsdp2 = _losses(json.loads((twins / "fsdp2-bf16.json").read_text())["full"])
    fsdp1 = _losses(json.loads((twins / "fsdp1-bf16.json").read_text())["full"])
    assert [e[0] for e in fsdp2] == [e[0] for e in reference] == [1, 2, 3, 4, 5, 6]
    for ours, ref in zip(fsdp2, reference):
        assert ours[1:3] == pytest.approx(ref[1:3], rel=2.0 ** -7), ours[0]
        assert ours[3] == ref[3]
    for ours, ref in zip(fsdp1, reference):
        assert ours[1:3] == pytest.approx(ref[1:3], rel=2.0 ** -9), ours[0]
