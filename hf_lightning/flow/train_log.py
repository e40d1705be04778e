"""The HF Trainer's logged values: the training-loss window, FLOPs, the train summary, logger tags.

- `TrainLossTracker` is the bookkeeping of `Trainer._tr_loss`, `_total_loss_scalar` and `_globalstep_last_logged`
  (T:1645-1650, 1919-1931, 2250-2270, 2005-2007): the per-update losses are summed on device, the NaN/Inf filter
  replaces a non-finite micro-batch loss by the running mean of the window, and at log time the sum is averaged over
  processes and divided by the number of updates since the last log. Two cases HF leaves silent get one
  warning each (the first time, naming the step): a window whose every micro-batch loss was NaN/Inf (its logged
  loss is the filter's 0.0), and updates without any label token (their loss is 0, they teach nothing). Without the
  filter a NaN window logs NaN and the next window starts from zero (HF's stays NaN forever: README "Differences").
- `FlopsCounter` is `Trainer.floating_point_ops` + `store_flos` (T:4213-4241): `6 * tokens * non-embedding
  parameters` per micro-batch, summed over processes when stored.
- `train_summary` is the final `train_*` entry of `_finalize_training` (T:2001-2022), in HF's key order.
- `tensorboard_tag` is `integrations.rewrite_logs`: the tag names HF's `TensorBoardCallback` writes.
- `UpdateReport` reads what an update reported through `training_step`'s output (`contracts.TrainingStepOutput`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import TrainerState
from transformers.trainer_utils import speed_metrics

from hf_lightning.flow.tokens_seen import main_input_name

__all__ = ["FlopsCounter", "TrainLossTracker", "UpdateReport", "tensorboard_tag", "train_summary"]


@dataclass(frozen=True)
class UpdateReport:
    """What one optimizer update reported through `training_step`'s output (`contracts.TrainingStepOutput`)."""

    micro_losses: torch.Tensor
    grad_norm: float | None = None
    learning_rate: float | None = None
    label_tokens: torch.Tensor | None = None

    @classmethod
    def from_outputs(cls, outputs: Any) -> UpdateReport:
        """Read a `TrainingStepOutput` dict, or a bare loss tensor (a module returning only its loss)."""
        if not isinstance(outputs, Mapping):
            return cls(torch.as_tensor(outputs))
        losses = outputs.get("micro_losses")
        grad_norm = outputs.get("grad_norm")
        if isinstance(grad_norm, DTensor):  # FSDP2: the norm of the whole model, not of this rank's shard
            grad_norm = grad_norm.full_tensor()
        return cls(
            micro_losses=torch.as_tensor(losses if losses is not None else outputs["loss"]),
            grad_norm=None if grad_norm is None else float(grad_norm),
            learning_rate=outputs.get("learning_rate"),
            label_tokens=outputs.get("label_tokens"),
        )


def tensorboard_tag(key: str) -> str:
    """HF's `rewrite_logs`: `eval_x` -> `eval/x`, `test_x` -> `test/x`, anything else -> `train/x`."""
    for prefix in ("eval", "test"):
        if key.startswith(f"{prefix}_"):
            return f"{prefix}/{key[len(prefix) + 1:]}"
    return f"train/{key}"


log = logging.getLogger(__name__)


def _mean_over_processes(strategy: Any, value: torch.Tensor) -> Any:
    """`nested_gather(value).mean()`: every process's value, averaged (a no-op on one process); a float for a
    scalar, a list for a vector."""
    if strategy is not None:
        value = strategy.reduce(value, reduce_op="mean")
    return value.tolist()


class TrainLossTracker:
    """The training loss between two logs, and the total over this `train()` call.

    Args:
        nan_inf_filter: `logging_nan_inf_filter`: replace a non-finite micro-batch loss by the window's running mean.
    """

    def __init__(self, nan_inf_filter: bool = True) -> None:
        self.nan_inf_filter = nan_inf_filter
        self.window = torch.zeros(())
        self.total = 0.0
        self.last_logged_step = 0
        self.initial_step = 0
        self.latest_loss: float | None = None
        # per window, on device: finite micro-batch losses, updates without label tokens
        self.finite = torch.zeros(())
        self.empty_updates = torch.zeros(())
        self.window_micro_batches = 0
        self.warned: set[str] = set()

    def start(self, device: torch.device, global_step: int) -> None:
        """Reset at the start of `train()` (T:1644-1649): nothing accumulated, `global_step` counts as logged."""
        self.window = torch.zeros((), device=device)
        self._reset_counts()
        self.total = 0.0
        self.last_logged_step = self.initial_step = global_step
        self.latest_loss = None

    def add(self, micro_losses: torch.Tensor, global_step_before: int, label_tokens: torch.Tensor | None = None
            ) -> None:
        """Add the micro-batch losses of one update, as `training_step` returned them (already GA-normalised).

        `global_step_before` is the step counter during the update (not yet incremented), as HF's filter uses it.
        `label_tokens`: the update's label-token count when the module computed one. Runs on device, without a host
        sync.
        """
        micro_losses = micro_losses.detach().reshape(-1).to(self.window.device, self.window.dtype)
        since = 1 + global_step_before - self.last_logged_step
        finite = torch.isfinite(micro_losses)
        for loss, ok in zip(micro_losses, finite):
            if self.nan_inf_filter:
                self.window = self.window + torch.where(ok, loss, self.window / since)
            else:
                self.window = self.window + loss
        self.finite = self.finite + finite.sum()
        if label_tokens is not None:
            self.empty_updates = self.empty_updates + (torch.as_tensor(label_tokens) == 0).to(self.window.device)
        self.window_micro_batches += len(micro_losses)

    def pop_log_value(self, strategy: Any, global_step: int) -> float:
        """The `loss` of a log entry: the window sum averaged over processes, per update since the last log."""
        dtype = self.window.dtype
        counts = torch.stack([self.window, self.finite.to(dtype), self.empty_updates.to(dtype)])
        window_sum, finite, empty = _mean_over_processes(strategy, counts)
        self.window = torch.zeros_like(self.window)
        loss = window_sum / (global_step - self.last_logged_step)
        self._warn_once(strategy, global_step, loss, no_finite=self.window_micro_batches > 0 and finite == 0,
                        empty_updates=empty > 0)
        self._reset_counts()
        self.total += window_sum
        self.last_logged_step = global_step
        self.latest_loss = loss
        return loss

    def _reset_counts(self) -> None:
        self.finite = torch.zeros((), device=self.window.device)
        self.empty_updates = torch.zeros((), device=self.window.device)
        self.window_micro_batches = 0

    def _warn_once(self, strategy: Any, step: int, loss: float, no_finite: bool, empty_updates: bool) -> None:
        """The two warnings, each the first time only, on the main process."""
        if strategy is not None and not strategy.is_global_zero:
            return
        since = f"steps {self.last_logged_step + 1}-{step}"
        if no_finite and self.nan_inf_filter and "nan" not in self.warned:
            self.warned.add("nan")
            log.warning("step %d: every training loss of the logging window (%s) was NaN or Inf; "
                        "logging_nan_inf_filter replaced them, so the logged loss is %s (HF does the same). The "
                        "model may have diverged (lower the learning rate, check fp16) or the batches had no label "
                        "token. Warned once.", step, since, loss)
        if empty_updates and "labels" not in self.warned:
            self.warned.add("labels")
            log.warning("step %d: an update in %s had no label token (every label -100): it adds 0 to the loss and "
                        "no gradient. Check the labels (truncation, padding, prompt masking). Warned once.",
                        step, since)

    def train_loss(self, strategy: Any, global_step: int) -> float:
        """`train_loss` of the summary: mean per-update loss over this call's updates (T:2005-2007).

        HF adds the open window of this process only (`_tr_loss.item()`); we average it over processes as well, so
        the value is the same on every rank (identical on one process).
        """
        self.total += _mean_over_processes(strategy, self.window)
        self.window = torch.zeros_like(self.window)
        self._reset_counts()
        return self.total / max(global_step - self.initial_step, 0.001)


class FlopsCounter:
    """`6 * tokens * non-embedding parameters` per micro-batch, as HF's `floating_point_ops` (0 for other models)."""

    def __init__(self) -> None:
        self.current = 0.0
        self._params: int | None = None

    def add_window(self, model: nn.Module, window: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Count the micro-batches of one update (`window` is one batch or a list of them)."""
        for micro in [window] if isinstance(window, Mapping) else window:
            self.current += self.of(model, micro)

    def of(self, model: Any, micro: Mapping[str, Any]) -> float:
        """HF's `floating_point_ops` of one micro-batch: `6 * tokens * non-embedding parameters` (0 without
        `num_parameters` or the main input). `model`: any object; a transformers model's `num_parameters` and
        `main_input_name` are read when it has them."""
        if model is None or not hasattr(model, "num_parameters") or not isinstance(micro, Mapping):
            return 0.0
        main_input = main_input_name(model)
        if main_input not in micro or not hasattr(micro[main_input], "numel"):
            return 0.0
        if self._params is None:
            self._params = int(model.num_parameters(exclude_embeddings=True))
        return float(6 * micro[main_input].numel() * self._params)

    def store(self, state: TrainerState, trainer: Any) -> None:
        """`store_flos`: move the FLOPs counted since the last store into `state.total_flos` (summed over processes)."""
        flos = self.current
        if trainer is not None and trainer.world_size > 1:
            total = torch.tensor(flos, dtype=torch.float64, device=trainer.strategy.root_device)
            flos = float(trainer.strategy.reduce(total, reduce_op="sum").item())
        state.total_flos += flos
        self.current = 0.0


def train_summary(
    start_time: float, num_train_samples: float, steps_this_call: int, max_steps: int, total_flos: float,
    train_loss: float,
) -> dict[str, Any]:
    """`train_runtime, train_samples_per_second, train_steps_per_second, total_flos, train_loss` (HF's order)."""
    metrics = speed_metrics(
        "train", start_time, num_samples=num_train_samples * steps_this_call / max(max_steps, 1),
        num_steps=steps_this_call,
    )
    metrics["total_flos"] = total_flos
    metrics["train_loss"] = train_loss
    return metrics
