"""Best-model tracking: HF's best metric, `ReduceLROnPlateau` stepping, and `load_best_model_at_end`.

- `update` is `Trainer._determine_best_metric` (T:3432-3468): the error listing available metrics; the rules (which
  metric, which direction, whether `best_global_step` moves) are the plan's (`plan.BestRule`, `plan.SavePolicy`).
- `step_plateau_scheduler` steps a `ReduceLROnPlateau` on the best-model metric after a training-time evaluation.
- `load_best` loads the best checkpoint's weights at the end of training.

Where the best checkpoint's folder is recorded (`state.best_model_checkpoint`) at a save: `write.py`.
Rotation never deletes it: `checkpoint/rotate.py`.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch import nn
from transformers import TrainerState

from hf_lightning.checkpoint.restore import load_weights
from hf_lightning.checkpoint.sharded import load_engine_state
from hf_lightning.checkpoint.verify import checkpoint_error, checkpoint_problems
from hf_lightning.checkpoint.weight_files import ADAPTER_WEIGHT_FILES, WEIGHT_FILES, weights_file
from hf_lightning.flow.messages import logger
from hf_lightning.parallel.runtime import steps_on_metrics
from hf_lightning.plan import BestRule, SavePolicy, is_better

__all__ = ["BestModelTracker"]

class BestModelTracker:
    """HF's best-metric bookkeeping for `HFTrainerFlow`.

    Args:
        rule: which metric is the best-model metric and which direction is better (`plan.best_rule`).
        policy: the run's save policy (`best_global_step` moves only when its saves track it).
    """

    def __init__(self, rule: BestRule, policy: SavePolicy) -> None:
        self.rule = rule
        self.policy = policy

    def update(self, state: TrainerState, metrics: dict[str, Any]) -> bool:
        """`_determine_best_metric`: update `state.best_metric` / `best_global_step`; True on a strictly better value.

        As HF, the first comparison is against -inf / +inf, so a NaN metric is never a best.
        """
        key = self.rule.key
        if key is None:
            return False
        if key not in metrics:
            raise KeyError(
                f"The `metric_for_best_model` training argument is set to '{key}', which is not found in the "
                f"evaluation metrics. The available evaluation metrics are: {list(metrics.keys())}. Consider "
                "changing the `metric_for_best_model` via the TrainingArguments."
            )
        value = metrics[key]
        if state.best_metric is None:
            state.best_metric = float("-inf") if self.rule.greater_is_better else float("inf")
        if not is_better(value, state.best_metric, self.rule.greater_is_better):
            return False
        state.best_metric = value
        if self.policy.tracks_best_step:
            state.best_global_step = state.global_step
        return True

    def step_plateau_scheduler(self, trainer: pl.Trainer, metrics: dict[str, Any]) -> None:
        """`ReduceLROnPlateau` and `GreedyLR` step on the best-model metric after each training-time evaluation
        (T:3322-3339; `steps_on_metrics`)."""
        for config in trainer.lr_scheduler_configs:
            if steps_on_metrics(config.scheduler):
                key = self.rule.scheduler_key
                if key not in metrics:
                    raise KeyError(f"The `metric_for_best_model` training argument is set to '{key}', which is not "
                                   f"found in the evaluation metrics ({type(config.scheduler).__name__} steps on "
                                   f"it): {list(metrics)}.")
                config.scheduler.step(metrics[key])

    def load_best(self, model: nn.Module, state: TrainerState, strategy: pl.strategies.Strategy | None = None
                  ) -> None:
        """`load_best_model_at_end` (T:2009-2011, 2288-2361): the best checkpoint's weights into `model` (sharded by
        `strategy`, if any: FSDP, DeepSpeed; under DeepSpeed the engine's checkpoint of that folder, as HF), once the
        folder is verified (`checkpoint/verify.py`).

        Raises:
            DamagedCheckpointError: a file of the best checkpoint is damaged or altered since its save (named, with
                the previous good checkpoint).
        """
        if self.best_to_load(state) is not None:
            self.load_best_weights(model, state, strategy)

    def best_to_load(self, state: TrainerState) -> str | None:
        """The verified best checkpoint folder when `load_best_model_at_end` loads one now (HF: with the option and
        a `best_model_checkpoint`, T:2024-2025), else None.

        Raises:
            DamagedCheckpointError: a file of the best checkpoint is damaged or altered since its save.
        """
        folder = state.best_model_checkpoint
        if not self.rule.load_at_end or folder is None:
            return None
        problems = checkpoint_problems(folder)
        if problems:
            raise checkpoint_error(folder, problems, what="load_best_model_at_end")
        return str(folder)

    def load_best_weights(self, model: nn.Module, state: TrainerState, strategy: pl.strategies.Strategy | None = None
                          ) -> None:
        """HF's `_load_best_model` body: the weights of `state.best_model_checkpoint` (verified by `best_to_load`)
        into `model`.

        Raises:
            ValueError: the state names no best checkpoint.
        """
        folder = state.best_model_checkpoint
        if folder is None:
            raise ValueError("load_best_model_at_end: no best checkpoint recorded yet (state.best_model_checkpoint "
                             "is None)")
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
