"""The HF Trainer's step arithmetic and its "when" rules, as pure functions (no torch, no Lightning).

One place for each rule of `transformers` 5.x that decides *when* things happen:

- `plan_training`: updates per epoch, `max_steps`, loop epochs, and the resolved log/eval/save intervals
  (`Trainer._inner_training_loop` T:2508-2553 and `TrainerState.compute_steps` CB:156-167).
- `epoch_progress`: the float `state.epoch` (T:1956), a fraction of micro-batches, not of updates.
- `step_end_flags` / `epoch_end_flags`: `DefaultFlowCallback.on_step_end` / `on_epoch_end` (CB:568-621).

`flow/flow.py` calls `plan_training` and `epoch_progress`; the flags come from HF's own `DefaultFlowCallback`,
dispatched first among the HF callbacks (so removing it works as in HF). `step_end_flags` / `epoch_end_flags` state
its rules without a run; tests check them against `DefaultFlowCallback` itself.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_lightning.args import TrainingArguments

__all__ = [
    "Flags",
    "TrainingPlan",
    "epoch_end_flags",
    "epoch_progress",
    "plan_training",
    "resolve_interval",
    "step_end_flags",
    "updates_per_epoch",
]

_HF_DEFAULT_INTERVAL = 500  # TrainerState's default when an interval argument is None (CB:98-100)


def updates_per_epoch(microbatches_per_epoch: int, accumulation: int) -> int:
    """`max(ceil(len_dataloader / GA), 1)` (T:2522-2526): the short last window of an epoch still makes an update."""
    return max(math.ceil(microbatches_per_epoch / accumulation), 1)


def resolve_interval(value: float | None, max_steps: int) -> float:
    """A log/eval/save interval as `DefaultFlowCallback` sees it: a fraction < 1 becomes `ceil(max_steps * value)`."""
    if value is None:
        return _HF_DEFAULT_INTERVAL
    if value < 1:
        return math.ceil(max_steps * value)
    return value


@dataclass(frozen=True)
class TrainingPlan:
    """The numbers fixed at the start of `train()`.

    Attributes:
        microbatches_per_epoch: batches one process draws per epoch (`steps_in_epoch`); `max_steps * GA` if unsized.
        updates_per_epoch: optimizer updates per epoch.
        max_steps: total updates of the run.
        num_train_epochs: epochs the loop runs (an int; `sys.maxsize` for an unsized dataset).
        logging_steps: resolved logging interval.
        eval_steps: resolved evaluation interval.
        save_steps: resolved save interval.
        sized: whether the train data has a length.
    """

    microbatches_per_epoch: int
    updates_per_epoch: int
    max_steps: int
    num_train_epochs: int
    logging_steps: float
    eval_steps: float
    save_steps: float
    sized: bool = True


def plan_training(args: TrainingArguments, microbatches_per_epoch: int | None) -> TrainingPlan:
    """Compute the run's totals the way `Trainer._inner_training_loop` does (T:2508-2553).

    Args:
        args: the training arguments.
        microbatches_per_epoch: length of one process's train loader in micro-batches, or None if unsized.

    Raises:
        ValueError: an unsized dataset without `max_steps`, or an empty train loader.
    """
    ga = args.gradient_accumulation_steps
    if microbatches_per_epoch is None:
        if args.max_steps <= 0:
            raise ValueError(
                "The train_dataset does not implement __len__, so `max_steps` has to be specified (got "
                f"max_steps={args.max_steps}); the number of training steps cannot be derived from epochs."
            )
        max_steps = args.max_steps
        per_epoch, steps_in_epoch, epochs, sized = max_steps, max_steps * ga, sys.maxsize, False
    else:
        if microbatches_per_epoch == 0:
            raise ValueError(
                "The train dataloader is empty: no batch per epoch (check the dataset size, "
                "`per_device_train_batch_size` and `dataloader_drop_last`)."
            )
        per_epoch = updates_per_epoch(microbatches_per_epoch, ga)
        steps_in_epoch, sized = microbatches_per_epoch, True
        if args.max_steps > 0:
            max_steps = args.max_steps
            epochs = math.ceil(max_steps / per_epoch)
        else:
            max_steps = math.ceil(args.num_train_epochs * per_epoch)
            epochs = math.ceil(args.num_train_epochs)
    return TrainingPlan(
        microbatches_per_epoch=steps_in_epoch,
        updates_per_epoch=per_epoch,
        max_steps=max_steps,
        num_train_epochs=epochs,
        logging_steps=resolve_interval(args.logging_steps, max_steps),
        eval_steps=resolve_interval(args.eval_steps, max_steps),
        save_steps=resolve_interval(args.save_steps, max_steps),
        sized=sized,
    )


def epoch_progress(epoch_index: int, microbatches_done: int, microbatches_per_epoch: int) -> float:
    """`state.epoch = epoch + (step + 1) / steps_in_epoch` (T:1956), with `microbatches_done = step + 1`."""
    return epoch_index + microbatches_done / microbatches_per_epoch


@dataclass
class Flags:
    """What `DefaultFlowCallback` asks for; the same names as `transformers.TrainerControl`."""

    should_log: bool = False
    should_evaluate: bool = False
    should_save: bool = False
    should_training_stop: bool = False

    def merge_into(self, control: Any) -> None:
        """Raise these flags on a `TrainerControl`. `DefaultFlowCallback` runs first in HF's handler and only ever
        sets flags to True, so flags already raised (by the user's callbacks earlier in the step) stay raised."""
        for name in ("should_log", "should_evaluate", "should_save", "should_training_stop"):
            if getattr(self, name):
                setattr(control, name, True)


def step_end_flags(global_step: int, args: TrainingArguments, plan: TrainingPlan) -> Flags:
    """`DefaultFlowCallback.on_step_end` (CB:568-606), after `global_step` was incremented."""
    flags = Flags()
    if global_step == 1 and args.logging_first_step:
        flags.should_log = True
    if args.logging_strategy == "steps" and global_step % plan.logging_steps == 0:
        flags.should_log = True
    eval_allowed = args.eval_delay <= global_step
    if args.eval_strategy == "steps" and global_step % plan.eval_steps == 0 and eval_allowed:
        flags.should_evaluate = True
    if args.save_strategy == "steps" and plan.save_steps > 0 and global_step % plan.save_steps == 0:
        flags.should_save = True
    if global_step >= plan.max_steps:
        flags.should_training_stop = True
        # HF 5 forces a final evaluation and save at the last update for "steps" strategies (CB:594-606);
        # there is no forced final log.
        if args.eval_strategy == "steps" and global_step % plan.eval_steps != 0 and eval_allowed:
            flags.should_evaluate = True
        if args.save_strategy == "steps":
            flags.should_save = True
    return flags


def epoch_end_flags(epoch: float, args: TrainingArguments) -> Flags:
    """`DefaultFlowCallback.on_epoch_end` (CB:608-621); `epoch` is the float `state.epoch`."""
    return Flags(
        should_log=args.logging_strategy == "epoch",
        should_evaluate=args.eval_strategy == "epoch" and args.eval_delay <= epoch,
        should_save=args.save_strategy == "epoch",
    )
