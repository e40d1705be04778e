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
    "HF_BUILT_OPTIMIZERS",
    "OPTIMIZER_NAMES",
    "REFUSED_OPTIMIZERS",
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
"""The `optim` values we build ourselves (`module/optim.py`)."""

HF_BUILT_OPTIMIZERS = (
    "adamw_torch_xla", "adamw_torch_npu_fused", "adamw_anyprecision", "adamw_torch_4bit", "adamw_torch_8bit",
    "ademamix", "adamw_bnb_8bit", "adamw_8bit", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit",
    "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "galore_adamw", "galore_adamw_8bit", "galore_adafactor",
    "grokadamw", "apollo_adamw", "stable_adamw",
)
"""The `optim` values whose optimizer HF's own code builds for us (`module/optim.py`: HF's handler, HF's errors when
its package is missing, checked when the `Trainer` is built): a plain `torch.optim.Optimizer` stepped once per update
like any other."""

REFUSED_OPTIMIZERS = {
    **dict.fromkeys(("lomo", "adalomo"), "LOMO fuses the backward pass with the update (`optimizer.fused_backward`), "
                                         "which our one-update-per-batch step does not run"),
    **dict.fromkeys(("schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd"),
                    "schedule-free optimizers need `optimizer.train()` / `optimizer.eval()` around every training "
                    "and evaluation phase, which our loop does not call"),
    **dict.fromkeys(("galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise",
                     "apollo_adamw_layerwise"),
                    "layer-wise optimizers step inside the backward pass through per-parameter hooks and a dummy "
                    "optimizer, which our step does not run"),
}
"""HF's `optim` values refused at construction, with the reason (the README's argument map says what to use)."""

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
