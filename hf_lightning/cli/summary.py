"""The end-of-fit summary that `hf-lightning fit` and the quickstart print: how training went and where things are.

`fit_summary` turns an HF `TrainerState`, the arguments and paths into text (it also lists the `checkpoint-<n>`
folders of `output_dir`); `logger_paths` reads where the Lightning loggers of a run write. The `hf_lightning.Trainer`
facade prints nothing extra, as `transformers.Trainer` (`trainer.state` holds the same facts); scripts can print
`fit_summary(trainer.state, trainer.args, ...)` themselves.

Example of the text::

    Training done: 96 updates (3 epochs) in 9.8 s, train_loss 0.5505
    Last evaluation (step 96): eval_accuracy 0.8203, eval_loss 0.4832
    Best eval_accuracy 0.8281 at step 64: checkpoint .../checkpoint-64 (loaded at the end: load_best_model_at_end)
    Model and tokenizer: /abs/text_classification_output
    Checkpoints: /abs/text_classification_output/checkpoint-64, checkpoint-96
    Logs: CSV /abs/text_classification_output/csv/version_0/metrics.csv
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from transformers import TrainerState

from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint.layout import checkpoint_folders
from hf_lightning.console import latest_eval_metrics
from hf_lightning.plan import metric_key

__all__ = ["fit_summary", "logger_paths"]


def _number(value: Any) -> str:
    return format(value, ".4g") if isinstance(value, float) else str(value)


def fit_summary(
    state: TrainerState, args: TrainingArguments, *, train_metrics: dict[str, Any] | None = None,
    model_dir: str | None = None, logs: dict[str, str] | None = None, resumed_from: tuple[str, int] | None = None,
    written: Sequence[int] | None = None,
) -> str:
    """A few lines: updates / epochs / time / train loss, the last evaluation, the best metric and its checkpoint,
    where the model, the checkpoints and the logs are.

    Args:
        state: the run's `transformers.TrainerState` (`log_history`, `global_step`, `epoch`, `best_*`).
        args: its training arguments (`output_dir`, `metric_for_best_model`, `load_best_model_at_end`...).
        train_metrics: HF's train summary entry (`train_runtime`, `train_loss`); default: the last in `log_history`.
        model_dir: where the final model was saved, if it was.
        logs: `logger_paths` of the run's Lightning loggers.
        resumed_from: `(checkpoint folder, its step)` when the fit resumed (`HFTrainerFlow.resumed_from`).
        written: the steps this fit saved (`HFTrainerFlow.written_steps`); the other `checkpoint-<n>` folders of
            `output_dir` are named apart, as an earlier run's (None: not known, every folder is listed).
    """
    if train_metrics is None:
        train_metrics = next((e for e in reversed(state.log_history) if "train_runtime" in e), {})
    epochs = ""
    if state.epoch is not None:
        epoch = round(float(state.epoch), 2)
        epochs = f" ({_number(epoch)} epoch{'' if epoch == 1 else 's'})"
    line = f"Training done: {state.global_step} updates{epochs}"
    if "train_runtime" in train_metrics:
        line += f" in {float(train_metrics['train_runtime']):.1f} s"
    if "train_loss" in train_metrics:
        line += f", train_loss {_number(float(train_metrics['train_loss']))}"
    lines = [line]
    if resumed_from is not None:
        folder, resume_step = resumed_from
        lines.append(f"Resumed from {os.path.abspath(folder)} (step {resume_step}): updates from step "
                     f"{resume_step + 1} trained now")
    last = latest_eval_metrics(state.log_history)
    if last:
        step = next(e["step"] for e in reversed(state.log_history) if any(k in e for k in last))
        lines.append(f"Last evaluation (step {step}): " + ", ".join(f"{k} {_number(v)}" for k, v in last.items()))
    if args.metric_for_best_model is not None and state.best_metric is not None:
        best = f"Best {metric_key(args.metric_for_best_model)} {_number(float(state.best_metric))}"
        if state.best_global_step:
            best += f" at step {state.best_global_step}"
        if state.best_model_checkpoint:
            best += f": checkpoint {os.path.abspath(state.best_model_checkpoint)}"
            best += " (loaded at the end: load_best_model_at_end)" if args.load_best_model_at_end else ""
        lines.append(best)
    if model_dir is not None:
        lines.append(f"Model and tokenizer: {os.path.abspath(model_dir)}")
    output_dir = os.path.abspath(args.resolved_output_dir)
    folders = sorted(checkpoint_folders(output_dir).items())
    checkpoints = [path.name for step, path in folders if written is None or step in written]
    others = [] if written is None else [path.name for step, path in folders if step not in written]
    if others and not checkpoints:
        strategy = getattr(args.save_strategy, "value", args.save_strategy)
        lines.append(f"Checkpoints: none written by this run (save_strategy={strategy!r}); output_dir also holds "
                     f"{', '.join(others)} of an earlier run")
    elif checkpoints:
        lines.append(f"Checkpoints: {os.path.join(output_dir, checkpoints[0])}"
                     + "".join(f", {name}" for name in checkpoints[1:])
                     + (f" (also in output_dir, not written by this run: {', '.join(others)})" if others else ""))
    else:
        strategy = getattr(args.save_strategy, "value", args.save_strategy)
        lines.append(f"Checkpoints: none (save_strategy={strategy!r})")
    if logs:
        lines.append("Logs: " + "; ".join(f"{kind} {path}" for kind, path in logs.items()))
    else:
        lines.append("Logs: no logger (report_to='none'); `log_history` is in each checkpoint's trainer_state.json")
    return "\n".join(lines)


def logger_paths(trainer: pl.Trainer | None) -> dict[str, str]:
    """Where the run's Lightning loggers write: `{"TensorBoard": "tensorboard --logdir <dir>", "CSV": <file>}`."""
    paths: dict[str, str] = {}
    for logger in trainer.loggers if trainer is not None else []:
        if isinstance(logger, TensorBoardLogger):
            paths["TensorBoard"] = f"tensorboard --logdir {os.path.abspath(logger.root_dir)}"
        elif isinstance(logger, CSVLogger):
            paths["CSV"] = os.path.abspath(os.path.join(logger.log_dir, "metrics.csv"))
        elif logger.log_dir:
            paths[type(logger).__name__] = os.path.abspath(str(logger.log_dir))
    return paths
