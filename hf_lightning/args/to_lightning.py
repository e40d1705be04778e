"""Translation of `TrainingArguments` into `lightning.Trainer` keyword arguments (pure, no Lightning import).

Lightning owns devices, strategies, precision and loggers; hf_lightning owns the step budget, accumulation,
clipping and the validation cadence (one Lightning batch is one optimizer update). Settings of Lightning that would
fight ours are rejected with the HF argument to use instead. HF's strategy fields (`fsdp`, `deepspeed`, `ddp_*`)
become a `StrategyRequest` under `"strategy"`, which `lightning_trainer.build_lightning_trainer` turns into a fresh
Lightning strategy for every run (`parallel/strategies.py`); a strategy in `lightning_kwargs` wins, with a warning
when HF strategy fields are set too.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Collection, Mapping
from typing import Any

from hf_lightning.args import TrainingArguments
from hf_lightning.args.parallel import strategy_fields_set
from hf_lightning.args.process import check_process_group, launcher_trainer_kwargs
from hf_lightning.args.report_to import build_loggers

__all__ = ["fp16_precision", "lightning_trainer_kwargs", "OWNED_BY_HF_ARGS", "unknown_lightning_option"]

OWNED_BY_HF_ARGS = {
    "accumulate_grad_batches": "gradient_accumulation_steps",
    "gradient_clip_val": "max_grad_norm",
    "gradient_clip_algorithm": "max_grad_norm",
    "max_steps": "max_steps",
    "max_epochs": "num_train_epochs",
    "val_check_interval": "eval_steps",
    "check_val_every_n_epoch": "eval_strategy",
    "use_distributed_sampler": "(hf_lightning shards data itself)",
    "log_every_n_steps": "logging_steps",
}
"""lightning.Trainer options that the HF arguments decide; passing them raises an error naming the HF argument."""


def unknown_lightning_option(lightning_kwargs: Mapping[str, Any], known: Collection[str]) -> str | None:
    """One line naming the `lightning_kwargs` keys that are not `lightning.Trainer` options (`known`: its
    parameters), each with its closest option, or None when all are known.

    Without it, a misspelt key reaches `lightning.Trainer(**kwargs)`, whose `TypeError` names neither
    `lightning_kwargs` nor the option meant.
    """
    unknown = [key for key in lightning_kwargs if key not in known]
    if not unknown:
        return None
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), list(known), n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (f"lightning_kwargs: {', '.join(parts)} {'is not a' if len(unknown) == 1 else 'are not'} "
            f"lightning.Trainer option{'' if len(unknown) == 1 else 's'}; its options are the parameters of "
            "lightning.Trainer (accelerator, devices, strategy, precision, logger, callbacks, ...).")


def lightning_trainer_kwargs(
    args: TrainingArguments, lightning_kwargs: dict[str, Any] | None, model: Any = None
) -> dict[str, Any]:
    """`lightning.Trainer(**kwargs)` for these arguments; `lightning_kwargs` wins for everything Lightning owns.

    `model` decides HF's defaults that depend on it (DDP's `find_unused_parameters`, the FSDP layer classes).

    Raises:
        ValueError: `lightning_kwargs` sets an option the HF arguments decide (the message names both), or a
            strategy whose process group differs from the one `main_process_first` initialised.
    """
    user = dict(lightning_kwargs or {})
    clashes = [f"{k} (use TrainingArguments.{OWNED_BY_HF_ARGS[k]})" for k in user if k in OWNED_BY_HF_ARGS]
    if clashes:
        raise ValueError("These lightning_kwargs are decided by the HF arguments: " + ", ".join(clashes) + ".")
    check_process_group(user)
    kwargs: dict[str, Any] = {
        "default_root_dir": args.resolved_output_dir,
        "enable_checkpointing": False,  # checkpoints are HF folders written by HFTrainerFlow
        "num_sanity_val_steps": 0,
        "use_distributed_sampler": False,
        "log_every_n_steps": 1,
        "enable_model_summary": False,
        "enable_progress_bar": not args.disable_tqdm,
        "max_epochs": -1,
    }
    if args.use_cpu:
        kwargs["accelerator"] = "cpu"
    if args.bf16:
        kwargs["precision"] = "bf16-mixed"
    elif args.fp16 and "precision" not in user:
        kwargs["precision"] = fp16_precision(args, user)
    if "logger" not in user:
        kwargs["logger"] = build_loggers(args)
    # `torchrun script.py`: one run over the launcher's processes, as HF's; its "ddp" gives way to HF's strategy
    # fields below (Lightning's "auto" is DDP over those devices, with HF's `ddp_*` options)
    kwargs.update(launcher_trainer_kwargs(os.environ, user))
    if user.get("strategy", "auto") == "auto":
        from hf_lightning.parallel.strategies import strategy_request

        user.pop("strategy", None)
        kwargs["strategy"] = strategy_request(args, model)
    elif strategy_fields_set(args):
        warnings.warn(
            f"The Lightning strategy {user['strategy']!r} was given, so these TrainingArguments fields are not used: "
            f"{', '.join(strategy_fields_set(args))} (README, 'Swapping strategies').", UserWarning, stacklevel=3,
        )
    kwargs.update(user)
    _precision_for_strategy(args, user, kwargs)
    return kwargs


def _strategy_family(strategy: Any) -> str:
    """"fsdp2", "fsdp1", "deepspeed" or "other", for a `StrategyRequest` or a Lightning strategy (name or object)."""
    from hf_lightning.args.parallel import StrategyRequest

    if isinstance(strategy, StrategyRequest):
        if strategy.deepspeed is not None:
            return "deepspeed"
        if strategy.fsdp is not None:
            return "fsdp2" if strategy.fsdp.version == 2 else "fsdp1"
        return "other"
    if isinstance(strategy, str):
        return "fsdp1" if strategy.startswith("fsdp") else "deepspeed" if strategy.startswith("deepspeed") else "other"
    from hf_lightning.parallel.lockstep import strategy_kind

    return strategy_kind(strategy)


def _precision_for_strategy(args: TrainingArguments, user: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """Check the precision x strategy pair now (`parallel.precision.check_precision_pair`), and give FSDP2's
    "16-mixed" to Lightning as a plugin (float16 autocast and grad scaler): Lightning refuses the string with a
    `ModelParallelStrategy`, and HF runs fp16 under FSDP2 (`parallel/precision.py`)."""
    from lightning.pytorch.plugins.precision import Precision

    from hf_lightning.parallel.precision import check_precision_pair, fp16_plugin, unified_precision

    plugins = kwargs.get("plugins") or []
    plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if any(isinstance(p, Precision) for p in plugins) or "precision" not in kwargs:
        return  # a precision plugin of the user's own: theirs (Lightning checks it)
    family = _strategy_family(kwargs.get("strategy"))
    precision = unified_precision(kwargs["precision"])
    on_cpu = _runs_on_cpu(args, user)
    check_precision_pair(precision, family, on_cpu)
    if family == "fsdp2" and precision == "16-mixed":
        del kwargs["precision"]
        kwargs["plugins"] = [*plugins, fp16_plugin("cpu" if on_cpu else "cuda")]


def _runs_on_cpu(args: TrainingArguments, user: dict[str, Any]) -> bool:
    """Whether Lightning will train on the CPU: `accelerator="cpu"` (or `use_cpu`), or "auto" without a GPU."""
    accelerator = user.get("accelerator", "cpu" if args.use_cpu else "auto")
    if not isinstance(accelerator, str):  # an Accelerator instance
        return type(accelerator).__name__ == "CPUAccelerator"
    if accelerator != "auto":
        return accelerator == "cpu"
    import torch

    return not (torch.cuda.is_available() or torch.backends.mps.is_available())


def fp16_precision(args: TrainingArguments, user: dict[str, Any]) -> str:
    """Lightning's precision for `fp16=True`: "16-mixed", except on the CPU, where HF trains in float32.

    accelerate has no float16 autocast on the CPU: with `fp16=True` it enables neither autocast nor a grad scaler
    there (accelerate `accelerator.py`, `native_amp` stays False), so `transformers.Trainer` trains in float32,
    silently. Lightning would switch to "bf16-mixed" instead (with a warning): another numeric result. We train in
    float32 as HF, and say so.
    """
    if not _runs_on_cpu(args, user):
        return "16-mixed"
    warnings.warn(
        "fp16=True on the CPU: training in float32, as transformers.Trainer does there (no float16 autocast on the "
        "CPU). For mixed precision on the CPU use bf16=True.", UserWarning, stacklevel=3,
    )
    return "32-true"
