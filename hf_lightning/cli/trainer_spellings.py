"""`trainer.<option>` spellings of what the HF arguments decide, in a CLI config (pure, no Lightning import).

`lightning.Trainer` has options for the step budget, accumulation, clipping, logging and evaluation cadence, which
hf_lightning takes from the HF arguments (`args/to_lightning.py`, `OWNED_BY_HF_ARGS`). In the CLI, where a Lightning
user types `--trainer.max_steps 50` out of habit:

- an option whose meaning is the HF argument's (one Lightning batch is one optimizer update here) is moved to that
  argument (`LIGHTNING_TO_HF`): `trainer.max_steps` -> `args.max_steps`, `trainer.max_epochs` ->
  `args.num_train_epochs`, `trainer.accumulate_grad_batches` -> `args.gradient_accumulation_steps`,
  `trainer.gradient_clip_val` -> `args.max_grad_norm`, `trainer.log_every_n_steps` -> `args.logging_steps`; giving
  both spellings with different values is an error;
- an option with no same-meaning HF argument (`val_check_interval`, a fraction of an epoch or a batch count,
  `check_val_every_n_epoch`, `gradient_clip_algorithm`, `use_distributed_sampler`) is refused, naming what to set.

`precheck` applies these rules before anything heavy is imported, and `HFLightningCLI` moves the values the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["LIGHTNING_DEFAULTS", "LIGHTNING_TO_HF", "REFUSED", "help_text", "move_lightning_spellings", "user_set"]

LIGHTNING_TO_HF = {
    "max_steps": "max_steps",
    "max_epochs": "num_train_epochs",
    "accumulate_grad_batches": "gradient_accumulation_steps",
    "gradient_clip_val": "max_grad_norm",
    "log_every_n_steps": "logging_steps",
}
"""`trainer.<key>` -> `args.<key>` of the same meaning."""

REFUSED = {
    "val_check_interval": "args.eval_strategy: steps with args.eval_steps (updates, or a ratio of the whole run)",
    "check_val_every_n_epoch": "args.eval_strategy: epoch (every epoch), or args.eval_strategy: steps with "
                               "args.eval_steps",
    "gradient_clip_algorithm": "args.max_grad_norm (HF clips the gradient norm; there is no clipping by value)",
    "use_distributed_sampler": "nothing: hf_lightning shards the data itself (args.dataloader_* options)",
}
"""`trainer.<key>` without a same-meaning HF argument -> what to set instead."""


LIGHTNING_DEFAULTS = {
    "max_steps": -1, "max_epochs": None, "accumulate_grad_batches": 1, "gradient_clip_val": None,
    "log_every_n_steps": None, "val_check_interval": None, "check_val_every_n_epoch": 1,
    "gradient_clip_algorithm": None, "use_distributed_sampler": True,
}
"""`lightning.Trainer`'s defaults of these options (a `--print_config` copy of a config lists them: not a choice)."""

_UNSET = object()


def user_set(trainer: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a `trainer:` section that these rules concern and that differ from Lightning's defaults."""
    return {k: v for k, v in trainer.items() if k in LIGHTNING_DEFAULTS and v != LIGHTNING_DEFAULTS[k]}


def help_text(key: str) -> str | None:
    """The `--help` text of `trainer.<key>` when the HF arguments decide it, else None."""
    if key in LIGHTNING_TO_HF:
        return f"Moved to args.{LIGHTNING_TO_HF[key]} (the same meaning; the HF arguments decide it)."
    if key in REFUSED:
        return f"Refused: the HF arguments decide it; set {REFUSED[key]}."
    return None


def move_lightning_spellings(trainer: Mapping[str, Any], args: Mapping[str, Any],
                             args_defaults: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `trainer` options without those the HF arguments decide, and the `args` with the moved values.

    Args:
        trainer: the `trainer` options the user set (not Lightning's defaults).
        args: the `args` options.
        args_defaults: the HF defaults; an `args` value equal to its default is not a choice that could conflict.

    Raises:
        ValueError: a refused option, or both spellings with different values (the message names both keys).
    """
    refused = [f"trainer.{key} (set {REFUSED[key]})" for key in trainer if key in REFUSED]
    if refused:
        raise ValueError("These trainer options are decided by the HF arguments: " + "; ".join(refused) + ".")
    trainer, args = dict(trainer), dict(args)
    for key, hf in LIGHTNING_TO_HF.items():
        if key not in trainer:
            continue
        value = trainer.pop(key)
        if hf in args and args[hf] != value and args[hf] != args_defaults.get(hf, _UNSET):
            raise ValueError(f"trainer.{key}={value!r} and args.{hf}={args[hf]!r} are the same setting with two "
                             f"values; keep args.{hf}.")
        args[hf] = value
    return trainer, args
