"""`HFEarlyStopping`: `transformers.EarlyStoppingCallback` as a Lightning callback, with its state in checkpoints.

Semantics of HF's callback (`EarlyStoppingCallback`, CB:711-784):
- patience is counted in *evaluations*: every evaluation (each eval dataset of it, a manual `evaluate()` too) whose
  `eval_<metric_for_best_model>` is not an improvement adds one; an improvement resets the count to 0;
- an improvement is a value strictly better than `state.best_metric` (the best *before* this evaluation, per
  `greater_is_better`) by more than `early_stopping_threshold`, or any value while there is no best yet;
- at `patience` the flow's `control.should_training_stop` is set, so the run ends exactly as HF's does (the save
  of that step, `on_epoch_end`, the summary, best-model loading);
- `metric_for_best_model` is required and evaluation must be on: a `ValueError` at the start of `fit` otherwise.

It needs `HFTrainerFlow` among the trainer's callbacks: it is an `hf_lightning.contracts.HFEvaluationListener`, whose
`on_hf_evaluate` the flow calls after each evaluation.
Its state (`{"patience_counter": n}`) is saved by Lightning with the callback states of a checkpoint and restored on
resume (`state_dict` / `load_state_dict`), so patience does not restart after a resume.
`transformers.EarlyStoppingCallback` itself also works unchanged through the HF callback bridge.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from hf_lightning._lightning_compat import callbacks_of
from hf_lightning.contracts import HFFlowView
from hf_lightning.flow.flow import HFTrainerFlow
from hf_lightning.plan import best_rule

__all__ = ["HFEarlyStopping", "is_improvement"]


def is_improvement(value: float, best: float | None, greater_is_better: bool, threshold: float) -> bool:
    """HF's rule: no best yet, or strictly better than `best` by more than `threshold`."""
    if best is None:
        return True
    better = np.greater if greater_is_better else np.less
    return bool(better(value, best)) and abs(value - best) > threshold


class HFEarlyStopping(Callback):
    """Stops training after `early_stopping_patience` evaluations without improvement of `metric_for_best_model`.

    Args:
        early_stopping_patience: evaluations without improvement before stopping (>= 1).
        early_stopping_threshold: how much better than the best a value must be to count as an improvement.

    Raises:
        ValueError: a patience below 1 or a negative threshold; at `fit`, no `metric_for_best_model`, evaluation
            switched off (`eval_strategy="no"`), or no `HFTrainerFlow` among the callbacks.

    Example::

        args = TrainingArguments(eval_strategy="steps", eval_steps=50, metric_for_best_model="accuracy")
        pl.Trainer(callbacks=[HFTrainerFlow(args), HFEarlyStopping(3, 0.001)], ...)
        # or: hf_lightning.Trainer(..., callbacks=[HFEarlyStopping(3)])
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float = 0.0) -> None:
        if not isinstance(early_stopping_patience, int) or early_stopping_patience < 1:
            raise ValueError(f"`early_stopping_patience` must be an integer >= 1, got {early_stopping_patience!r}.")
        if early_stopping_threshold < 0:
            raise ValueError(f"`early_stopping_threshold` must be >= 0, got {early_stopping_threshold!r}.")
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = float(early_stopping_threshold)
        self.patience_counter = 0

    @property
    @override
    def state_key(self) -> str:
        """Distinct per settings, so two instances keep their own state in a checkpoint (Lightning's convention)."""
        return self._generate_state_key(early_stopping_patience=self.early_stopping_patience,
                                        early_stopping_threshold=self.early_stopping_threshold)

    @staticmethod
    def _flow(trainer: pl.Trainer) -> HFTrainerFlow:
        for callback in callbacks_of(trainer):
            if isinstance(callback, HFTrainerFlow):
                return callback
        raise ValueError(
            "HFEarlyStopping needs the `HFTrainerFlow` callback (it runs the evaluations and reads "
            "`metric_for_best_model`); add it to the Lightning Trainer's callbacks or use `hf_lightning.Trainer`."
        )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """HF's `on_train_begin` checks, as a clear `ValueError` instead of an `AssertionError`."""
        args = self._flow(trainer).args
        if args.metric_for_best_model is None:
            raise ValueError(
                "HFEarlyStopping requires `metric_for_best_model` (got None): set it in TrainingArguments to the "
                "metric to watch, e.g. metric_for_best_model='loss' or 'accuracy'."
            )
        if args.eval_strategy == "no":
            raise ValueError(
                "HFEarlyStopping requires evaluations during training (got eval_strategy='no'): set "
                "eval_strategy to 'steps' or 'epoch'."
            )
        if not args.load_best_model_at_end:
            warnings.warn("Using HFEarlyStopping without load_best_model_at_end=True: once training stops, the "
                          "model is the last one, not the best.", UserWarning, stacklevel=2)

    def on_hf_evaluate(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, flow: HFFlowView, metrics: dict[str, Any]
    ) -> None:
        """Called by `HFTrainerFlow` after each evaluation (per eval dataset), before the best metric is updated."""
        rule = best_rule(flow.args)
        key = rule.key
        if key is None:
            return
        value = metrics.get(key)
        if value is None:
            warnings.warn(f"HFEarlyStopping: the metric {key!r} is not in the evaluation metrics {sorted(metrics)}; "
                          "early stopping is skipped for this evaluation.", UserWarning, stacklevel=2)
            return
        if is_improvement(value, flow.state.best_metric, rule.greater_is_better, self.early_stopping_threshold):
            self.patience_counter = 0
        else:
            self.patience_counter += 1
        if self.patience_counter >= self.early_stopping_patience:
            flow.control.should_training_stop = True

    @override
    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able dict: the counter and the settings it was counted with."""
        return {"patience_counter": self.patience_counter, "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the counter (the settings of this instance win, as for HF's `restore_callback_states`)."""
        self.patience_counter = int(state_dict.get("patience_counter", 0))
