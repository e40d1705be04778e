"""The `transformers.Trainer` loop methods of `hf_lightning.Trainer` (`log`, `_evaluate`, `_maybe_log_save_evaluate`,
`_save_checkpoint`, `_set_signature_columns_if_needed`, `floating_point_ops`, `_load_from_checkpoint`,
`_load_best_model`), and the loop's attributes (`state`, `control`, `callback_handler`, `is_in_train`,
`model_wrapped`, `accelerator`).

`HFTrainerFlow` calls a subclass's override of these methods where HF's loop calls them (`HFLoopSteps`, given the
trainer as its owner); each base method here calls the flow's built-in (`flow.steps`), so `super()` reaches it, and
the flow runs the built-in directly when a method is not overridden.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from torch import nn
from transformers import TrainerControl, TrainerState

from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint.restore import CheckpointRestorer, load_weights
from hf_lightning.checkpoint.weight_files import weights_file
from hf_lightning.data.collate import signature_columns
from hf_lightning.flow.flow import HFTrainerFlow
from hf_lightning.flow.hf_callbacks import HFCallbackHandler
from hf_lightning.module.module import TransformerModule
from hf_lightning.trainer.accelerator import LightningAccelerator

__all__ = ["LoopHooks"]


class LoopHooks:
    """HF's loop methods and attributes (base implementations calling `self.flow`)."""

    flow: HFTrainerFlow
    module: TransformerModule
    model: nn.Module
    lightning_trainer: pl.Trainer | None = None  # until the first run builds one (set again in `__init__`)
    args: TrainingArguments
    evaluate: Callable[..., dict[str, float]]  # the facade's `evaluate`
    is_in_train: bool = False
    """HF's `is_in_train`: True while `train()` runs (also inside the evaluations it makes)."""

    @property
    def state(self) -> TrainerState:
        """HF's `TrainerState`: `global_step`, `epoch`, `log_history`, `best_metric`, `best_model_checkpoint`..."""
        return self.flow.state

    @state.setter
    def state(self, state: TrainerState) -> None:
        if "flow" in vars(self):  # before `Trainer.__init__`: its own value replaces it, as in HF
            self.flow.state = state

    @property
    def control(self) -> TrainerControl:
        """HF's `TrainerControl`: the flags the callbacks set, read where HF reads them."""
        return self.flow.control

    @control.setter
    def control(self, control: TrainerControl) -> None:
        if "flow" in vars(self):
            self.flow.control = control

    @property
    def callback_handler(self) -> HFCallbackHandler:
        """HF's `callback_handler`: `.callbacks` (the HF callbacks, HF's progress / printer callback last), and the
        `model`, `optimizer`, `lr_scheduler`, `train_dataloader`, `eval_dataloader` passed to them."""
        return self.flow.handler

    @property
    def model_wrapped(self) -> nn.Module:
        """HF's `model_wrapped`: the compiled model when compiling (`torch_compile`), else the model itself. (Lightning
        wraps the LightningModule, not the model, in DDP / FSDP: that wrapper is `lightning_trainer.strategy.model`;
        see README "Subclassing the Trainer".)"""
        return self.module.model_wrapped

    @cached_property
    def accelerator(self) -> LightningAccelerator:
        """The accelerate `Accelerator` members HF code calls (`backward`, `unwrap_model`, `gather`, ...), built once
        (it reads the running Lightning trainer and module at each call)."""
        return LightningAccelerator(self)

    @property
    def is_deepspeed_enabled(self) -> bool:
        """HF's `is_deepspeed_enabled`: whether the run's Lightning strategy is DeepSpeed (`args.deepspeed`, or a
        DeepSpeed strategy in `lightning_kwargs`)."""
        return self.accelerator.strategy_kind()[0] == "deepspeed"

    @property
    def is_fsdp_enabled(self) -> bool:
        """HF's `is_fsdp_enabled`: whether the run's Lightning strategy is FSDP1 or FSDP2 (`args.fsdp`, or an FSDP /
        ModelParallel strategy in `lightning_kwargs`)."""
        return self.accelerator.strategy_kind()[0] == "fsdp"

    _signature_columns: list[str] | None = None
    """HF's `_signature_columns`: the columns `remove_unused_columns` keeps; None until the first loader is built,
    which calls `_set_signature_columns_if_needed` (a subclass may override it, or set the list, as TRL's does)."""

    def _set_signature_columns_if_needed(self) -> None:
        """HF's `_set_signature_columns_if_needed`: when `_signature_columns` is None, set it to the model's `forward`
        parameters (inside PEFT / compile wrappers), `label`, `label_ids` and the label names."""
        if self._signature_columns is None:
            self._signature_columns = signature_columns(self.model, list(self.module.label_names))

    @property
    def _globalstep_last_logged(self) -> int:
        """HF's private counter read by `_maybe_log_save_evaluate` overrides: the step of the last loss log."""
        return self.flow.loss.last_logged_step

    @property
    def current_flos(self) -> float:
        """HF's FLOPs counted since they were last stored in `state.total_flos`."""
        return self.flow.flos.current

    # ----- the loop's methods -----
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """HF's `log`: add `epoch`, append to `state.log_history`, call the callbacks' `on_log`, write to loggers."""
        self.flow.steps.record_log(self.lightning_trainer, logs, start_time)

    def _maybe_log_save_evaluate(
        self, tr_loss: Any, grad_norm: Any, model: nn.Module, trial: Any, epoch: float,
        ignore_keys_for_eval: list[str] | None, start_time: float, learning_rate: float | None = None,
    ) -> None:
        """HF's `_maybe_log_save_evaluate` after every update: log if `control.should_log`, evaluate if
        `should_evaluate`, save if `should_save` (`tr_loss` is the running loss sum since the last log)."""
        self.flow.steps.log_save_evaluate_now(grad_norm, learning_rate, tr_loss)

    def _evaluate(self, trial: Any, ignore_keys_for_eval: list[str] | None, skip_scheduler: bool = False
                  ) -> dict[str, float]:
        """HF's `_evaluate` during `train()`: `self.evaluate(ignore_keys=...)`, then a plateau scheduler's step."""
        metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        if not skip_scheduler:
            self.flow.steps.step_plateau_scheduler(metrics)
        return metrics

    def _get_output_dir(self, trial: Any) -> str:
        """HF's `_get_output_dir`: where this run's checkpoints go (HF's JIT checkpoint manager calls it):
        `args.output_dir`, which during a `hyperparameter_search` trial already is the trial's folder
        (`hp_name(trial)`, else `run-<trial number>`, set by `trainer/hp_search.py`), so `trial` changes nothing."""
        return self.args.resolved_output_dir

    def _load_callback_state(self) -> None:
        """HF's `_load_callback_state`: with `restore_callback_states_from_checkpoint`, the callbacks (and
        `control`) stored in `self.state.stateful_callbacks` rebuilt in `callback_handler`, as a resume does."""
        if not self.args.restore_callback_states_from_checkpoint:
            return
        self.control = CheckpointRestorer.restore_hf_callbacks(self.callback_handler, self.control, self.state)

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        """HF's `_save_checkpoint` at every checkpoint save during `train()`: `checkpoint-<global_step>` with the
        model files (through `save_model` when overridden), optimizer, scheduler, RNG and trainer state, written
        crash-safe with its manifest, then the best pointer and rotation (`model` and `trial` are HF's; the flow's
        model is what is saved).

        Raises:
            RuntimeError: called outside `train()`.
        """
        self.flow.steps.save_checkpoint_now()

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """HF's `_load_from_checkpoint`: the weights of a checkpoint folder into `model` (default `self.model`; the
        sharded model under FSDP, whose full weights are scattered), shapes checked first; a PEFT adapter into the
        PEFT model. Called at every resume (after the folder is verified) and by a `_load_best_model` override.

        Raises:
            ValueError: the folder has no weights file (HF's words), or weights of another model (named).
        """
        weights = weights_file(Path(resume_from_checkpoint))
        if weights is None:
            raise ValueError(f"Can't find a valid checkpoint at {resume_from_checkpoint}")
        trainer = self.lightning_trainer
        load_weights(self.module.model if model is None else model, weights,
                     strategy=trainer.strategy if trainer is not None else None)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """HF's `_load_optimizer_and_scheduler`, called once per `train()` with the resumed folder (None for a fresh
        run): the optimizer, scheduler and scaler states are restored from it before this call
        (`checkpoint/restore.py`), so the built-in has nothing left to do; an override (TRL's GRPO / RLOO) reads its
        own files there after calling it."""

    def _load_best_model(self) -> None:
        """HF's `_load_best_model`: the best checkpoint's weights (`state.best_model_checkpoint`, verified before
        this call) into the model, at the end of `train()` with `load_best_model_at_end`."""
        self.flow.steps.load_best_now()

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """HF's `floating_point_ops`: `6 * tokens * non-embedding parameters` of one micro-batch (0 if unknown)."""
        return int(self.flow.flos.of(self.model, inputs))
