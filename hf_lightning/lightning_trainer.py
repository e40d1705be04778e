"""Building the `lightning.Trainer` and its callbacks, shared by the `Trainer` facade and the `hf-lightning` CLI.

Both entry points build the `HFTrainerFlow` callback and the `lightning.Trainer` (keyword arguments from
`args/to_lightning.py`) with these functions, and resolve the resume checkpoint with `resume.find.resolve_resume`,
so a behaviour cannot exist in one of them only.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar
from transformers import TrainerCallback

from hf_lightning.args import TrainingArguments
from hf_lightning.callbacks.flow import HFTrainerFlow
from hf_lightning.callbacks.progress_bar import progress_bar
from hf_lightning.console import install_console_filters

__all__ = ["is_hf_callback", "split_callbacks", "build_flow", "build_lightning_trainer"]


def is_hf_callback(callback: Any) -> bool:
    """Whether `callback` is a `transformers.TrainerCallback` instance or class (else: a Lightning callback)."""
    if isinstance(callback, type):
        return issubclass(callback, TrainerCallback)
    return isinstance(callback, TrainerCallback)


def split_callbacks(callbacks: list[Any] | None) -> tuple[list[Any], list[Any]]:
    """`(hf_callbacks, lightning_callbacks)`, each in the given order."""
    callbacks = list(callbacks or [])
    return [cb for cb in callbacks if is_hf_callback(cb)], [cb for cb in callbacks if not is_hf_callback(cb)]


def build_flow(args: TrainingArguments, hf_callbacks: list[Any] | None, processing_class: Any) -> HFTrainerFlow:
    """The `HFTrainerFlow` callback for these arguments and HF callbacks."""
    return HFTrainerFlow(args, list(hf_callbacks or []), processing_class)


def build_lightning_trainer(
    flow: HFTrainerFlow, lightning_callbacks: list[Any], trainer_kwargs: dict[str, Any]
) -> pl.Trainer:
    """`lightning.Trainer` with the flow first, then the user's callbacks (also those in `trainer_kwargs`).

    `trainer_kwargs` is the output of `args.to_lightning.lightning_trainer_kwargs`. Unless a progress bar is given
    or disabled, hf_lightning's bar is added (`callbacks/progress_bar.py`); `console.install_console_filters` keeps
    the output to the bar, the summary and real warnings.
    """
    install_console_filters()
    kwargs = dict(trainer_kwargs)
    extra = kwargs.pop("callbacks", None) or []
    extra = extra if isinstance(extra, list) else [extra]
    callbacks = [flow, *lightning_callbacks, *extra]
    if kwargs.get("enable_progress_bar", True) and not any(isinstance(cb, ProgressBar) for cb in callbacks):
        callbacks.append(progress_bar())
    return pl.Trainer(callbacks=callbacks, **kwargs)
