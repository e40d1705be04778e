"""Optimizer and scheduler factories with the HF Trainer's defaults.

- Parameter groups (T:1269-1286, T:1408-1418): group 0 decays every trainable parameter except biases and
  normalisation weights (by `nn.LayerNorm` type or name pattern); group 1 holds the rest with `weight_decay=0`. Both
  groups always exist.
- `optim` names (transformers `trainer_optimizer.py`): AdamW (`adamw_torch`, `adamw_torch_fused`), SGD, Adafactor (HF's
  implementation), Adagrad, RMSprop, with `optim_args` as `key=value,...`. The other names HF builds as a plain
  optimizer (bitsandbytes, torchao, GaLore, APOLLO, GrokAdamW, StableAdamW, AnyPrecisionAdamW...: `HF_BUILT_OPTIMIZERS`)
  come from HF's own handler, with HF's error when their package is missing.
- Schedulers come from `transformers.get_scheduler` with `num_warmup_steps = args.get_warmup_steps(max_steps)`.
"""

from __future__ import annotations

import ast
from typing import Any

import torch
from torch import nn
from transformers import get_scheduler
from transformers.optimization import Adafactor
from transformers.trainer_pt_utils import get_parameter_names

from hf_lightning.args import HF_BUILT_OPTIMIZERS, OPTIMIZER_NAMES, TrainingArguments

__all__ = [
    "build_optimizer", "build_scheduler", "decay_parameter_names", "keep_embeddings_in_32_bits",
    "optimizer_cls_and_kwargs", "parameter_groups",
]

_NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that get weight decay (HF `Trainer.get_decay_parameter_names`)."""
    return get_parameter_names(model, [nn.LayerNorm], _NO_DECAY_PATTERNS)


def parameter_groups(model: nn.Module, weight_decay: float, decay: list[str] | None = None) -> list[dict[str, Any]]:
    """HF's two groups, in `named_parameters()` order, trainable parameters only.

    Args:
        model: the model whose parameters are grouped.
        weight_decay: group 0's weight decay.
        decay: the names that get weight decay (default: `decay_parameter_names(model)`; a `Trainer` subclass's
            `get_decay_parameter_names` gives its own).
    """
    decay_names = set(decay_parameter_names(model) if decay is None else decay)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in params if n in decay_names], "weight_decay": weight_decay},
        {"params": [p for n, p in params if n not in decay_names], "weight_decay": 0.0},
    ]


def _parse_optim_args(optim_args: str | None) -> dict[str, Any]:
    """`"momentum=0.9,nesterov=True"` -> `{"momentum": 0.9, "nesterov": True}` (HF's `optim_args` format)."""
    parsed: dict[str, Any] = {}
    for item in (optim_args or "").replace(" ", "").split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(
                f"`optim_args` entry {item!r} is not of the form key=value (got optim_args={optim_args!r})."
            )
        if value.lower() in ("true", "yes", "false", "no"):
            # HF reads `nesterov=true` / `yes` as True; literal_eval would leave the (truthy) string "false"
            parsed[key] = value.lower() in ("true", "yes")
            continue
        try:
            parsed[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed[key] = value
    return parsed


def optimizer_cls_and_kwargs(args: TrainingArguments, model: nn.Module | None = None
                             ) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The optimizer class and keyword arguments for `args.optim` (HF's `Trainer.get_optimizer_cls_and_kwargs`);
    `model`: what GaLore / APOLLO select their target modules from.

    Raises:
        ValueError: an `optim` name we do not build (the message lists the supported ones); HF's error for a name HF
            builds whose package is missing (bitsandbytes, torchao, torchdistx...).
    """
    if args.optim in HF_BUILT_OPTIMIZERS:
        # HF's own handler (transformers 5.24's table behind `Trainer.get_optimizer_cls_and_kwargs`; not the class
        # method, which `use_as_transformers_trainer` may have pointed at ours)
        from transformers.trainer_optimizer import _OPTIMIZER_HANDLERS, OptimizerContext
        from transformers.trainer_optimizer import _parse_optim_args as hf_parse_optim_args

        # HF's handlers read the HF fields ours share (duck-typed), and the model only for its module names
        context = OptimizerContext(args=args, model=model,  # type: ignore[arg-type]
                                   optimizer_kwargs={"lr": args.learning_rate},
                                   adam_kwargs={"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon},
                                   optim_args=hf_parse_optim_args(args.optim_args))
        return _OPTIMIZER_HANDLERS[args.optim](context)
    extra = _parse_optim_args(args.optim_args)
    lr = args.learning_rate
    adam = {"lr": lr, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}
    if args.optim == "adamw_torch":
        return torch.optim.AdamW, {**adam, **extra}
    if args.optim == "adamw_torch_fused":
        return torch.optim.AdamW, {**adam, "fused": True, **extra}
    if args.optim == "sgd":
        return torch.optim.SGD, {"lr": lr, **extra}
    if args.optim == "adagrad":
        return torch.optim.Adagrad, {"lr": lr, **extra}
    if args.optim == "rmsprop":
        return torch.optim.RMSprop, {"lr": lr, **extra}
    if args.optim == "adafactor":
        return Adafactor, {"lr": lr, "scale_parameter": False, "relative_step": False, **extra}
    raise ValueError(f"`optim`={args.optim!r} is not supported; allowed: {', '.join(OPTIMIZER_NAMES)}.")


def build_optimizer(model: nn.Module, args: TrainingArguments) -> torch.optim.Optimizer:
    """The optimizer `transformers.Trainer.create_optimizer` builds for `args.optim` (HF's groups, HF's class).

    Raises:
        ValueError: an `optim` name we do not build (the message lists the supported ones).
    """
    cls, kwargs = optimizer_cls_and_kwargs(args, model)
    kwargs = dict(kwargs)
    groups: Any = parameter_groups(model, args.weight_decay)
    for key in ("params", "model", "optimizer_dict"):  # HF lets these kwargs replace the groups
        if key in kwargs:
            groups = kwargs.pop(key)
    optimizer = cls(groups, **kwargs)
    keep_embeddings_in_32_bits(model, cls, kwargs)
    return optimizer


def keep_embeddings_in_32_bits(model: nn.Module, cls: type, kwargs: dict[str, Any]) -> None:
    """HF's rule for bitsandbytes' 8-bit optimizers (T:1328-1339): embedding weights keep 32-bit optimizer state
    (their 8-bit state is unstable), registered with bitsandbytes' `GlobalOptimManager`."""
    if "bitsandbytes" not in str(cls) or kwargs.get("optim_bits") != 8:
        return
    import bitsandbytes  # type: ignore[import-not-found]  # an optional package HF's handler checked

    manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            manager.register_module_override(module, "weight", {"optim_bits": 32})


def build_scheduler(
    optimizer: torch.optim.Optimizer, args: TrainingArguments, max_steps: int
) -> torch.optim.lr_scheduler.LRScheduler | Any:
    """`transformers.get_scheduler(args.lr_scheduler_type, ...)` over `max_steps` updates with HF's warmup rule."""
    kwargs = args.lr_scheduler_kwargs
    # validation turned HF's None / JSON string into a dict at construction
    assert isinstance(kwargs, dict), f"lr_scheduler_kwargs={kwargs!r} was not normalised to a dict"
    return get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.get_warmup_steps(max_steps),
        num_training_steps=max_steps,
        scheduler_specific_kwargs=dict(kwargs),
    )
