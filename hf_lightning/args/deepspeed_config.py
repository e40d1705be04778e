"""HF's `"auto"` values of a DeepSpeed config, filled from the training arguments (pure Python).

A config written for `transformers.Trainer` says `"auto"` where the Trainer should fill in its own value. HF does it in
two stages of `HfTrainerDeepSpeedConfig` (transformers `integrations/deepspeed.py`): `trainer_config_process` when
the arguments are known (batch sizes, clipping, optimizer and scheduler hyperparameters, fp16 / bf16) and
`trainer_config_finalize` when the model and the number of updates are (the ZeRO bucket sizes from the model's
hidden size, the scheduler's step counts). A value that is not `"auto"` must equal the Trainer's, else one error lists
every mismatch. These functions do the same on a plain dict; `tests/test_deepspeed_config.py` compares them with HF's
class on many configs.

`for_lightning` then removes what Lightning's `DeepSpeedStrategy` sets itself: it refuses `gradient_accumulation_steps`
(one Lightning batch is one whole update here, its micro-batches run with explicit accumulation boundaries, as HF's
do through accelerate) and `train_batch_size` follows from the rest. Without an `optimizer` section HF's own
optimizer is used, and HF allows it under ZeRO (`zero_allow_untested_optimizer`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["DeepSpeedFill", "fill_process_stage", "fill_finalize_stage", "for_lightning", "zero_stage",
           "mismatch_error"]


class FillSource(Protocol):
    """The training arguments `DeepSpeedFill.from_args` reads (ours: `TrainingArguments`; a Protocol, since
    `TrainingArguments` imports this module while it is built)."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    max_grad_norm: float
    learning_rate: float
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    weight_decay: float
    fp16: bool
    fp16_full_eval: bool
    bf16: bool
    bf16_full_eval: bool
    auto_find_batch_size: bool


@dataclass(frozen=True)
class DeepSpeedFill:
    """The Trainer values HF writes into `"auto"` entries (`trainer_config_process`)."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    world_size: int
    max_grad_norm: float
    learning_rate: float
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    weight_decay: float
    fp16: bool
    """`fp16 or fp16_full_eval`, as HF."""
    bf16: bool
    """`bf16 or bf16_full_eval`, as HF."""
    auto_find_batch_size: bool = False

    @classmethod
    def from_args(cls, args: FillSource, world_size: int) -> DeepSpeedFill:
        return cls(
            per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps, world_size=world_size,
            max_grad_norm=args.max_grad_norm, learning_rate=args.learning_rate, adam_beta1=args.adam_beta1,
            adam_beta2=args.adam_beta2, adam_epsilon=args.adam_epsilon, weight_decay=args.weight_decay,
            fp16=bool(args.fp16 or args.fp16_full_eval), bf16=bool(args.bf16 or args.bf16_full_eval),
            auto_find_batch_size=bool(args.auto_find_batch_size),
        )


def _node(config: dict[str, Any], key: str) -> tuple[dict[str, Any] | None, str]:
    """HF's `find_config_node`: the dict holding the last part of the dotted `key` (None if a parent is missing)."""
    *parents, leaf = key.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part)
        if node is None:
            return None, leaf
    return node, leaf


def _value(config: dict[str, Any], key: str) -> Any:
    node, leaf = _node(config, key)
    return None if node is None else node.get(leaf)


def zero_stage(config: dict[str, Any]) -> int:
    """The ZeRO stage of a config (-1 without `zero_optimization.stage`, as HF)."""
    stage = _value(config, "zero_optimization.stage")
    return -1 if stage is None else int(stage)


class _Filler:
    """HF's `fill_match` / `fill_only` on one config, collecting the mismatches."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.mismatches: list[str] = []

    def fill(self, key: str, value: Any, hf_name: str | None = None, must_match: bool = True) -> None:
        node, leaf = _node(self.config, key)
        if node is None:
            return
        if node.get(leaf) == "auto":
            node[leaf] = value
            return
        current = node.get(leaf)
        if must_match and current is not None and current != value:
            self.mismatches.append(f"- ds {key}={current} vs hf {hf_name}={value}")


def fill_process_stage(config: dict[str, Any], values: DeepSpeedFill) -> tuple[dict[str, Any], list[str]]:
    """`trainer_config_process`: a filled copy of `config` and the mismatches (HF's lines).

    `save_on_each_node` (which HF writes into `checkpoint.use_node_local_storage`) is not supported here and keeps
    its default, so it never applies.
    """
    filler = _Filler(copy.deepcopy(config))
    fill = filler.fill
    strict = not values.auto_find_batch_size
    fill("train_micro_batch_size_per_gpu", values.per_device_train_batch_size, "per_device_train_batch_size", strict)
    fill("gradient_accumulation_steps", values.gradient_accumulation_steps, "gradient_accumulation_steps")
    train_batch = values.world_size * values.per_device_train_batch_size * values.gradient_accumulation_steps
    fill("train_batch_size", train_batch, "train_batch_size (calculated)", strict)
    fill("gradient_clipping", values.max_grad_norm, "max_grad_norm")
    fill("optimizer.params.lr", values.learning_rate, "learning_rate")
    fill("optimizer.params.betas", [values.adam_beta1, values.adam_beta2], "adam_beta1+adam_beta2")
    fill("optimizer.params.eps", values.adam_epsilon, "adam_epsilon")
    fill("optimizer.params.weight_decay", values.weight_decay, "weight_decay")
    fill("scheduler.params.warmup_min_lr", 0, must_match=False)  # not a trainer argument
    fill("scheduler.params.warmup_max_lr", values.learning_rate, "learning_rate")
    fill("fp16.enabled", values.fp16, "fp16|fp16_full_eval")
    fill("bf16.enabled", values.bf16, "bf16|bf16_full_eval")
    return filler.config, filler.mismatches


def _hidden_size(model_config: Any) -> int | None:
    """HF's choice of the model's hidden size (`hidden_size`, else the largest of `hidden_sizes`, also under
    `text_config`)."""
    for config in (model_config, getattr(model_config, "text_config", None)):
        if config is None:
            continue
        if getattr(config, "hidden_size", None) is not None:
            return int(config.hidden_size)
        if getattr(config, "hidden_sizes", None):
            return int(max(config.hidden_sizes))
    return None


def fill_finalize_stage(
    config: dict[str, Any], model_config: Any, num_training_steps: int, warmup_steps: int
) -> tuple[dict[str, Any], list[str]]:
    """`trainer_config_finalize`: the ZeRO buckets from the model's hidden size, the scheduler's step counts.

    Args:
        config: the config after `fill_process_stage`.
        model_config: the model's `config` (None for a plain module).
        num_training_steps: the run's total updates.
        warmup_steps: `args.get_warmup_steps(num_training_steps)`.

    Raises:
        ValueError: a hidden-size `"auto"` entry with a model config that has no hidden size (HF's message).
    """
    filler = _Filler(copy.deepcopy(config))
    keys = ["zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
            "zero_optimization.stage3_param_persistence_threshold"]
    auto_keys = [k for k in keys if _value(filler.config, k) == "auto"]
    if auto_keys:
        hidden = _hidden_size(model_config)
        if hidden is None:
            raise ValueError(
                "The model's config file has neither `hidden_size` nor `hidden_sizes` entry, therefore it's not "
                f"possible to automatically fill out the following `auto` entries in the DeepSpeed config file: "
                f"{auto_keys}. You can fix that by replacing `auto` values for these keys with an integer value of "
                "your choice."
            )
        filler.fill("zero_optimization.reduce_bucket_size", hidden * hidden, must_match=False)
        if zero_stage(filler.config) == 3:
            filler.fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden * hidden), must_match=False)
            filler.fill("zero_optimization.stage3_param_persistence_threshold", 10 * hidden, must_match=False)
    filler.fill("scheduler.params.total_num_steps", num_training_steps, "num_training_steps (calculated)")
    # HF keeps the warmup positive: deepspeed >= 0.19.6 rejects 0 (older versions clamped it)
    filler.fill("scheduler.params.warmup_num_steps", max(1, warmup_steps), "warmup_steps")
    return filler.config, filler.mismatches


def mismatch_error(mismatches: list[str]) -> str:
    """HF's error text for the mismatches of both stages."""
    return ("Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n"
            + "\n".join(mismatches) + "\nThe easiest method is to set these DeepSpeed config values to 'auto'.")


def for_lightning(config: dict[str, Any]) -> dict[str, Any]:
    """The filled config without the keys Lightning's `DeepSpeedStrategy` sets (see the module docstring)."""
    out = copy.deepcopy(config)
    out.pop("gradient_accumulation_steps", None)
    out.pop("train_batch_size", None)
    if "optimizer" not in out:
        # HF's optimizer (not one of DeepSpeed's) under ZeRO needs this, and HF sets it (`deepspeed_optim_sched`)
        out["zero_allow_untested_optimizer"] = True
    return out
