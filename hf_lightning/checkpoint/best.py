"""Best-model tracking: HF's best metric, `ReduceLROnPlateau` stepping, and `load_best_model_at_end`.

- `update` is `Trainer._determine_best_metric` (T:3432-3468): strict comparison, `eval_` prefix rule, the error
  listing available metrics; `best_global_step` only moves for save strategies that write checkpoints.
- `step_plateau_scheduler` steps a `ReduceLROnPlateau` on the best-model metric after a training-time evaluation.
- `load_best` loads the best checkpoint's weights at the end of training.
- `unreachable_best_metric` refuses, before training, a `metric_for_best_model` that no evaluation can produce
  (HF finds out with a `KeyError` at the first evaluation, after training time is spent).

Where the best checkpoint's folder is recorded (`state.best_model_checkpoint`) at a save: `checkpoint_saver.py`.
Rotation never deletes it: `checkpoint/rotate.py`.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np

from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint.restore import load_weights
from hf_lightning.checkpoint.sharded import load_engine_state
from hf_lightning.checkpoint.verify import checkpoint_error, checkpoint_problems
from hf_lightning.checkpoint.weight_files import ADAPTER_WEIGHT_FILES, WEIGHT_FILES, weights_file
from hf_lightning.flow.messages import logger
from hf_lightning.parallel.runtime import steps_on_metrics

__all__ = ["BestModelTracker", "metric_key", "unreachable_best_metric"]

LOSS_ONLY_KEYS = ("loss", "runtime", "samples_per_second", "steps_per_second")
"""The metric names of an evaluation without `compute_metrics` (after the `eval_[<name>_]` prefix)."""


def metric_key(metric: str) -> str:
    """HF's lookup key: `eval_` is prepended unless already there (T:3441-3453)."""
    return metric if metric.startswith("eval_") else f"eval_{metric}"


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


class BestModelTracker:
    """HF's best-metric bookkeeping for `HFTrainerFlow`.

    Args:
        args: the training arguments (`metric_for_best_model`, `greater_is_better`, `load_best_model_at_end`).
    """

    def __init__(self, args: TrainingArguments) -> None:
        self.args = args

    def update(self, state: Any, metrics: dict[str, Any]) -> bool:
        """`_determine_best_metric`: update `state.best_metric` / `best_global_step`; True on a strictly better value.

        As HF, the first comparison is against -inf / +inf, so a NaN metric is never a best.
        """
        if self.args.metric_for_best_model is None:
            return False
        key = metric_key(self.args.metric_for_best_model)
        if key not in metrics:
            raise KeyError(
                f"The `metric_for_best_model` training argument is set to '{key}', which is not found in the "
                f"evaluation metrics. The available evaluation metrics are: {list(metrics.keys())}. Consider "
                "changing the `metric_for_best_model` via the TrainingArguments."
            )
        value = metrics[key]
        better = np.greater if self.args.greater_is_better else np.less
        if state.best_metric is None:
            state.best_metric = float("-inf") if self.args.greater_is_better else float("inf")
        if not better(value, state.best_metric):
            return False
        state.best_metric = value
        if self.args.save_strategy in ("steps", "epoch", "best"):
            state.best_global_step = state.global_step
        return True

    def step_plateau_scheduler(self, trainer: pl.Trainer, metrics: dict[str, Any]) -> None:
        """`ReduceLROnPlateau` and `GreedyLR` step on the best-model metric after each training-time evaluation
        (T:3322-3339; `steps_on_metrics`)."""
        for config in trainer.lr_scheduler_configs:
            if steps_on_metrics(config.scheduler):
                key = metric_key(self.args.metric_for_best_model or "loss")
                if key not in metrics:
                    raise KeyError(f"The `metric_for_best_model` training argument is set to '{key}', which is not "
                                   f"found in the evaluation metrics ({type(config.scheduler).__name__} steps on "
                                   f"it): {list(metrics)}.")
                config.scheduler.step(metrics[key])

    def load_best(self, model: Any, state: Any, strategy: Any = None) -> None:
        """`load_best_model_at_end` (T:2009-2011, 2288-2361): the best checkpoint's weights into `model` (sharded by
        `strategy`, if any: FSDP, DeepSpeed; under DeepSpeed the engine's checkpoint of that folder, as HF), once the
        folder is verified (`checkpoint/verify.py`).

        Raises:
            DamagedCheckpointError: a file of the best checkpoint is damaged or altered since its save (named, with
                the previous good checkpoint).
        """
        if self.best_to_load(state) is not None:
            self.load_best_weights(model, state, strategy)

    def best_to_load(self, state: Any) -> str | None:
        """The verified best checkpoint folder when `load_best_model_at_end` loads one now (HF: with the option and
        a `best_model_checkpoint`, T:2024-2025), else None.

        Raises:
            DamagedCheckpointError: a file of the best checkpoint is damaged or altered since its save.
        """
        folder = state.best_model_checkpoint
        if not self.args.load_best_model_at_end or folder is None:
            return None
        problems = checkpoint_problems(folder)
        if problems:
            raise checkpoint_error(folder, problems, what="load_best_model_at_end")
        return str(folder)

    def load_best_weights(self, model: Any, state: Any, strategy: Any = None) -> None:
        """HF's `_load_best_model` body: the weights of `state.best_model_checkpoint` (verified by `best_to_load`)
        into `model`."""
        folder = state.best_model_checkpoint
        logger.info(f"Loading best model from {folder} (score: {state.best_metric}).")  # T:3745
        if load_engine_state(strategy, folder):
            # DeepSpeed, as HF (`deepspeed_load_checkpoint`): the engine's checkpoint puts the best weights into every
            # rank's partitions and fp32 master weights (and the optimizer state with them)
            return
        weights = weights_file(folder)  # full weights, or a PEFT model's adapter
        if weights is None:
            raise FileNotFoundError(f"load_best_model_at_end: no weights file in {folder} (expected one of "
                                    f"{list(WEIGHT_FILES + ADAPTER_WEIGHT_FILES)}).")
        load_weights(model, weights, what="load_best_model_at_end", strategy=strategy)
