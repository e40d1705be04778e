"""CUDA only (`gpu` marker; skipped without a CUDA device): precision and sharded strategies on real GPUs.

Each scenario runs tests/scripts/checkpoint_train.py on min(2, GPUs) devices, as HF arguments an HF user's script
would carry: an uninterrupted run of 6 updates saving every 2 (save_total_limit=2), then a run from other initial
weights resumed from its checkpoint-4 (mid-epoch), both with `full_determinism` (deterministic CUDA kernels). The
resumed run must continue the uninterrupted one (same loss, grad norm, learning rate), and the checkpoints must be
HF-layout folders with the full weights, loadable by `from_pretrained` in one process.

- fp16 (`fp16=True`): Lightning's grad scaler, saved as HF's `scaler.pt` and restored.
- bf16 (`bf16=True`).
- FSDP1 (`fsdp="full_shard auto_wrap"`, `fsdp_config={"version": 1}`): Lightning's FSDPStrategy.
- FSDP2 (`fsdp="full_shard auto_wrap"`): HF's default version, sharded per layer by the default policy.
- DeepSpeed ZeRO-2 / ZeRO-3 (`deepspeed=` a config with HF's "auto" values): the engine's checkpoint
  (`global_step<N>/`, `latest`) next to the gathered weights.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from test_checkpoint_processes import _losses, _run

SCENARIOS = {
    "gpu-fp16": {"strategy": {"SingleDeviceStrategy", "DDPStrategy"}, "precision": "16-mixed",
                 "files": {"scaler.pt", "optimizer.pt"}},
    "gpu-bf16": {"strategy": {"SingleDeviceStrategy", "DDPStrategy"}, "precision": "bf16-mixed",
                 "files": {"optimizer.pt"}},
    "gpu-fsdp1": {"strategy": {"FSDPStrategy"}, "precision": "32-true", "files": {"optimizer_sharded"}},
    "gpu-fsdp2": {"strategy": {"HFFSDP2Strategy"}, "precision": "32-true", "files": {"optimizer_sharded"}},
    "gpu-zero2": {"strategy": {"HFDeepSpeedStrategy"}, "precision": "32-true", "files": {"latest", "global_step4"}},
    "gpu-zero3": {"strategy": {"HFDeepSpeedStrategy"}, "precision": "32-true", "files": {"latest", "global_step4"}},
}


def _close(a: list[tuple], b: list[tuple]) -> None:
    """Same steps, and values equal to float32 rounding (deterministic kernels; reductions may regroup)."""
    assert [e[0] for e in a] == [e[0] for e in b]
    for x, y in zip(a, b):
        assert x[1:] == pytest.approx(y[1:], rel=1e-5, abs=1e-7), x[0]


@pytest.mark.gpu
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_gpu_training_saves_hf_checkpoints_and_resumes_exactly(tmp_path, scenario):
    expected = SCENARIOS[scenario]
    result = tmp_path / "result.json"
    proc = _run("resume", str(tmp_path), scenario, str(result), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(result.read_text())
    assert data["strategy"] in expected["strategy"] and data["precision"] == expected["precision"]
    assert data["world_size"] == min(2, torch.cuda.device_count())
    full, resumed = data["full"], data["resumed"]
    assert [e[0] for e in _losses(full)] == [1, 2, 3, 4, 5, 6]
    _close(_losses(resumed, after=4), _losses(full, after=4))
    assert sorted(os.listdir(tmp_path / "full")) == ["checkpoint-4", "checkpoint-6"]
    folder = tmp_path / "full" / "checkpoint-4"
    files = set(os.listdir(folder))
    assert {"model.safetensors", "config.json", "trainer_state.json", "scheduler.pt"} <= files
    assert expected["files"] <= files, files
    # full weights (gathered from the shards / partitions), loadable in one process
    from transformers import AutoModelForCausalLM

    weights = load_file(str(tmp_path / "full" / "checkpoint-6" / "model.safetensors"))
    assert weights["transformer.wte.weight"].shape == (64, 32)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final_model")
    final = load_file(str(tmp_path / "resumed" / "checkpoint-6" / "model.safetensors"))
    for name, tensor in final.items():
        torch.testing.assert_close(reloaded.state_dict()[name].to(tensor.dtype), tensor, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("scenario", ["gpu-fsdp1-async", "gpu-zero2-async"])
def test_save_async_is_refused_under_fsdp1_and_deepspeed(tmp_path, scenario):
    """Their weights are gathered and their optimizer written with collectives, which cannot run beside training:
    one error at the start of `fit`, no checkpoint (FSDP2's refusal runs on CPU in tests/test_async_save.py)."""
    result = tmp_path / "result.json"
    proc = _run("resume", str(tmp_path), scenario, str(result), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    error = json.loads(result.read_text())["error"]
    assert "save_async=True is not supported for a sharded model (FSDP2, FSDP or DeepSpeed)" in error
    assert not list((tmp_path / "full").glob("checkpoint-*"))
