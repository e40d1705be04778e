"""A resumed run continues the CSV log of the run it resumes, without repeating steps.

Lightning's `CSVLogger` starts a new `version_<n+1>` folder for every fit; given a fixed version (`run_name`) it
deletes the folder's `metrics.csv` instead. After `resume_from_checkpoint` either loses the history or, across two
folders, repeats every step logged after the checkpoint (the interrupted run's rows, then the resumed run's). HF's
TensorBoard events file is appended to. Here, before anything is logged:

- the logger continues in the folder of the run that wrote the checkpoint: its `run_name` folder, else the highest
  `version_<n>` under `<output_dir>/csv` (the output-directory rule keeps one run per `output_dir`);
- that folder's rows up to the checkpoint's step are kept (the resumed run logs the later steps again) and handed to
  the logger, which writes them first; the rows after the checkpoint are dropped.

`kept_rows` is the pure rule; `continue_csv_logs` applies it to a fit's loggers (global rank 0 only: the logger
writes on rank 0).
"""

from __future__ import annotations

import csv
import json
import os
import re
import warnings
from collections.abc import Sequence
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger

from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint.find import resolve_resume

__all__ = ["continue_csv_logs", "continue_resumed_logs", "kept_rows", "latest_version"]

_METRICS = "metrics.csv"


def _number(value: str) -> float | int | str:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def kept_rows(rows: list[dict[str, str]], resume_step: int) -> list[dict[str, Any]]:
    """The rows of `metrics.csv` logged at or before `resume_step`, values as numbers, empty cells left out."""
    kept = []
    for row in rows:
        step = row.get("step")
        if step in (None, "") or float(step) > resume_step:
            continue
        kept.append({k: _number(v) for k, v in row.items() if v not in (None, "")})
    return kept


def latest_version(root: str) -> int | None:
    """The highest `version_<n>` folder under `root`, or None."""
    try:
        names = os.listdir(root)
    except OSError:
        return None
    versions = [int(m[1]) for name in names if (m := re.fullmatch(r"version_(\d+)", name))
                and os.path.isdir(os.path.join(root, name))]
    return max(versions) if versions else None


def continue_csv_logs(loggers: Sequence[Logger], resume_step: int) -> None:
    """Point every `CSVLogger` of a resumed fit at the resumed run's folder, keeping its rows up to `resume_step`
    (see the module docstring). Call it before the fit opens the loggers (`HFTrainerFlow.fit`, before `trainer.fit`:
    Lightning opens them before any callback's `setup`, and its writer deletes a `metrics.csv` it finds)."""
    for logger in loggers:
        if not isinstance(logger, CSVLogger) or logger._experiment is not None:
            continue  # another logger, or one already writing (a user's, used before this fit)
        # a numbered version whose folder does not exist yet is the next one Lightning picked for this fit; a name
        # (`run_name`) is the run's own folder
        if logger._version is None or (isinstance(logger._version, int) and not os.path.isdir(logger.log_dir)):
            version = latest_version(logger.root_dir)
            if version is None:
                continue
            logger._version = version
        path = os.path.join(logger.log_dir, _METRICS)
        rows: list[dict[str, str]] = []
        if os.path.isfile(path):
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
        with warnings.catch_warnings():
            # the writer warns that it deletes the folder's metrics.csv: its rows are read above and handed over here
            warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
            writer = logger.experiment
        writer.metrics.extend(kept_rows(rows, resume_step))


def continue_resumed_logs(loggers: Sequence[Logger], args: TrainingArguments, resume_from_checkpoint: str | bool | None
                          ) -> None:
    """`continue_csv_logs` at the step of the checkpoint a fit resumes from (`resolve_resume`'s rule), if any. A resume
    that cannot be resolved is left to the flow's `on_fit_start`, which says why."""
    try:
        resume = resolve_resume(args, resume_from_checkpoint)
    except (ValueError, FileNotFoundError):
        return
    state = os.path.join(resume, "trainer_state.json") if resume else None
    if state is not None and os.path.isfile(state):
        with open(state) as f:
            continue_csv_logs(loggers, int(json.load(f).get("global_step", 0)))
