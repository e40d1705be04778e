"""The run's plan: the HF Trainer's step arithmetic and every "when" / "which" rule, as pure functions (no torch, no
Lightning).

This is the one module (besides `args/`, which validates them) that reads the log / evaluate / save / best-model
arguments while a run goes; everything else asks it. One place for each rule of `transformers` 5.x:

- `plan_training`: updates per epoch, `max_steps`, loop epochs, and the resolved log/eval/save intervals
  (`Trainer._inner_training_loop` T:2508-2553 and `TrainerState.compute_steps` CB:156-167); `resume_intervals`: a
  resumed run keeps the checkpoint's intervals (T:1694-1710), with HF's warning when they differ.
- `epoch_progress`: the float `state.epoch` (T:1956), a fraction of micro-batches, not of updates.
- `step_end_flags` / `epoch_end_flags`: `DefaultFlowCallback.on_step_end` / `on_epoch_end` (CB:568-621);
  `evaluates_on_start`: `eval_on_start`; `saves_now`: the save decision of each pass (`save_strategy="best"`: exactly
  on a new best).
- `SavePolicy` (`save_policy`): whether the run writes checkpoints at all, which of them the best pointer follows,
  how many are kept, what goes into them: what `checkpoint/` reads instead of the arguments.
- `BestRule` (`best_rule`): which metric is the best-model metric, which direction is better, whether the best model
  is loaded at the end; `unreachable_best_metric` / `unreachable_best_checkpoint`: a metric no evaluation produces,
  intervals that could never save the best evaluation (refused before training; HF finds out too late or never).

`flow/flow.py` calls `plan_training` and `epoch_progress`; the flags come from HF's own `DefaultFlowCallback`,
dispatched first among the HF callbacks (so removing it works as in HF). `step_end_flags` / `epoch_end_flags` state
its rules without a run; tests check them against `DefaultFlowCallback` itself.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hf_lightning.args import TrainingArguments

__all__ = [
    "BestRule",
    "ControlFlags",
    "Flags",
    "RecordedIntervals",
    "SavePolicy",
    "TrainingPlan",
    "best_rule",
    "epoch_end_flags",
    "epoch_progress",
    "evaluates_during_fit",
    "evaluates_on_start",
    "is_better",
    "metric_key",
    "plan_training",
    "resolve_interval",
    "resume_intervals",
    "save_policy",
    "saves_now",
    "step_end_flags",
    "unreachable_best_checkpoint",
    "unreachable_best_metric",
    "updates_per_epoch",
    "with_max_steps",
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


def with_max_steps(plan: TrainingPlan, args: TrainingArguments, max_steps: int) -> TrainingPlan:
    """`plan` ending after `max_steps` updates, its fractional log / eval / save intervals resolved against that
    total (an elastic resume recounts an epoch-based run's updates: checkpoint/elastic.py `elastic_max_steps`)."""
    return dataclasses.replace(
        plan, max_steps=max_steps, logging_steps=resolve_interval(args.logging_steps, max_steps),
        eval_steps=resolve_interval(args.eval_steps, max_steps),
        save_steps=resolve_interval(args.save_steps, max_steps))


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

    def merge_into(self, control: ControlFlags) -> None:
        """Raise these flags on a `TrainerControl`. `DefaultFlowCallback` runs first in HF's handler and only ever
        sets flags to True, so flags already raised (by the user's callbacks earlier in the step) stay raised."""
        control.should_log = control.should_log or self.should_log
        control.should_evaluate = control.should_evaluate or self.should_evaluate
        control.should_save = control.should_save or self.should_save
        control.should_training_stop = control.should_training_stop or self.should_training_stop


class ControlFlags(Protocol):
    """The flags of a `transformers.TrainerControl` that `Flags` raises."""

    should_log: bool
    should_evaluate: bool
    should_save: bool
    should_training_stop: bool


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


def evaluates_during_fit(args: TrainingArguments) -> bool:
    """Whether a fit evaluates at all (an evaluation strategy, or `eval_on_start`): it then needs evaluation data."""
    return args.eval_strategy != "no" or bool(args.eval_on_start)


def evaluates_on_start(args: TrainingArguments) -> bool:
    """`eval_on_start`: one evaluation before the first update (T:1655-1656), with no best-metric update."""
    return bool(args.eval_on_start)


# ----- saving -----
_STRATEGIES_WITH_BEST_STEP = ("steps", "epoch", "best")
"""The save strategies for which `best_global_step` moves and a save points `best_model_checkpoint` at it
(T:3407-3415, 3460-3462)."""


@dataclass(frozen=True)
class SavePolicy:
    """Whether, and how, this run writes checkpoints: what `checkpoint/` reads instead of the arguments.

    Attributes:
        saves: the run writes checkpoints at all (`save_strategy != "no"`): the start-up notice names the
            checkpoints it would replace, and the end-of-training cleanup runs.
        tracks_best_step: `best_global_step` moves on a new best, and a save points `best_model_checkpoint` at its
            folder (`save_strategy` in steps / epoch / best).
        saves_on_new_best: a save happens exactly after an evaluation with a new best (`save_strategy="best"`).
        total_limit: `save_total_limit`: at most this many checkpoints are kept (the best one never rotates away).
        only_model: `save_only_model`: no optimizer, scheduler, RNG or loop state.
        asynchronous: `save_async`: the files are written by a background thread.
        nonfinite_allowed: `save_nonfinite_checkpoints`: weights holding NaN or inf are saved anyway, as HF does.
    """

    saves: bool = True
    tracks_best_step: bool = True
    saves_on_new_best: bool = False
    total_limit: int | None = None
    only_model: bool = False
    asynchronous: bool = False
    nonfinite_allowed: bool = False


def save_policy(args: TrainingArguments) -> SavePolicy:
    """The run's `SavePolicy` from its arguments."""
    strategy = args.save_strategy
    return SavePolicy(
        saves=strategy != "no",
        tracks_best_step=strategy in _STRATEGIES_WITH_BEST_STEP,
        saves_on_new_best=strategy == "best",
        total_limit=args.save_total_limit,
        only_model=bool(args.save_only_model),
        asynchronous=bool(args.save_async),
        nonfinite_allowed=bool(args.save_nonfinite_checkpoints),
    )


def saves_now(policy: SavePolicy, global_step: int, should_save: bool, new_best: bool | None) -> bool:
    """Whether this pass of `_maybe_log_save_evaluate` (T:2275-2286) writes `checkpoint-<global_step>`.

    The one place that decides a save during training: the flags decide (`DefaultFlowCallback`'s, see
    `step_end_flags`, and the user's callbacks'), except that with `save_strategy="best"` an evaluation decides:
    exactly a new best saves (T:2281-2282). A rule on when to save that HF's flags do not know goes here.

    Args:
        policy: the run's save policy.
        global_step: the update this pass follows.
        should_save: `control.should_save` after the pass's evaluation.
        new_best: whether the pass's evaluation found a new best; None when it did not evaluate.
    """
    if new_best is not None and policy.saves_on_new_best:
        return new_best
    return should_save


# ----- the best model -----
def metric_key(metric: str) -> str:
    """HF's lookup key: `eval_` is prepended unless already there (T:3441-3453)."""
    return metric if metric.startswith("eval_") else f"eval_{metric}"


@dataclass(frozen=True)
class BestRule:
    """Which evaluation is the best one, and what happens with it.

    Attributes:
        metric: `metric_for_best_model` as given (None: no best model is tracked).
        greater_is_better: a greater value of the metric is better.
        load_at_end: `load_best_model_at_end`: the best checkpoint's weights are loaded when training ends.
    """

    metric: str | None = None
    greater_is_better: bool = False
    load_at_end: bool = False

    @property
    def key(self) -> str | None:
        """The metric's key in the evaluation metrics (`eval_<metric>`), None when no best model is tracked."""
        return None if self.metric is None else metric_key(self.metric)

    @property
    def scheduler_key(self) -> str:
        """The key a `ReduceLROnPlateau` steps on: the best-model metric, else the loss (T:3322-3339)."""
        return metric_key(self.metric or "loss")


def best_rule(args: TrainingArguments) -> BestRule:
    """The run's `BestRule` from its arguments."""
    return BestRule(args.metric_for_best_model, bool(args.greater_is_better), bool(args.load_best_model_at_end))


def is_better(value: float, best: float | None, greater_is_better: bool) -> bool:
    """`_determine_best_metric`'s strict comparison (T:3455-3462): the first value is compared with -inf / +inf, so
    a NaN is never a best."""
    if best is None:
        best = float("-inf") if greater_is_better else float("inf")
    return bool(value > best) if greater_is_better else bool(value < best)


LOSS_ONLY_KEYS = ("loss", "runtime", "samples_per_second", "steps_per_second")
"""The metric names of an evaluation without `compute_metrics` (after the `eval_[<name>_]` prefix)."""


def unreachable_best_metric(args: TrainingArguments, eval_names: list[str] | None, loss_only: bool) -> str | None:
    """The error when evaluations during training cannot produce the `metric_for_best_model` key, else None.

    HF looks the key up after every training-time evaluation (T:3432-3453) and raises a `KeyError` at the first one,
    when training time is already spent. Two cases are certain before training starts:

    - named eval datasets (`eval_dataset={"dev": ..., "test": ...}`): every key is `eval_<name>_<metric>`, so
      `load_best_model_at_end` with the default metric `loss` (key `eval_loss`) can never be found;
    - `loss_only` (no `compute_metrics`, or `prediction_loss_only=True`): only the loss and runtime keys exist.

    Args:
        args: the training arguments (`metric_for_best_model`, `eval_strategy`).
        eval_names: the names of a dict of eval datasets; None (or `[""]`) for a single dataset.
        loss_only: whether evaluations compute the loss only.
    """
    if args.metric_for_best_model is None or args.eval_strategy == "no":
        return None
    key = metric_key(args.metric_for_best_model)
    names = [n for n in eval_names or [] if n]
    what = f"`metric_for_best_model`={args.metric_for_best_model!r} (looked up as {key!r})"
    prefix = "eval_"
    if names:
        prefixes = [f"eval_{name}_" for name in names]
        found = next((p for p in prefixes if key.startswith(p)), None)
        if found is None:
            choices = ", ".join(repr(f"{p}{key[len('eval_'):]}") for p in prefixes)
            return (f"{what} is never produced: with named eval datasets {names} every metric key carries the "
                    f"dataset's name (eval_<name>_<metric>). Set `metric_for_best_model` to one of {choices}.")
        prefix = found
    metric = key[len(prefix):]
    if loss_only and metric not in LOSS_ONLY_KEYS:
        reason = "prediction_loss_only=True" if args.prediction_loss_only else "no compute_metrics is given"
        loss_key = f"{prefix}loss"
        return (f"{what} is never produced: {reason}, so evaluations compute only {loss_key!r} and runtime keys. "
                f"Pass a compute_metrics that returns {metric!r}, or set `metric_for_best_model` to {loss_key!r}.")
    return None


def unreachable_best_checkpoint(args: TrainingArguments, plan: TrainingPlan) -> str | None:
    """The error when `load_best_model_at_end` can never load the best evaluation's checkpoint, else None.

    HF checks `save_steps % eval_steps` on the *given* values (TA:1748-1774), so ratios such as 0.1 / 0.2 pass; they
    are then rounded up against `max_steps` separately (`ceil(ratio * max_steps)`) and may stop being multiples
    (0.1 / 0.2 of 105 updates: 11 / 21). Evaluations then mostly fall on steps without a checkpoint, so
    `best_model_checkpoint` lags or stays None and the best model is silently not loaded (the rounding is
    `TrainerState.compute_steps`, CB:156-167).
    """
    if not (args.load_best_model_at_end and args.eval_strategy == "steps" and args.save_strategy == "steps"):
        return None
    eval_steps, save_steps = plan.eval_steps, plan.save_steps
    if eval_steps <= 0 or save_steps <= 0 or int(save_steps) % int(eval_steps) == 0:
        return None
    return (
        f"load_best_model_at_end=True: eval_steps={args.eval_steps} and save_steps={args.save_steps} resolve to "
        f"{int(eval_steps)} and {int(save_steps)} updates for max_steps={plan.max_steps}; {int(save_steps)} is not a "
        f"multiple of {int(eval_steps)}, so evaluations would happen at steps without a checkpoint and the best model "
        "could not be loaded. Use absolute steps, or ratios that resolve to multiples for this max_steps."
    )


# ----- resuming -----
class RecordedIntervals(Protocol):
    """What a checkpoint's `trainer_state.json` recorded of the run's intervals (a `transformers.TrainerState`)."""

    @property
    def logging_steps(self) -> float | None: ...

    @property
    def eval_steps(self) -> float | None: ...

    @property
    def save_steps(self) -> float | None: ...

    @property
    def train_batch_size(self) -> int | None: ...


def resume_intervals(plan: TrainingPlan, recorded: RecordedIntervals, batch_size: int
                     ) -> tuple[TrainingPlan, list[str]]:
    """The plan of a resumed run and what differs from the checkpoint's recorded settings.

    HF keeps the checkpoint's intervals (the loaded `TrainerState` drives them, T:1694-1710) and warns about the
    arguments that differ (`compare_trainer_and_checkpoint_args`, TU:1133-1169): the lines of that warning are
    returned ([]: nothing differs).

    Args:
        plan: this run's plan, from its arguments.
        recorded: the checkpoint's `TrainerState`.
        batch_size: this run's `per_device_train_batch_size`.
    """
    ours = {"logging_steps": plan.logging_steps, "eval_steps": plan.eval_steps, "save_steps": plan.save_steps}
    theirs = {"logging_steps": recorded.logging_steps, "eval_steps": recorded.eval_steps,
              "save_steps": recorded.save_steps}
    changed = [f"{name}: {ours[name]} (from args) != {theirs[name]} (from trainer_state.json)"
               for name in ours if theirs[name] is not None and ours[name] != theirs[name]]
    if recorded.train_batch_size is not None and recorded.train_batch_size != batch_size:
        changed.append(f"per_device_train_batch_size: {batch_size} (from args) != {recorded.train_batch_size} "
                       "(from trainer_state.json)")
    kept = {name: value if value is not None else ours[name] for name, value in theirs.items()}
    resumed = dataclasses.replace(plan, logging_steps=kept["logging_steps"], eval_steps=kept["eval_steps"],
                                  save_steps=kept["save_steps"])
    return resumed, changed
