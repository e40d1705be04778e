"""The allowed values of the `TrainingArguments` fields that take a name (pure Python, no imports)."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Literal

__all__ = [
    "IntervalStrategyName",
    "SaveStrategyName",
    "SamplingStrategyName",
    "HubStrategyName",
    "LogLevelName",
    "SAMPLING_STRATEGIES",
    "OPTIMIZER_NAMES",
    "SCHEDULER_NAMES",
    "default_optimizer",
]

IntervalStrategyName = Literal["no", "steps", "epoch"]
SaveStrategyName = Literal["no", "steps", "epoch", "best"]
SamplingStrategyName = Literal["random", "sequential", "group_by_length", "batch_rebalance"]
"""HF's choices (so every HF command line parses); `SAMPLING_STRATEGIES` are the ones we build."""
HubStrategyName = Literal["end", "every_save", "checkpoint", "all_checkpoints"]
LogLevelName = Literal["detail", "debug", "info", "warning", "error", "critical", "passive"]
"""transformers' log level names (`logging.get_log_levels_dict()`) plus `passive` (leave the level as it is)."""

SAMPLING_STRATEGIES = ("random", "sequential", "group_by_length")
"""The `train_sampling_strategy` values we build; `batch_rebalance` is rejected."""

def default_optimizer() -> str:
    """HF's default `optim` (TA:800-806): the fused AdamW from torch 2.8 on, plain AdamW before (read from the
    installed distribution's version, without importing torch)."""
    try:
        match = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        return "adamw_torch"
    return "adamw_torch_fused" if match and (int(match[1]), int(match[2])) >= (2, 8) else "adamw_torch"


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
    "greedy",
)
"""Every `lr_scheduler_type` of `transformers.get_scheduler` (`greedy` and `reduce_lr_on_plateau` step on the
best-model metric after each evaluation, as HF's)."""
