"""A hand-built `lightning.Trainer` driven by `HFTrainerFlow` prints as `hf_lightning.Trainer` does.

`hf_lightning.Trainer` and the CLI build their `lightning.Trainer` with settings that keep the output to HF's
(`args/to_lightning.py`: no model summary, hf_lightning's bar, `log_every_n_steps=1`). A `lightning.Trainer` the
user builds has Lightning's defaults instead: the model-summary table (with `Total FLOPs: 0` for a transformers
model), `v_num` in the bar, the bar counting epochs from 0, no evaluation metrics in it, and a warning that the
epoch is shorter than `log_every_n_steps=50` (which HF's `logging_steps` decides). When a fit starts, the flow
applies `tidy_lightning_console` to such a trainer:

- the console filters of `console.py` are installed (the litlogger tip, "`Trainer.fit` stopped: `max_steps=N`
  reached", ...);
- Lightning's default model summary (a `ModelSummary` / `RichModelSummary` of depth 1, what `enable_model_summary`
  adds) is removed; a summary of another depth, or a subclass, is the user's and stays;
- Lightning's own bar (exactly `RichProgressBar` / `TQDMProgressBar`) shows hf_lightning's items
  (`progress_bar.adopt_bar`: evaluation metrics, HF's epoch count, no `v_num`), keeping its settings;
- `log_every_n_steps` is 1, as in the facade: HF's `logging_steps` decides when the flow logs.

`HFTrainerFlow(..., lightning_console=True)` keeps Lightning's output as configured.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, RichModelSummary

from hf_lightning._lightning_compat import callbacks_of
from hf_lightning.callbacks.progress_bar import adopt_bar
from hf_lightning.console import install_console_filters

__all__ = ["is_default_model_summary", "tidy_lightning_console"]

_LIGHTNING_DEFAULT_DEPTH = 1


def is_default_model_summary(callback: object) -> bool:
    """Whether `callback` is the model summary Lightning adds by default (exact class, depth 1)."""
    return type(callback) in (ModelSummary, RichModelSummary) \
        and getattr(callback, "_max_depth", None) == _LIGHTNING_DEFAULT_DEPTH


def tidy_lightning_console(trainer: pl.Trainer) -> None:
    """Make a hand-built `trainer` print as `hf_lightning.Trainer` does (see the module docstring)."""
    install_console_filters()
    callbacks = callbacks_of(trainer)  # the trainer's own list: edited in place
    callbacks[:] = [cb for cb in callbacks if not is_default_model_summary(cb)]
    for callback in callbacks:
        if isinstance(callback, ProgressBar):
            adopt_bar(callback)
    # set by Lightning's logger connector, not declared on the class
    trainer.log_every_n_steps = 1  # type: ignore[attr-defined]
