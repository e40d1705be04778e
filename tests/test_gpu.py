"""CUDA only (`gpu` marker; skipped without a CUDA device): precision and sharded strategies on real GPUs.

Each scenario runs tests/scripts/checkpoint_train.py on min(2, GPUs) devices, as HF arguments an HF user's script
would carry: an uninterrupted run of 6 updates saving every 2 (save_total_limit=2), then a run from other initial
weights resumed from its checkpoint-4 (mid-epoch), both seeded (not `full_determinism`, whose
`use_deterministic_algorithms(True)` makes kernels DeepSpeed and FSDP use raise: a failure here must be
hf_lightning's; see `GPU_DETERMINISM` in tests/scripts/checkpoint_train.py). The resumed run must continue the
uninterrupted one (same loss, grad norm, learning rate, to the tolerance of its precision: `TOLERANCE`), and the
checkpoints must be HF-layout folders with the full weights, loadable by `from_pretrained` in one process.

- fp16 (`fp16=True`): Lightning's grad scaler, saved as HF's `scaler.pt` and restored.
- bf16 (`bf16=True`).
- FSDP1 (`fsdp="full_shard auto_wrap"`, `fsdp_config={"version": 1}`): `HFFSDPStrategy` (Lightning's FSDPStrategy,
  the update outside the root's forward).
- FSDP2 (`fsdp="full_shard auto_wrap"`): HF's default version, sharded per layer by the default policy; with bf16
  and fp16 (accelerate's `MixedPrecisionPolicy`, fp16 with the grad scaler); FSDP1 and ZeRO-3 with bf16.
- On one GPU these run on 1 rank: their 2-rank CPU twins (collectives, sharding) are tests/test_sharded_twins.py.
- DeepSpeed ZeRO-2 / ZeRO-3 (`deepspeed=` a config with HF's "auto" values): the engine's checkpoint
  (`global_step<N>/`, `latest`) next to the gathered weights; with an `optimizer` section (HF's scheduler on the
  engine's basic optimizer), with `optimizer` and `scheduler` sections (both DeepSpeed's), with a `scheduler`
  section only (DeepSpeed's scheduler on HF's optimizer).
- DeepSpeed `load_best_model_at_end`, then further `train()` calls of the same trainer: they start from the best
  weights on every rank (the fp32 master partitions included) and train the model itself.
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
    "gpu-fsdp1": {"strategy": {"HFFSDPStrategy"}, "precision": "32-true", "files": {"optimizer_sharded"}},
    "gpu-fsdp2": {"strategy": {"HFFSDP2Strategy"}, "precision": "32-true", "files": {"optimizer_sharded"}},
    "gpu-zero2": {"strategy": {"HFDeepSpeedStrategy"}, "precision": "32-true", "files": {"latest", "global_step4"}},
    "gpu-zero3": {"strategy": {"HFDeepSpeedStrategy"}, "precision": "32-true", "files": {"latest", "global_step4"}},
    "gpu-zero2-optimizer": {"strategy": {"HFDeepSpeedStrategy"}, "precision": "32-true",
                            "files": {"latest", "global_step4"}, "hf_schedule": True},
    "gpu-zero3-scheduler": {"strategy": {"HFDeepSpeedStrategy"}, "precision": "32-true",
                            "files": {"latest", "global_step4"}},
    "gpu-zero2-hf-optimizer": {"strategy": {"HFDeepSpeedStrategy"}, "precision": "32-true",
                               "files": {"latest", "global_step4"}},
    "gpu-fsdp2-bf16": {"strategy": {"HFFSDP2Strategy"}, "precision": "bf16-mixed", "files": {"optimizer_sharded"}},
    "gpu-fsdp2-fp16": {"strategy": {"HFFSDP2Strategy"}, "precision": "16-mixed",
                       "files": {"optimizer_sharded", "scaler.pt"}},
    "gpu-fsdp1-bf16": {"strategy": {"HFFSDPStrategy"}, "precision": "bf16-mixed", "files": {"optimizer_sharded"}},
    "gpu-zero3-bf16": {"strategy": {"HFDeepSpeedStrategy"}, "precision": "bf16-mixed",
                       "files": {"latest", "global_step4"}},
}

TOLERANCE = {"32-true": 1e-5, "16-mixed": 2.0 ** -10, "bf16-mixed": 2.0 ** -7}
"""Relative tolerance of resumed vs uninterrupted values, per precision. Both runs execute the same kernels on the
same data in the same order; the only run-to-run difference left without `use_deterministic_algorithms` is the order
of atomic accumulations (e.g. embedding backward), which changes the last bit of a sum in the compute dtype and can
carry through two updates: float32 a few ulps (1e-5 relative), fp16 autocast one ulp of a 10-bit mantissa (2^-10),
bf16 autocast one ulp of a 7-bit mantissa (2^-7). Whether the match was exact is printed (`-s`)."""


def _close(a: list[tuple], b: list[tuple], precision: str = "32-true") -> None:
    """Same steps, and values equal within the precision's tolerance (see TOLERANCE)."""
    assert [e[0] for e in a] == [e[0] for e in b]
    for x, y in zip(a, b):
        assert x[1:] == pytest.approx(y[1:], rel=TOLERANCE[precision], abs=1e-7), x[0]
    print(f"[{precision}] resumed == uninterrupted exactly: {a == b}")


def _hf_learning_rates(steps: int = 6, warmup: int = 1, lr: float = 1e-2) -> list[float]:
    """HF's linear schedule (the oracle: transformers' own on a plain torch optimizer), the LR of each update."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


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
    _close(_losses(resumed, after=4), _losses(full, after=4), expected["precision"])
    if expected.get("hf_schedule"):  # DeepSpeed's optimizer, HF's schedule (built on the engine's basic optimizer)
        assert [e[3] for e in _losses(full)] == pytest.approx(_hf_learning_rates(), rel=1e-6)
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
        torch.testing.assert_close(weights[name], tensor, rtol=TOLERANCE[expected["precision"]], atol=1e-6, msg=name)


def _best_model_flow(tmp_path, scenario: str) -> None:
    result = tmp_path / "result.json"
    proc = _run("best", str(tmp_path), scenario, str(result), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(result.read_text())
    assert data["best"] is not None and data["best"] != data["last"], data  # else the check could not fail
    best = load_file(os.path.join(data["best"], "model.safetensors"))

    def same(folder: str) -> bool:
        weights = load_file(str(tmp_path / folder / "model.safetensors"))
        return all(torch.equal(weights[k], best[k]) for k in best)

    assert same("after_first")  # the best weights were loaded
    assert same("after_second")  # a run at learning rate 0 starts, and stays, on them (the masters too)
    assert not same("after_third")  # a run at 1e-2 trains the model's own weights


def test_the_best_model_flow_of_the_gpu_harness_runs_on_the_cpu(tmp_path):
    """The GPU test below, in one CPU process: the harness itself (best checkpoint not the last, three runs)."""
    _best_model_flow(tmp_path, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("scenario", ["gpu-zero2", "gpu-zero3"])
def test_deepspeed_best_model_then_train_again_continues_from_the_best_weights(tmp_path, scenario):
    """`load_best_model_at_end` under ZeRO-2/3 reaches every rank's partitions and fp32 masters (the engine's
    checkpoint, as HF), and the next `train()` builds a fresh optimizer (HF's `deepspeed_init`)."""
    _best_model_flow(tmp_path, scenario)


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
