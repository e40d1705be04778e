"""`auto_micro_batch`: an update, or an evaluation batch, retried with smaller micro-batches after running out of
memory, so the global batch, the samples and the loss stay those the user asked for.

Training (`MicroBatchGuard.run_update`): the window of an update (its loader micro-batches) is cut into pieces of
`ceil(per_device_train_batch_size / split)` rows (`run_options/micro_batch.py`), each piece a micro-batch of its own:
the accumulation in effect is `gradient_accumulation_steps x split`, and `num_items_in_batch` is the window's label
tokens as before, so the token-normalised loss of the update is unchanged. When a forward or backward raises an
out-of-memory error, the rest of the try is skipped; every process then agrees (`any_process_failed`); after a
failure anywhere the gradients are zeroed, the global torch RNG is put back where the try started (so the retry
draws dropout as a run started at the smaller size does), the device cache is emptied and the split doubles, and
the same window is tried again. The optimizer has not stepped: all of this happens inside the optimizer's closure.

The rule under several processes: no collective runs inside a forward or backward of a guarded update, and every
process reaches the agreement after its try (a failing one straight from its error), so no process can wait in a
collective that another one will never enter. DDP's gradient reduction is held during the update and done after the
agreement (`parallel/runtime.py`). Under FSDP2, whose forwards and backwards all-gather and reduce-scatter,
each of FSDP's collectives is preceded by a flag all-reduce instead (`parallel/oom_agreement.py`): a failing process
joins the others' next one from the end of its try, and they stop their try there; FSDP's iteration state is reset
after a failed try. FSDP1 and DeepSpeed are refused. The gradient count of `average_tokens_across_devices` is one
collective at the start of each try, entered by every process (the retry is agreed before it).

Evaluation (`MicroBatchGuard.run_eval`): an evaluation / prediction batch is cut alike; the pieces' `(loss, logits,
labels)` are joined into the batch's (the loss weighted by each piece's label tokens, or rows without labels): the
same result as the whole batch, up to float rounding. Evaluation runs no collective inside a batch under DDP, so
each process finds its own evaluation size; under FSDP2 the processes agree on it as in training (`AgreedEval`), and
each runs as many forwards per batch (a short last batch repeats its last piece, the repeat's results dropped).

The size found is logged once when it changes, kept in checkpoints by `MicroBatchRecord` (`lightning_state.pt`) and
used by a resumed run from its first update.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from transformers.trainer_pt_utils import nested_concat
from typing_extensions import override

from hf_lightning._lightning_compat import attached_trainer
from hf_lightning.args import TrainingArguments
from hf_lightning.module.evaluation import EvalStep
from hf_lightning.module.loss import count_label_tokens
from hf_lightning.run_options.device_cache import empty_device_cache
from hf_lightning.run_options.micro_batch import (
    MicroBatchSplit,
    RngSnapshot,
    is_out_of_memory,
    next_split,
    piece_size,
    rows_of,
    split_micro_batch,
)

__all__ = ["AgreedEval", "MicroBatchGuard", "MicroBatchRecord", "TryUpdate"]

log = logging.getLogger(__name__)

TryUpdate = Callable[[list[dict[str, Any]]], None]
"""Runs one try of an update over these micro-batches (forwards and backwards, no optimizer step)."""


def _attempt(run: Callable[[], Any]) -> tuple[Any, str | None]:
    """`(run(), None)`, or `(None, the error's text)` after an out-of-memory error (its frames, which hold the try's
    activations, are released on return)."""
    try:
        return run(), None
    except Exception as error:  # noqa: BLE001  # only out-of-memory errors are kept; the rest is raised again
        if not is_out_of_memory(error):
            raise
        return None, str(error) or type(error).__name__


class MicroBatchGuard:
    """The splits in effect and the retries of one module (module docstring).

    Args:
        args: the training arguments (`per_device_train_batch_size`, `per_device_eval_batch_size` are read at each
            use: a resume may change them).
    """

    def __init__(self, args: TrainingArguments) -> None:
        self.args = args
        self.split = MicroBatchSplit(per_device_train=args.per_device_train_batch_size,
                                     per_device_eval=args.per_device_eval_batch_size)
        self.tries = 0
        """Tries of updates that ran out of memory (on any process), since this guard was made."""

    def _sync_sizes(self) -> None:
        self.split.per_device_train = self.args.per_device_train_batch_size
        self.split.per_device_eval = self.args.per_device_eval_batch_size

    def pieces(self, window: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The micro-batches an update over `window` runs at the split in effect."""
        self._sync_sizes()
        return [piece for micro in window for piece in split_micro_batch(micro, self.split.train)]

    def run_update(self, window: list[Mapping[str, Any]], try_update: TryUpdate, zero_grads: Callable[[], None],
                   any_failed: Callable[[bool], bool], reduce: Callable[[], None], is_global_zero: bool,
                   step: int) -> None:
        """Run the update over `window` until a try succeeds on every process (module docstring).

        Args:
            window: the update's loader micro-batches.
            try_update: one try over the pieces (forwards, backwards).
            zero_grads: drops the gradients of a failed try (and resets FSDP2's iteration state).
            any_failed: the agreement: whether this or any other process failed (one collective).
            reduce: the gradient reduction after a try agreed to be good (DDP's, held during the try).
            is_global_zero: whether this process logs the size found.
            step: the update's number (for the log line).

        Raises:
            torch.OutOfMemoryError: out of memory with micro-batches of one row (on this process or another).
        """
        rng = RngSnapshot()
        before = self.split.train
        while True:
            pieces = self.pieces(window)
            _, error = _attempt(functools.partial(try_update, pieces))
            del pieces
            if not any_failed(error is not None):
                reduce()
                break
            self.tries += 1
            zero_grads()
            empty_device_cache(collect_garbage=True)
            rng.restore()
            split = next_split(self.split.per_device_train, self.split.train)
            if split is None:
                where = error or "another process ran out of memory"
                raise torch.OutOfMemoryError(
                    f"auto_micro_batch: out of memory at update {step} with micro-batches of one row "
                    f"(per_device_train_batch_size={self.split.per_device_train} in "
                    f"{self.split.train} pieces): {where}")
            self.split.train = split
        if self.split.train != before and is_global_zero:
            self._log_train(before, step)

    def _log_train(self, before: int, step: int) -> None:
        per_device, accumulation = self.split.per_device_train, self.args.gradient_accumulation_steps
        log.warning(
            "auto_micro_batch: out of memory at update %d with micro-batches of %d; training on with micro-batches "
            "of %d and %d per update (per_device_train_batch_size=%d x gradient_accumulation_steps=%d kept: the "
            "global batch and the loss are unchanged).", step, piece_size(per_device, before),
            piece_size(per_device, self.split.train), accumulation * self.split.train, per_device, accumulation)

    def run_eval(self, batch: Mapping[str, Any], step: Callable[[dict[str, Any]], EvalStep], shift_labels: bool,
                 is_global_zero: bool, agreed: AgreedEval | None = None) -> EvalStep:
        """One evaluation / prediction batch, cut into pieces at the split in effect, smaller after each
        out-of-memory error; the pieces' results joined into the batch's (module docstring).

        Args:
            batch: the evaluation batch.
            step: one forward over a piece (HF's `prediction_step`).
            shift_labels: whether the loss shifts labels (each piece's weight is its label tokens).
            is_global_zero: whether this process logs the size found.
            agreed: under FSDP2, whose forwards all-gather: every process runs as many forwards (a short batch
                repeats its last piece, the repeats' results dropped) and a failure anywhere retries everywhere.

        Raises:
            torch.OutOfMemoryError: out of memory with pieces of one row.
        """
        self._sync_sizes()
        rng = RngSnapshot()  # generation may sample
        before = self.split.eval
        while True:
            pieces = split_micro_batch(batch, self.split.eval)
            run = pieces
            if agreed is not None:  # a full batch's count of pieces on every process
                full = 1 if self.split.per_device_eval <= 1 else min(self.split.eval, self.split.per_device_eval)
                run = pieces + pieces[-1:] * (full - len(pieces))
            steps, error = _attempt(functools.partial(_run_all, step, run))
            failed = agreed.any_failed(error is not None) if agreed is not None else error is not None
            if not failed:
                steps = steps[:len(pieces)]
                break
            del pieces, run
            if agreed is not None:
                agreed.reset()
            empty_device_cache(collect_garbage=True)
            rng.restore()
            rows = self.split.per_device_eval if agreed is not None else rows_of(batch) or 1  # the same everywhere
            split = next_split(rows, self.split.eval)
            if split is None:
                where = error or "another process ran out of memory"
                raise torch.OutOfMemoryError(f"auto_micro_batch: out of memory evaluating batches of one row: {where}")
            self.split.eval = split
        if self.split.eval != before and is_global_zero:
            log.warning("auto_micro_batch: out of memory evaluating batches of %d; evaluating on in pieces of %d "
                        "(per_device_eval_batch_size=%d kept: the results are the whole batch's).",
                        piece_size(self.split.per_device_eval, before),
                        piece_size(self.split.per_device_eval, self.split.eval), self.split.per_device_eval)
        if len(steps) == 1:
            return steps[0]
        weights = [_loss_weight(piece, shift_labels) for piece in pieces]
        return join_eval_steps(steps, weights)


@dataclasses.dataclass(frozen=True)
class AgreedEval:
    """How evaluation pieces agree under FSDP2 (`parallel/oom_agreement.py`).

    Attributes:
        any_failed: the agreement at the end of a try: whether this or any other process failed.
        reset: FSDP's iteration state reset after a failed try (no collective).
    """

    any_failed: Callable[[bool], bool]
    reset: Callable[[], None]


def _run_all(step: Callable[[dict[str, Any]], EvalStep], pieces: list[dict[str, Any]]) -> list[EvalStep]:
    return [step(piece) for piece in pieces]


def _loss_weight(piece: Mapping[str, Any], shift_labels: bool) -> float:
    """A piece's share of the batch's mean loss: its label tokens, or its rows without labels."""
    tokens = count_label_tokens(piece, shift_labels)
    if tokens is not None:
        return float(tokens)
    return float(rows_of(piece) or 1)


def join_eval_steps(steps: list[EvalStep], weights: list[float]) -> EvalStep:
    """The pieces' results as one batch's: logits and labels concatenated along the first dimension (padded with
    -100 along the second where pieces differ, as batches are), the loss the weighted mean of the pieces' losses."""
    losses = [s.loss for s in steps if s.loss is not None]
    loss: torch.Tensor | None = None
    if len(losses) == len(steps):
        total = sum(weights)
        shares = weights if total > 0 else [1.0] * len(weights)
        total = total if total > 0 else float(len(weights))
        mean = torch.stack([x.detach().float().reshape(()) * (w / total) for x, w in zip(losses, shares)]).sum()
        loss = mean.to(losses[0].dtype)
    return EvalStep(loss, _concat([s.logits for s in steps]), _concat([s.labels for s in steps]))


def _concat(values: list[Any]) -> Any:
    if any(v is None for v in values):
        return None
    out = values[0]
    for value in values[1:]:
        out = nested_concat(out, value, padding_index=-100)
    return out


class MicroBatchRecord(pl.Callback):
    """Keeps the module's micro-batch sizes found (`MicroBatchSplit.state_dict`) in each checkpoint's
    `lightning_state.pt`, and gives them back on resume; hands DDP its gradient sync back after each update, before
    the other callbacks' `on_train_batch_end` (an evaluation there runs DDP forwards). Added first by
    `trainer/lightning_trainer.py` when `auto_micro_batch` is on."""

    def __init__(self) -> None:
        self._module: Any = None
        self._pending: dict[str, Any] | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._module = pl_module
        if self._pending is not None:
            self.load_state_dict(self._pending)

    def _guard(self) -> MicroBatchGuard | None:
        guard = getattr(self._module, "micro_batch_guard", None)
        return guard if isinstance(guard, MicroBatchGuard) else None

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        release = getattr(pl_module, "end_guarded_update", None)
        if callable(release):
            release()

    @override
    def state_dict(self) -> dict[str, Any]:
        guard = self._guard()
        if guard is None:
            return {}
        guard._sync_sizes()
        return guard.split.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        guard = self._guard()
        if guard is None:
            self._pending = dict(state_dict)
            return
        self._pending = None
        guard._sync_sizes()
        before = guard.split.train
        guard.split.load_state_dict(state_dict)
        if guard.split.train != before and self._is_global_zero():
            log.warning("auto_micro_batch: resuming with micro-batches of %d (found before the checkpoint) and %d "
                        "per update.", piece_size(guard.split.per_device_train, guard.split.train),
                        guard.args.gradient_accumulation_steps * guard.split.train)

    def _is_global_zero(self) -> bool:
        trainer = attached_trainer(self._module) if isinstance(self._module, pl.LightningModule) else None
        return trainer is None or bool(trainer.is_global_zero)
