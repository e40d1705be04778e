"""Settings changed between the run that wrote a checkpoint and the run resuming from it: each one named with what the
resumed run does, and a different optimizer refused before training.

The checkpoint records its run's arguments in `training_args.bin` (ours or `transformers.Trainer`'s). What a
changed value does on resume follows from what the checkpoint restores, as in HF's Trainer:

- optimizer hyperparameters (`learning_rate`, `weight_decay`, `adam_*`, `optim_args`, the `optim` variant of the same
  class): **not applied**. The optimizer's state dict carries each parameter group's settings and the scheduler's
  carries its base learning rates; loading them replaces the new values (HF does the same, silently);
- another optimizer class (`optim` adamw -> sgd, -> adafactor...): **refused**. Its state cannot be loaded into the new
  class (HF fails with `KeyError: 'momentum'` at the first update, or a misleading autograd error);
- the schedule (`lr_scheduler_type`, `lr_scheduler_kwargs`, `warmup_*`, `max_steps`, `num_train_epochs`): applied
  from the resumed step: the new schedule's value at that step, not a restart, on the checkpoint's base learning rate;
- `seed` / `data_seed`: applied to the data order, including the rest of the resumed epoch (whose first windows are
  skipped in the *new* order, so some rows of that epoch are seen twice and others not at all); the RNG states
  (dropout) are the checkpoint's;
- anything else that shapes training: applied from the resumed step.

Arguments that only say where and how a run is launched or reported (`same_run.EXEMPT`) and the ones other resume
messages already name (the intervals and the epoch geometry) are not listed again.

`training_args.bin` is a pickle: it is read with `torch.load(weights_only=True)`, allowing only the argument classes,
enums and dataclasses of transformers, accelerate and hf_lightning (a checkpoint folder is not trusted code).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from pathlib import Path
from typing import Any

import torch

from hf_lightning.checkpoint.same_run import EXEMPT, plain_values

__all__ = ["CHANGES_NAMED_ELSEWHERE", "OPTIMIZER_STATE_FIELDS", "SCHEDULE_FIELDS", "SEED_FIELDS", "SettingChanges",
           "optimizer_class_name", "read_recorded_arguments", "setting_changes"]

OPTIMIZER_STATE_FIELDS = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "optim_args")
"""Settings the optimizer's (and scheduler's) saved state carries: a resume keeps the checkpoint's values."""

SCHEDULE_FIELDS = ("lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio", "max_steps",
                   "num_train_epochs")
"""The learning-rate schedule and the run's length: rebuilt for this run, evaluated from the resumed step."""

SEED_FIELDS = ("seed", "data_seed")
"""Settings of the data order."""

CHANGES_NAMED_ELSEWHERE = ("logging_steps", "eval_steps", "save_steps", "per_device_train_batch_size",
                           "gradient_accumulation_steps", "dataloader_drop_last")
"""Named by HF's interval warning and by the epoch-geometry warning of a resume (`checkpoint/restore.py`)."""

_OPTIMIZER_CLASSES = {"adamw_torch": "AdamW", "adamw_torch_fused": "AdamW", "sgd": "SGD", "adagrad": "Adagrad",
                      "rmsprop": "RMSprop", "adafactor": "Adafactor"}
_TRUSTED_PACKAGES = ("transformers.", "accelerate.", "hf_lightning.")
_TRUSTED_OTHER = {"accelerate.state.PartialState"}  # HF's arguments pickle their distributed state object


def optimizer_class_name(optim: str | enum.Enum) -> str:
    """The optimizer class an `optim` name (ours, or HF's `OptimizerNames`) builds (the name itself when it is not
    one of ours)."""
    name = str(optim.value if isinstance(optim, enum.Enum) else optim)
    return _OPTIMIZER_CLASSES.get(name, name)


def _allowed(name: str) -> type | None:
    """The class `name` ("module.Class") when a recorded-arguments pickle may construct it, else None."""
    if not name.startswith(_TRUSTED_PACKAGES):
        return None
    module, _, attribute = name.rpartition(".")
    try:
        value = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError):
        return None
    if not isinstance(value, type):
        return None
    if issubclass(value, enum.Enum) or dataclasses.is_dataclass(value) or name in _TRUSTED_OTHER:
        return value
    return None


def read_recorded_arguments(folder: str | Path) -> dict[str, Any] | None:
    """The arguments recorded in `folder/training_args.bin` as plain values (`same_run.plain_values`), or None when
    the file is absent, unreadable, or needs a class outside the allowed ones."""
    path = Path(folder) / "training_args.bin"
    if not path.is_file():
        return None
    try:
        needed = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        classes = [_allowed(name) for name in needed]
        if any(c is None for c in classes):
            return None
        with torch.serialization.safe_globals([c for c in classes if c is not None]):
            recorded = torch.load(path, map_location="cpu", weights_only=True)
        return plain_values(recorded)
    except Exception:  # noqa: BLE001 - unreadable or from another version: nothing is known, nothing is claimed
        return None


@dataclasses.dataclass(frozen=True)
class SettingChanges:
    """What changed since the checkpoint: `lines` (one per setting, for the warning) and `refusal` (the error message
    when the run cannot resume, else None)."""

    lines: list[str]
    refusal: str | None = None


def _effect(name: str, step: int, has_optimizer_state: bool) -> str:
    """What the resumed run does with a changed setting (see the module docstring)."""
    if name in OPTIMIZER_STATE_FIELDS or name == "optim":
        if has_optimizer_state:
            return ("not applied: the checkpoint's optimizer state keeps the old value (as transformers.Trainer "
                    "does); to use the new one, start a new run from the checkpoint's weights")
        return "applied (the checkpoint holds no optimizer state)"
    if name in SCHEDULE_FIELDS:
        return (f"applied: the learning rate follows the new schedule from step {step} on, not restarted, on the "
                "checkpoint's base learning rate (as transformers.Trainer does)")
    if name in SEED_FIELDS:
        return ("applied to the data order, also of the rest of the resumed epoch (its first windows are skipped in "
                "the new order, so some rows of that epoch are seen twice and others not at all); the RNG states "
                "(dropout) are the checkpoint's (as transformers.Trainer does)")
    return f"applied from step {step} on"


def setting_changes(before: dict[str, Any], now: dict[str, Any], step: int, has_optimizer_state: bool,
                    checkpoint: str) -> SettingChanges:
    """Compare the checkpoint's recorded arguments with this run's (both `same_run.plain_values`) (pure).

    Args:
        before: the checkpoint's arguments.
        now: this run's arguments.
        step: the resumed global step.
        has_optimizer_state: whether the checkpoint holds the optimizer's state (not `save_only_model`).
        checkpoint: the folder, for the messages.
    """
    skip = set(EXEMPT) | set(CHANGES_NAMED_ELSEWHERE)
    changed = [name for name in sorted(set(before) & set(now)) if name not in skip and before[name] != now[name]]
    refusal = None
    if "optim" in changed and has_optimizer_state:
        old, new = optimizer_class_name(before["optim"]), optimizer_class_name(now["optim"])
        if old != new:
            refusal = (
                f"resume_from_checkpoint={checkpoint!r}: optim changed from {before['optim']!r} ({old}) to "
                f"{now['optim']!r} ({new}); the checkpoint's {old} state cannot be loaded into {new}. To continue with "
                f"{now['optim']!r}, start the optimizer fresh: load the weights with "
                f"`AutoModel...from_pretrained({checkpoint!r})` (or pass that model) and train without "
                f"resume_from_checkpoint, in a new output_dir; or resume with optim={before['optim']!r}."
            )
    lines = [f"{name}: {before[name]!r} -> {now[name]!r}: {_effect(name, step, has_optimizer_state)}"
             for name in changed]
    return SettingChanges(lines, refusal)
