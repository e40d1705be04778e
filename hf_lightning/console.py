"""What a run prints: the progress bar, the end-of-fit summary (`summary.py`) and real warnings, nothing else.

Lightning and transformers print things a user of hf_lightning cannot act on, or prints them once per
`lightning.Trainer` (the facade builds one for `train()` and one per `evaluate()` / `predict()`). Each item below
is removed by name, so every other message and warning still reaches the user:

- Lightning's device banner ("GPU available: ...", "TPU available: ...", "LOCAL_RANK: ...") is shown once per
  process instead of once per `lightning.Trainer`;
- Lightning's "💡 Tip: ... litlogger" advertisement is dropped (it names a product, not a problem);
- "`Trainer.fit` stopped: `max_steps=N` reached." is dropped: every hf_lightning fit ends that way (the HF
  arguments are turned into `max_steps`), and the summary says how it ended. The other stop reasons stay;
- the warning "`isinstance(treespec, LeafSpec)` is deprecated" is dropped where Lightning raises it: torch >= 2.10
  warns about Lightning 2.6's own code, not about anything the user wrote
  (`_lightning_compat.ignore_internal_deprecation_warnings`);
- Lightning's "predict returned None if it was on purpose, ignore this warning..." is dropped: `predict_step`
  returns None by design (predictions are gathered by `HFTrainerFlow`, as HF's `predict` does);
- DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it." is
  dropped: with deepspeed installed, every checkpoint's `save_pretrained` imports it (accelerate's
  `extract_model_from_parallel`), and on a CPU run that does not use DeepSpeed the line is about nothing the run
  does (a DeepSpeed strategy needs a GPU, where the line does not appear);
- transformers' "Writing model shards" progress bars are switched off while a checkpoint is written
  (`checkpoint/io.py` `quiet_save_progress`): they broke the training bar at every save;
- the progress bar (`callbacks/progress_bar.py`) shows updates, the training loss and the latest evaluation's
  metrics (`latest_eval_metrics`), without Lightning's `v_num` (the logger version, meaningless to an HF user).

The filters are installed when hf_lightning builds a `lightning.Trainer`
(`trainer/lightning_trainer.py`); a hand-built one gets them with `install_console_filters()`.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any

from hf_lightning._lightning_compat import ignore_internal_deprecation_warnings, rank_zero_loggers

__all__ = ["install_console_filters", "latest_eval_metrics"]

_BANNER_PREFIXES = ("GPU available:", "TPU available:", "HPU available:", "LOCAL_RANK:")
_DROPPED = (
    re.compile(r"💡 Tip: .*litlogger"),
    re.compile(r"`Trainer\.fit` stopped: `max_steps=\d+` reached\."),
    re.compile(r"^Setting accelerator to CPU\. If you have GPU or other accelerator, we were unable to detect it\."),
)
_DEEPSPEED_LOGGER = "DeepSpeed"
"""The logger of `deepspeed.utils.logging` (its accelerator detection logs through it)."""
_IGNORED_WARNINGS = (r"predict returned None if it was on purpose",)
_RUNTIME_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second")


class _LightningInfoFilter(logging.Filter):
    """Drops the messages listed in the module docstring; shows each device-banner line once per process."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(pattern.search(message) for pattern in _DROPPED):
            return False
        if message.startswith(_BANNER_PREFIXES):
            if message in self.seen:
                return False
            self.seen.add(message)
        return True


_FILTER = _LightningInfoFilter()


def install_console_filters() -> None:
    """Install the filters of the module docstring (idempotent; called whenever a `lightning.Trainer` is built)."""
    for logger in [*rank_zero_loggers(), logging.getLogger(_DEEPSPEED_LOGGER)]:
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    for message in _IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    ignore_internal_deprecation_warnings()


def latest_eval_metrics(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The metrics of the latest evaluation in an HF `log_history` (every eval set of it), runtime keys left out.

    An evaluation of several named datasets logs one entry per dataset at the same step; all of them are returned.
    """
    found: dict[str, float] = {}
    step = None
    for entry in reversed(log_history):
        keys = [k for k in entry if k.startswith("eval_")]
        if not keys:
            if step is not None:
                break
            continue
        if step is not None and entry.get("step") != step:
            break
        step = entry.get("step")
        for key in keys:
            if not key.endswith(_RUNTIME_SUFFIXES) and isinstance(entry[key], (int, float)):
                found.setdefault(key, float(entry[key]))
    return dict(sorted(found.items()))
