"""`HFTrainerFlow`: the HF Trainer's log / evaluate / save cadence and logged values, as one Lightning callback.

Per optimizer update (= one Lightning training batch, see `TransformerDataModule`) it reproduces
`Trainer._inner_training_loop` + `_maybe_log_save_evaluate` (T:1887-2014, 2230-2278):

    on_step_end flags (schedule.step_end_flags + HF callbacks) -> log -> evaluate -> save
    [last batch of the epoch] on_epoch_end flags -> log -> evaluate -> save

Evaluation runs inside Lightning's own validation loop (so loggers and other callbacks see normal hooks): the
private `epoch_loop._should_check_val_fx` is replaced by "is an evaluation pending" (this is why lightning is
pinned to 2.6.*). What must follow an evaluation (best metric, save, the epoch-end pass) runs in
`on_validation_end`. Logged entries go to `state.log_history` in HF's format and to every Lightning logger at
`step=global_step` with HF's TensorBoard tag names.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from hf_lightning.args import TrainingArguments
from hf_lightning.callbacks.hf_bridge import HFCallbackHandler
from hf_lightning.callbacks.saving import CheckpointSaver
from hf_lightning.schedule import TrainingPlan, epoch_end_flags, epoch_progress, plan_training, step_end_flags

__all__ = ["HFTrainerFlow", "tensorboard_tag"]


def tensorboard_tag(key: str) -> str:
    """HF's `rewrite_logs`: `eval_x` -> `eval/x`, `test_x` -> `test/x`, anything else -> `train/x`."""
    for prefix in ("eval", "test"):
        if key.startswith(f"{prefix}_"):
            return f"{prefix}/{key[len(prefix) + 1:]}"
    return f"train/{key}"


class HFTrainerFlow(Callback):
    """Drives logging, evaluation and checkpointing at the HF Trainer's steps, and feeds HF `TrainerCallback`s.

    Args:
        args: the training arguments (strategies, intervals, output directory, best-model settings).
        callbacks: `transformers.TrainerCallback` instances or classes, called with HF's arguments.
        processing_class: tokenizer / processor passed to HF callbacks and saved with checkpoints.
    """

    def __init__(
        self, args: TrainingArguments, callbacks: list[Any] | None = None, processing_class: Any = None
    ) -> None:
        from transformers import TrainerControl, TrainerState

        self.args = args
        self.handler = HFCallbackHandler(callbacks)
        self.handler.processing_class = processing_class
        self.state = TrainerState()
        self.control = TrainerControl()
        self.saver = CheckpointSaver(args, processing_class)
        self.plan: TrainingPlan | None = None
        self.eval_pending = False
        self.last_eval_metrics: dict[str, Any] = {}
        self._pending_passes: list[str] = []
        self._tr_loss: torch.Tensor | None = None
        self._last_logged = 0
        self._initial_step = 0
        self._total_loss = 0.0
        self._micro_done = 0
        self._epoch_index = 0
        self._train_start = 0.0
        self.eval_prefix = "eval"

    @property
    def state_key(self) -> str:
        return "HFTrainerFlow"

    # ----- setup -----
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Fix the plan (max_steps, intervals) and hand Lightning its step budget before optimizers are built."""
        self.handler.model = getattr(pl_module, "model", pl_module)
        if stage != "fit":
            return
        datamodule = trainer.datamodule
        micro = datamodule.num_train_microbatches() if hasattr(datamodule, "num_train_microbatches") else None
        self.plan = plan_training(self.args, micro)
        trainer.fit_loop.epoch_loop.max_steps = self.plan.max_steps
        trainer.fit_loop.max_epochs = -1 if not self.plan.sized else self.plan.num_train_epochs
        epoch_loop = trainer.fit_loop.epoch_loop
        epoch_loop._should_check_val_fx = lambda data_fetcher: self.eval_pending  # type: ignore[method-assign]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """HF `on_train_begin` (after a fresh `TrainerState`), then `eval_on_start`."""
        from transformers import TrainerState

        assert self.plan is not None
        self.state = TrainerState(
            max_steps=self.plan.max_steps,
            num_train_epochs=self.plan.num_train_epochs,
            logging_steps=self.plan.logging_steps,
            eval_steps=self.plan.eval_steps,
            save_steps=self.plan.save_steps,
            train_batch_size=self.args.per_device_train_batch_size,
            is_local_process_zero=trainer.local_rank == 0,
            is_world_process_zero=trainer.is_global_zero,
        )
        self.state.global_step = self._initial_step = self._last_logged = trainer.global_step
        self._tr_loss = torch.zeros((), device=pl_module.device)
        self._total_loss = 0.0
        self._train_start = time.time()
        self.handler.optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.handler.lr_scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
        self.control = self.handler.call("on_train_begin", self.args, self.state, self.control)
        if self.args.eval_on_start:
            self._run_manual_validation(trainer)

    # ----- per update -----
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_index = trainer.current_epoch
        self._micro_done = 0
        self.control = self.handler.call("on_epoch_begin", self.args, self.state, self.control)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        self.control = self.handler.call("on_step_begin", self.args, self.state, self.control)

    def on_hf_event(self, trainer: pl.Trainer, pl_module: pl.LightningModule, name: str) -> None:
        """Step-internal events raised by `TransformerModule` (on_substep_end, on_pre/on_optimizer_step)."""
        self.control = self.handler.call(name, self.args, self.state, self.control)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        assert self.plan is not None and self._tr_loss is not None
        self._micro_done += 1 if isinstance(batch, dict) else len(batch)
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if self.args.logging_nan_inf_filter:
            # HF replaces a non-finite loss by the window's running mean (T:1911-1917), without a host sync here.
            since = 1 + self.state.global_step - self._last_logged
            loss = torch.where(torch.isfinite(loss), loss, self._tr_loss / since)
        self._tr_loss = self._tr_loss + loss.detach()
        self.state.global_step = trainer.global_step
        self.state.epoch = epoch_progress(self._epoch_index, self._micro_done, self.plan.microbatches_per_epoch)
        self._count_flos(pl_module, batch)
        flags = step_end_flags(self.state.global_step, self.args, self.plan)
        self._merge(flags)
        self.control = self.handler.call("on_step_end", self.args, self.state, self.control)
        last_in_epoch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or (
            self.state.global_step >= self.plan.max_steps
        )
        if self.control.should_training_stop or self.control.should_epoch_stop:
            last_in_epoch = True
            trainer.should_stop = trainer.should_stop or self.control.should_training_stop
            if self.control.should_epoch_stop and not self.control.should_training_stop:
                pl_module.epoch_stop_requested = True
        self._pending_passes = ["step", "epoch"] if last_in_epoch else ["step"]
        self._advance(trainer, pl_module)

    def _merge(self, flags: Any) -> None:
        for name in ("should_log", "should_evaluate", "should_save", "should_training_stop"):
            if getattr(flags, name):
                setattr(self.control, name, True)

    def _advance(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Run pending log/eval/save passes until one waits for Lightning's validation loop."""
        while self._pending_passes:
            kind = self._pending_passes[0]
            if kind == "epoch":
                self._merge(epoch_end_flags(self.state.epoch, self.args))
                self.control = self.handler.call("on_epoch_end", self.args, self.state, self.control)
                self._pending_passes[0] = "epoch-body"
            if self.control.should_log and self.state.global_step > self._last_logged:
                self._log_training(trainer, pl_module)
            if self.control.should_evaluate:
                if self.eval_pending:  # a second evaluation in the same update: run it now, by hand
                    self._run_manual_validation(trainer)
                else:
                    self.eval_pending = True
                    return  # Lightning runs validation next; on_validation_end resumes here
            self._pending_passes.pop(0)
            if self.control.should_save:
                self._save(trainer, pl_module)

    # ----- logging -----
    def record_log(self, trainer: pl.Trainer, logs: dict[str, Any]) -> None:
        """HF `Trainer.log` (not `log`: Lightning overwrites a callback's `log` with the module's): add `epoch`, append to `log_history` with `step`, call `on_log`, write to loggers."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.handler.call("on_log", self.args, self.state, self.control, logs=logs)
        numeric = {tensorboard_tag(k): v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for logger in trainer.loggers:
            logger.log_metrics(numeric, step=self.state.global_step)

    def _log_training(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The training-loss entry (T:2242-2266): window mean over processes, grad norm, LR of the update done."""
        assert self._tr_loss is not None
        window_loss = trainer.strategy.reduce(self._tr_loss, reduce_op="mean")
        loss = float(window_loss.item()) / (self.state.global_step - self._last_logged)
        self._total_loss += float(window_loss.item())
        self._tr_loss = torch.zeros_like(self._tr_loss)
        logs: dict[str, Any] = {"loss": loss}
        grad_norm = getattr(pl_module, "last_grad_norm", None)
        if grad_norm is not None:
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            logs["grad_norm"] = float(grad_norm.item()) if torch.is_tensor(grad_norm) else float(grad_norm)
        lr = getattr(pl_module, "last_learning_rate", None)
        if lr is not None:
            logs["learning_rate"] = lr
        self._last_logged = self.state.global_step
        self.record_log(trainer, logs)

    def _count_flos(self, pl_module: pl.LightningModule, batch: Any) -> None:
        """HF's `floating_point_ops`: 6 * tokens * non-embedding parameters, per micro-batch (T:4216-4233)."""
        model = getattr(pl_module, "model", None)
        if model is None or not hasattr(model, "floating_point_ops"):
            return
        if not hasattr(self, "_n_params"):
            self._n_params = model.num_parameters(exclude_embeddings=True)
        for micro in [batch] if isinstance(batch, dict) else batch:
            ids = micro.get(getattr(model, "main_input_name", "input_ids")) if isinstance(micro, dict) else None
            if torch.is_tensor(ids):
                self.state.total_flos += 6 * ids.numel() * self._n_params

    # ----- evaluation -----
    def _run_manual_validation(self, trainer: pl.Trainer) -> None:
        """Run Lightning's validation loop from a hook (eval_on_start, a second evaluation in one update)."""
        loop = trainer.fit_loop.epoch_loop.val_loop
        first = trainer._logger_connector._first_loop_iter
        trainer.validating = True
        loop.run()
        trainer.training = True
        trainer._logger_connector._first_loop_iter = first

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Finish the evaluation: one log entry and `on_evaluate` per dataset, best metric, then the pending save."""
        metrics = self.collect_eval_metrics(trainer, pl_module, self.eval_prefix)
        self.last_eval_metrics = metrics
        if trainer.state.fn != "fit":
            return
        if self.state.global_step == 0 and not self._pending_passes:  # eval_on_start: no best-metric update
            return
        self.saver.update_best(self.state, metrics)
        self.saver.step_plateau_scheduler(trainer, metrics)
        if self.eval_pending:
            self.eval_pending = False
            self.control.should_evaluate = False
            self._pending_passes.pop(0)
            if self.control.should_save:
                self._save(trainer, pl_module)
            self._advance(trainer, pl_module)

    def collect_eval_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule, prefix: str) -> dict[str, Any]:
        """Finish every eval dataloader's accumulator, log each as its own entry, call `on_evaluate`."""
        names = getattr(trainer.datamodule, "eval_dataset_names", None) or [""]
        datasets = getattr(trainer.datamodule, "eval_datasets", None) or {}
        merged: dict[str, Any] = {}
        for idx, acc in sorted(getattr(pl_module, "eval_accumulators", {}).items()):
            name = names[idx] if idx < len(names) else str(idx)
            key_prefix = f"{prefix}_{name}" if name else prefix
            dataset = datasets.get(name)
            sized = dataset is not None and hasattr(dataset, "__len__")
            result = acc.finish(key_prefix, num_samples=len(dataset) if sized else None)
            metrics = dict(result.metrics)
            self.record_log(trainer, metrics)  # adds "epoch" into the same dict, as HF
            self.control = self.handler.call("on_evaluate", self.args, self.state, self.control, metrics=metrics)
            merged.update(metrics)
        return merged

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._predict_module = pl_module

    def last_prediction(self, prefix: str, num_samples: int | None) -> Any:
        """Finish the last `predict` run: HF's `PredictionOutput` fields; fires `on_predict` (no log entry)."""
        accumulators = self._predict_module.eval_accumulators
        result = accumulators[0].finish(prefix, num_samples=num_samples)
        self.control = self.handler.call("on_predict", self.args, self.state, self.control, metrics=result.metrics)
        return result

    # ----- saving -----
    def _save(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.saver.save(trainer, pl_module, self.state)
        self.control = self.handler.call("on_save", self.args, self.state, self.control)

    # ----- end -----
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The train summary entry (T:1993-2014), best-model loading, rotation cleanup, then HF `on_train_end`."""
        from transformers.trainer_utils import speed_metrics

        assert self.plan is not None and self._tr_loss is not None
        window = float(trainer.strategy.reduce(self._tr_loss, reduce_op="mean").item())
        steps = self.state.global_step - self._initial_step
        train_loss = (self._total_loss + window) / max(steps, 1)
        datamodule = trainer.datamodule
        dataset = getattr(datamodule, "train_dataset", None)
        world = trainer.world_size
        total_bs = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps * world
        if self.args.max_steps > 0 or dataset is None or not hasattr(dataset, "__len__"):
            num_samples = self.plan.max_steps * total_bs
        else:
            num_samples = len(dataset) * self.args.num_train_epochs
        metrics = speed_metrics(
            "train", self._train_start, num_samples=num_samples * steps / self.plan.max_steps, num_steps=steps
        )
        metrics["total_flos"] = self.state.total_flos
        metrics["train_loss"] = train_loss
        self.train_metrics = metrics
        self.record_log(trainer, metrics)
        self.saver.finish(trainer, pl_module, self.state)
        self.control = self.handler.call("on_train_end", self.args, self.state, self.control)

    def state_dict(self) -> dict[str, Any]:
        return {"log_history": list(self.state.log_history), "total_flos": self.state.total_flos}

