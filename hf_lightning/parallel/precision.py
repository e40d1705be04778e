"""Mixed precision under FSDP2, with HF's meaning (accelerate 1.15, which `transformers.Trainer` runs on).

For `fsdp=...` (version 2) with `bf16=True` or `fp16=True` accelerate (`FullyShardedDataParallelPlugin.
set_mixed_precision`, `fsdp2_prepare_model`, `Accelerator.__init__` / `prepare_model`):

- shards with `MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)`: every all-gather
  moves the low-precision copy, every reduce-scatter the low-precision gradient, and the root's outputs (the loss
  included) are cast to it;
- keeps float32 master weights: trainable parameters of another dtype are upcast before sharding;
- still runs the forward under `torch.autocast` (its `native_amp`), with the outputs converted back to float32;
- fp16 only: a `torch.amp.GradScaler` (not the `ShardedGradScaler` of FSDP1: FSDP2's gradients are DTensors, whose
  inf / NaN check torch reduces over the mesh, so every rank skips the same steps).

Here: the policy and the upcast go to every `fully_shard` call (`parallel/fsdp2.py`, `fsdp2_policy`), decided by the
run's Lightning precision plugin (`policy_dtype`): `"bf16-mixed"` (Lightning's autocast) gives bfloat16, a
`MixedPrecision("16-mixed")` plugin gives float16. Lightning refuses `precision="16-mixed"` with a
`ModelParallelStrategy` (`_validate_precision_choice`), so fp16 goes to Lightning as that plugin instead
(`fp16_plugin`): the same autocast and grad scaler Lightning's "16-mixed" has, which the module reads to count skipped
steps as HF does (`optimizer_step_was_skipped`).

On the CPU `fp16=True` trains in float32 as HF does there (`args/to_lightning.fp16_precision`); HF's `fsdp` on the CPU
is DDP (accelerate's MULTI_CPU), so no FSDP2 policy applies either. An explicit `precision="16-mixed"` under FSDP2 on
the CPU is float16 autocast with a grad scaler (torch's CPU autocast has float16).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision

__all__ = ["SUPPORTED", "check_precision_pair", "fp16_plugin", "policy_dtype", "unified_precision"]

SUPPORTED: dict[str, tuple[str, ...]] = {
    # Lightning's `_validate_precision_choice`, plus "16-mixed" (given as `fp16_plugin`)
    "fsdp2": ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"),
    # Lightning's FSDPPrecision / DeepSpeedPrecision
    "fsdp1": ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"),
    "deepspeed": ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"),
}
"""The Lightning precisions each sharded strategy family runs."""


_SHORT_NAMES = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
"""Lightning's short precision names and what they stand for (Lightning's `precision` argument)."""


def unified_precision(precision: Any) -> str:
    """Lightning's full name of a `precision` value (16 -> "16-mixed", "bf16" -> "bf16-mixed", 32 -> "32-true"...)."""
    return _SHORT_NAMES.get(str(precision), str(precision))


def check_precision_pair(precision: str, family: str, on_cpu: bool) -> None:
    """Refuse a precision x strategy pair that cannot run (or would run as something else), naming both.

    Args:
        precision: Lightning's unified precision name (`unified_precision`).
        family: "fsdp2", "fsdp1", "deepspeed" or anything else (not checked here).
        on_cpu: whether the run trains on the CPU.

    Raises:
        ValueError: a precision the family's Lightning plugin refuses, or "16-mixed" under FSDP1 on the CPU (Lightning's
            `ShardedGradScaler` is a CUDA scaler: on the CPU it disables itself, so fp16 would run unscaled).
    """
    allowed = SUPPORTED.get(family)
    if allowed is None:
        return
    if precision not in allowed:
        raise ValueError(
            f"precision={precision!r} with {family.upper()} cannot run: that strategy runs {', '.join(allowed)}. Use "
            "bf16=True / fp16=True (TrainingArguments) or one of those Lightning precisions.")
    if family == "fsdp1" and on_cpu and precision == "16-mixed":
        raise ValueError(
            "precision='16-mixed' with FSDP1 on the CPU cannot run: its ShardedGradScaler is a CUDA scaler that turns "
            "itself off on the CPU (float16 without loss scaling). Use bf16=True, FSDP2 (fsdp_config version 2), or "
            "a GPU.")


def fp16_plugin(device: str) -> MixedPrecision:
    """Lightning's "16-mixed" (float16 autocast and a fresh `torch.amp.GradScaler`) on `device` ("cuda" or "cpu"), as
    a plugin: the form `ModelParallelStrategy` accepts."""
    return MixedPrecision("16-mixed", device, scaler=torch.amp.GradScaler(device))


def policy_dtype(plugin: Precision | None) -> torch.dtype | None:
    """The FSDP2 `param_dtype` of a run whose Lightning precision plugin is `plugin`: bfloat16 for "bf16-mixed",
    float16 for "16-mixed", None (float32, no policy) otherwise ("32-true", and the "-true" precisions, whose weights
    are already in the low dtype)."""
    if isinstance(plugin, MixedPrecision):
        return torch.bfloat16 if plugin.precision == "bf16-mixed" else torch.float16
    return None
