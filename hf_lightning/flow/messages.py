"""The messages `transformers.Trainer` logs, with its words, through its logger (`transformers.trainer`, INFO).

An HF user sees them as in HF (e.g. with `log_level="info"`, or `transformers.logging.set_verbosity_info()`):
"max_steps is given, ..." at construction (T:727), the "***** Running training *****" header (T:1618-1628), the
resume lines (T:1630-1638) and "Loading model from ..." (T:3667), the evaluation header (T:2957-2962), "Saving
model checkpoint to ..." (T:4149), "Training completed..." (T:2003), "Loading best model from ... (score: ...)."
(T:3745), "Deleting older checkpoint [...] due to args.save_total_limit" (T:2035, the final cleanup only: HF's
rotation during training logs nothing). The log dicts printed to the console come from HF's own `PrinterCallback` /
`ProgressCallback` (`console_callback`), which the `Trainer` facade installs as HF does (T:599).
"""

from __future__ import annotations

from typing import Any

from transformers import PrinterCallback, ProgressCallback
from transformers.utils import is_in_notebook
from transformers.utils import logging as hf_logging

__all__ = ["console_callback", "evaluation_header", "logger", "resume_lines", "training_header"]

logger = hf_logging.get_logger("transformers.trainer")
"""HF's Trainer logger: a `transformers` user's logging settings apply to these messages as to HF's."""

MAX_STEPS_OVERRIDE = "max_steps is given, it will override any value given in num_train_epochs"
"""Logged at construction when both are set (T:726-727)."""

TRAINING_COMPLETED = "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n"


def console_callback(disable_tqdm: bool) -> type[Any]:
    """HF's console callback (T:186-192, 599): `PrinterCallback` with `disable_tqdm`, else its progress bar (the
    notebook one in a notebook), which writes each log dict above the bar."""
    if disable_tqdm:
        return PrinterCallback
    if is_in_notebook():
        from transformers.utils.notebook import NotebookProgressCallback

        return NotebookProgressCallback
    return ProgressCallback


def training_header(
    num_examples: int, num_epochs: int, updates_per_epoch: int, batch_size: int, total_batch_size: int,
    accumulation: int, max_steps: int, trainable_parameters: int,
) -> list[str]:
    """HF's "***** Running training *****" lines (T:1618-1628), one log record each."""
    return [
        "***** Running training *****",
        f"  Num examples = {num_examples:,}",
        f"  Num Epochs = {num_epochs:,}",
        f"  Num update steps per epoch = {updates_per_epoch:,}",
        f"  Instantaneous batch size per device = {batch_size:,}",
        f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch_size:,}",
        f"  Gradient Accumulation steps = {accumulation}",
        f"  Total optimization steps = {max_steps:,}",
        f"  Number of trainable parameters = {trainable_parameters:,}",
    ]


def resume_lines(epochs_trained: int, global_step: int, microbatches_skipped: int, ignore_data_skip: bool
                 ) -> list[str]:
    """HF's resume lines after the header (T:1630-1638)."""
    lines = [f"  Resuming training from checkpoint with epoch {epochs_trained} and global step {global_step}"]
    if not ignore_data_skip:
        lines.append(f"  Fast-forwarding the dataloader past {epochs_trained} epochs and {microbatches_skipped} "
                     "batches to resume from the exact training state.")
    return lines


def evaluation_header(description: str, num_examples: int | None, batch_size: int) -> list[str]:
    """HF's evaluation-loop header (T:2957-2962): `description` is "Evaluation" or "Prediction"."""
    examples = f"  Num examples = {num_examples}" if num_examples is not None else "  Num examples: Unknown"
    return [f"\n***** Running {description} *****", examples, f"  Batch size = {batch_size}"]
