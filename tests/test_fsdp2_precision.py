"""Mixed precision under the sharded strategies, as `transformers.Trainer` runs it (accelerate 1.15), in one process.

- FSDP2 (`fsdp=...`) with bf16 / fp16: accelerate's `MixedPrecisionPolicy` (read back from the FSDP2 modules, and the
  dtype a layer's weight has inside its forward), float32 master weights, fp16's grad scaler with HF's skipped steps.
- The policies equal accelerate's own (`FullyShardedDataParallelPlugin.set_mixed_precision`, the oracle), for FSDP2
  and for FSDP1 (Lightning's `FSDPPrecision`).
- Pairs that cannot run are refused when the `Trainer` is built, naming the pair.

HF's own `fsdp` does not run on the CPU (accelerate makes it DDP there), so these runs have no HF twin; the 2-process
runs against one process are in tests/test_sharded_twins.py.
"""

from __future__ import annotations

import pytest
import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from transformers import TrainerCallback

import hf_lightning
from hf_lightning.args.to_lightning import lightning_trainer_kwargs
from hf_lightning.parallel.fsdp2 import fsdp2_policy
from helpers import CPU_QUIET, lm_dataset, tiny_gpt2

ARGS = dict(fsdp="full_shard auto_wrap", per_device_train_batch_size=2, max_steps=3, learning_rate=1e-2,
            warmup_steps=0, logging_steps=1, save_strategy="no", seed=7, report_to="none", disable_tqdm=True,
            optim="adamw_torch")


class StepRecorder(TrainerCallback):
    """Each update's `optimizer_step_was_skipped` (HF's accelerator attribute) and learning rate."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.skipped: list[bool] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.skipped.append(bool(self.trainer.accelerator.optimizer_step_was_skipped))


def _run(tmp_path, lightning_kwargs: dict, **overrides):
    model = tiny_gpt2()
    seen: list[torch.dtype] = []
    # inside the FSDP2 group's forward the layer holds the gathered (unsharded) weight: its dtype is the policy's
    model.transformer.h[0].mlp.c_fc.register_forward_pre_hook(lambda m, _: seen.append(m.weight.dtype))
    trainer = hf_lightning.Trainer(model=model, args=hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), **{**ARGS, **overrides}), train_dataset=lm_dataset(n=12),
        lightning_kwargs={**CPU_QUIET, "devices": 1, **lightning_kwargs})
    recorder = StepRecorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    return trainer, seen, recorder


def _policies(model) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m._get_fsdp_state()._mp_policy for m in model.modules() if isinstance(m, FSDPModule)]


def _accelerate_policy(version: int, precision: str):
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version)
    plugin.set_mixed_precision(precision)
    return plugin.mixed_precision_policy


def test_bf16_under_fsdp2_gathers_bf16_over_fp32_masters(tmp_path, one_thread):
    trainer, seen, _ = _run(tmp_path, {}, bf16=True)
    assert str(trainer.lightning_trainer.precision) == "bf16-mixed"  # with accelerate's autocast
    assert seen and set(seen) == {torch.bfloat16}
    policies = _policies(trainer.model)
    assert len(policies) == 3 and all(p == _accelerate_policy(2, "bf16") for p in policies)  # 2 blocks + the root
    assert {p.to_local().dtype for p in trainer.model.parameters()} == {torch.float32}  # the master shards
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    # the root's outputs are cast to the policy's dtype (accelerate's output_dtype): the loss is a bf16 value
    assert len(losses) == 3 and all(torch.tensor(x).to(torch.bfloat16).item() == x for x in losses)


def test_bf16_with_a_plain_model_parallel_strategy_gets_the_same_policy(tmp_path, one_thread):
    """A `ModelParallelStrategy` of the user's own, no `fsdp=`: the default sharding gets accelerate's bf16 policy
    too (the precision plugin decides it, not the HF arguments)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)
    trainer, seen, _ = _run(tmp_path, {"strategy": strategy}, fsdp=None, bf16=True)
    assert trainer.lightning_trainer.strategy is strategy and seen and set(seen) == {torch.bfloat16}
    assert all(p == _accelerate_policy(2, "bf16") for p in _policies(trainer.model))
    assert {p.to_local().dtype for p in trainer.model.parameters()} == {torch.float32}


def test_fp16_under_fsdp2_gathers_fp16_with_a_grad_scaler_and_counts_skipped_steps(tmp_path, one_thread):
    """Explicit "16-mixed" (Lightning refuses the string with a ModelParallelStrategy): float16 autocast, the policy,
    a grad scaler. The fp16 loss times the initial scale 2^16 overflows float16 in the backward, so the first
    update is skipped, as on a GPU under HF: counted as an update (global_step), the scheduler not stepped."""
    trainer, seen, recorder = _run(tmp_path, {"precision": "16-mixed"}, warmup_steps=2)
    assert str(trainer.lightning_trainer.precision) == "16-mixed"
    assert seen and set(seen) == {torch.float16}
    assert all(p == _accelerate_policy(2, "fp16") for p in _policies(trainer.model))
    scaler = trainer.accelerator.scaler
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() < 2.0 ** 16
    assert trainer.state.global_step == 3 and recorder.skipped[0] is True and recorder.skipped[-1] is False
    rates = [e["learning_rate"] for e in trainer.state.log_history if "loss" in e]
    assert rates[1] == rates[0]  # the skipped update did not step the scheduler (HF: `optimizer_was_run`)
    assert {p.to_local().dtype for p in trainer.model.parameters()} == {torch.float32}


def test_fp16_with_fsdp_on_a_gpu_gets_the_fp16_plugin_not_lightnings_refused_string(recwarn):
    """`fp16=True` + `fsdp=` used to become precision="16-mixed", which Lightning refuses with a
    ModelParallelStrategy when `train()` starts; now a MixedPrecision plugin with a CUDA grad scaler (built here on a
    CPU machine: the scaler only warns that it has no CUDA)."""
    from lightning.pytorch.plugins.precision import MixedPrecision
    from lightning.pytorch.strategies import ModelParallelStrategy

    args = hf_lightning.TrainingArguments(fp16=True, fsdp="full_shard auto_wrap", report_to="none")
    for user in ({"accelerator": "gpu"},
                 {"accelerator": "cuda", "strategy": ModelParallelStrategy(data_parallel_size=2,
                                                                           tensor_parallel_size=1)}):
        kwargs = lightning_trainer_kwargs(args, user, tiny_gpt2())
        assert "precision" not in kwargs
        (plugin,) = kwargs["plugins"]
        assert isinstance(plugin, MixedPrecision) and plugin.precision == "16-mixed" and plugin.device == "cuda"
        assert isinstance(plugin.scaler, torch.amp.GradScaler)
    assert fsdp2_policy(torch.float16) == _accelerate_policy(2, "fp16")


@pytest.mark.filterwarnings("ignore:LightningCLI.s args parameter")
def test_the_cli_trains_fsdp2_fp16_with_accelerates_policy(tmp_path, monkeypatch, one_thread, capsys):
    """`hf-lightning fit --args.fsdp ... --trainer.precision 16-mixed` (the string Lightning alone refuses with a
    ModelParallelStrategy) trains with the fp16 plugin: every FSDP2 group has accelerate's fp16 policy, float32
    masters, a grad scaler. (`--args.bf16` takes the same `lightning_trainer_kwargs` as the facade above.)"""
    from pathlib import Path

    from hf_lightning.cli import run_cli

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the config names its data from the repository root
    cli = run_cli(["fit", "--config", "configs/causal_lm.yaml", "--args.output_dir", str(tmp_path), "--args.max_steps",
                   "2", "--args.eval_strategy", "no", "--args.save_strategy", "no", "--data.max_train_samples", "16",
                   "--trainer.enable_progress_bar", "false", "--args.fsdp", "full_shard auto_wrap",
                   "--trainer.precision", "16-mixed"])
    model = cli.trainer.lightning_module.model
    assert cli.trainer.global_step == 2 and str(cli.trainer.precision) == "16-mixed"
    assert isinstance(cli.trainer.precision_plugin.scaler, torch.amp.GradScaler)
    policies = _policies(model)
    assert len(policies) == 3 and all(p == _accelerate_policy(2, "fp16") for p in policies)
    assert {p.to_local().dtype for p in model.parameters()} == {torch.float32}


def test_fsdp1_mixed_precision_is_accelerates():
    """FSDP1 takes Lightning's FSDPPrecision: the same torch `MixedPrecision` accelerate's FSDP1 plugin sets."""
    from lightning.pytorch.plugins.precision import FSDPPrecision

    for lightning, hf in (("bf16-mixed", "bf16"), ("16-mixed", "fp16")):
        assert FSDPPrecision(lightning).mixed_precision_config == _accelerate_policy(1, hf)


def test_fsdp1_bf16_on_one_process_accumulates_gradients(tmp_path, one_thread):
    """FSDP1 on one process is torch's NO_SHARD; its `no_sync` would keep the micro-batches' bf16 gradients on the
    float32 parameters, which torch refuses at the next forward. One process has nothing to sync (accelerate's
    `no_sync` only applies with several): the run accumulates as HF's does (a one-GPU `fsdp_config` version 1 +
    bf16 run takes the same torch path: tests/test_gpu.py's "gpu-fsdp1-bf16" on a one-GPU machine would fail)."""
    trainer, seen, _ = _run(tmp_path, {}, bf16=True, fsdp_config={"version": 1}, gradient_accumulation_steps=2)
    assert type(trainer.lightning_trainer.strategy).__name__ == "HFFSDPStrategy"
    assert seen and set(seen) == {torch.bfloat16}  # FSDP1's MixedPrecision gathers bf16
    assert trainer.state.global_step == 3
    assert all(e["grad_norm"] == e["grad_norm"] for e in trainer.state.log_history if "loss" in e)


@pytest.mark.parametrize(("overrides", "lightning_kwargs", "message"), [
    ({}, {"precision": "64-true"}, "precision='64-true' with FSDP2 cannot run"),
    ({"fsdp_config": {"version": 1}}, {"precision": "16-mixed"},
     "precision='16-mixed' with FSDP1 on the CPU cannot run"),
    ({"fsdp_config": {"version": 1}}, {"precision": "transformer-engine"},
     "precision='transformer-engine' with FSDP1 cannot run"),
])
def test_pairs_that_cannot_hold_are_refused_when_the_trainer_is_built(tmp_path, overrides, lightning_kwargs, message):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), **{**ARGS, **overrides})
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=lm_dataset(n=4),
                             lightning_kwargs={**CPU_QUIET, **lightning_kwargs})
