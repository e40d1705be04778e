"""The allowed values of the `TrainingArguments` fields that take a name (pure Python, no imports)."""

from __future__ import annotations

from typing import Literal

__all__ = ["IntervalStrategyName", "SaveStrategyName", "SamplingStrategyName", "OPTIMIZER_NAMES", "SCHEDULER_NAMES"]

IntervalStrategyName = Literal["no", "steps", "epoch"]
SaveStrategyName = Literal["no", "steps", "epoch", "best"]
SamplingStrategyName = Literal["random", "sequential"]

OPTIMIZER_NAMES = ("adamw_torch", "adamw_torch_fused", "sgd", "adafactor", "adagrad", "rmsprop")
"""The `optim` values we build (see `optim.py`); HF has more, they are rejected with this list."""

SCHEDULER_NAMES = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
)
"""Every `lr_scheduler_type` of `transformers.get_scheduler` except `greedy` (needs per-eval state we do not keep)."""
