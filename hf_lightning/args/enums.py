"""HF's str enums of the `TrainingArguments` choice fields, in pure Python (no torch or transformers import).

HF's `__post_init__` holds `eval_strategy`, `logging_strategy`, `save_strategy`, `hub_strategy`, `lr_scheduler_type`,
`optim` and `debug` as its str enums (TA:1558-1568), so scripts read `args.optim.value` and HF's messages and model
card print `OptimizerNames.ADAMW_TORCH_FUSED`. The arguments are built before transformers is imported (the CLI's
fast path), so these are our classes with HF's class names, member names and values; like HF's (`str` first in the
bases) a member compares and hashes equal to its string and to HF's member, so lookups by the plain string, and
HF's functions given one of ours (`get_scheduler`), work. `isinstance(args.optim,
transformers.training_args.OptimizerNames)` is False (README "Differences").
"""

from __future__ import annotations

from enum import Enum
from typing import Any

__all__ = ["DebugOption", "HubStrategy", "IntervalStrategy", "OptimizerNames", "SaveStrategy", "SchedulerType"]


class _ExplicitEnum(str, Enum):
    """A str enum whose bad value names the allowed ones (HF's `ExplicitEnum`)."""

    @classmethod
    def _missing_(cls, value: Any) -> Any:
        raise ValueError(f"{value} is not a valid {cls.__name__}, please select one of "
                         f"{list(cls._value2member_map_.keys())}")


class IntervalStrategy(_ExplicitEnum):
    """`eval_strategy` and `logging_strategy`."""

    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


class SaveStrategy(_ExplicitEnum):
    """`save_strategy`."""

    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"
    BEST = "best"


class HubStrategy(_ExplicitEnum):
    """`hub_strategy` (what `push_to_hub` would upload; hub access is not supported)."""

    END = "end"
    EVERY_SAVE = "every_save"
    CHECKPOINT = "checkpoint"
    ALL_CHECKPOINTS = "all_checkpoints"


class SchedulerType(_ExplicitEnum):
    """`lr_scheduler_type`: every name of `transformers.get_scheduler`."""

    LINEAR = "linear"
    COSINE = "cosine"
    COSINE_WITH_RESTARTS = "cosine_with_restarts"
    POLYNOMIAL = "polynomial"
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    INVERSE_SQRT = "inverse_sqrt"
    REDUCE_ON_PLATEAU = "reduce_lr_on_plateau"
    COSINE_WITH_MIN_LR = "cosine_with_min_lr"
    COSINE_WARMUP_WITH_MIN_LR = "cosine_warmup_with_min_lr"
    WARMUP_STABLE_DECAY = "warmup_stable_decay"
    GREEDY = "greedy"


class OptimizerNames(_ExplicitEnum):
    """`optim`: HF's names (the ones we build, those HF's handler builds for us, and those refused with a reason:
    `choices.py`)."""

    ADAMW_TORCH = "adamw_torch"
    ADAMW_TORCH_FUSED = "adamw_torch_fused"
    ADAMW_TORCH_XLA = "adamw_torch_xla"
    ADAMW_TORCH_NPU_FUSED = "adamw_torch_npu_fused"
    ADAFACTOR = "adafactor"
    ADAMW_ANYPRECISION = "adamw_anyprecision"
    ADAMW_TORCH_4BIT = "adamw_torch_4bit"
    ADAMW_TORCH_8BIT = "adamw_torch_8bit"
    ADEMAMIX = "ademamix"
    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAMW_BNB = "adamw_bnb_8bit"
    ADAMW_8BIT = "adamw_8bit"
    ADEMAMIX_8BIT = "ademamix_8bit"
    LION_8BIT = "lion_8bit"
    LION = "lion_32bit"
    PAGED_ADAMW = "paged_adamw_32bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    PAGED_ADEMAMIX = "paged_ademamix_32bit"
    PAGED_ADEMAMIX_8BIT = "paged_ademamix_8bit"
    PAGED_LION = "paged_lion_32bit"
    PAGED_LION_8BIT = "paged_lion_8bit"
    RMSPROP = "rmsprop"
    RMSPROP_BNB = "rmsprop_bnb"
    RMSPROP_8BIT = "rmsprop_bnb_8bit"
    RMSPROP_32BIT = "rmsprop_bnb_32bit"
    GALORE_ADAMW = "galore_adamw"
    GALORE_ADAMW_8BIT = "galore_adamw_8bit"
    GALORE_ADAFACTOR = "galore_adafactor"
    GALORE_ADAMW_LAYERWISE = "galore_adamw_layerwise"
    GALORE_ADAMW_8BIT_LAYERWISE = "galore_adamw_8bit_layerwise"
    GALORE_ADAFACTOR_LAYERWISE = "galore_adafactor_layerwise"
    LOMO = "lomo"
    ADALOMO = "adalomo"
    GROKADAMW = "grokadamw"
    SCHEDULE_FREE_RADAM = "schedule_free_radam"
    SCHEDULE_FREE_ADAMW = "schedule_free_adamw"
    SCHEDULE_FREE_SGD = "schedule_free_sgd"
    APOLLO_ADAMW = "apollo_adamw"
    APOLLO_ADAMW_LAYERWISE = "apollo_adamw_layerwise"
    STABLE_ADAMW = "stable_adamw"


class DebugOption(_ExplicitEnum):
    """The entries of `debug` (only `underflow_overflow` is honoured)."""

    UNDERFLOW_OVERFLOW = "underflow_overflow"
    TPU_METRICS_DEBUG = "tpu_metrics_debug"
