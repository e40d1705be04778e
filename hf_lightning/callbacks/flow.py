"""`HFTrainerFlow`: the HF Trainer's log / evaluate / save cadence and logged values, as one Lightning callback.

One Lightning training batch is one optimizer update (see `TransformerDataModule`). After each update, in
`on_train_batch_end`, the callback replays `Trainer._run_epoch` + `_maybe_log_save_evaluate` (T:1935-1991, 2230-2278):

    on_step_end (cadence.step_end_flags, then HF callbacks) -> log -> evaluate -> save
    [last update of the epoch, or a stop flag] on_epoch_end (cadence.epoch_end_flags, HF callbacks)
        -> log -> evaluate -> save

Evaluations run Lightning's own validation loop synchronously, right where HF evaluates, so several evaluations in
one update (a step pass and an epoch pass, or a flag set by a callback) run in HF's order, and other Lightning
callbacks see normal validation hooks. Lightning's own validation trigger (`epoch_loop._should_check_val_fx`, a
private hook of 2.6, hence the `lightning<2.7` pin) is switched off. `TrainerControl` flags set by HF callbacks are
honoured exactly where HF reads them. Logged entries go to `state.log_history` in HF's format and to every Lightning
logger at `step=global_step` with HF's TensorBoard tag names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from hf_lightning.args import TrainingArguments
from hf_lightning.callbacks.hf_bridge import HFCallbackHandler
from hf_lightning.callbacks.best_model import BestModelTracker
from hf_lightning.callbacks.checkpoint_saver import CheckpointSaver
from hf_lightning.callbacks.train_log import FlopsCounter, TrainLossTracker, tensorboard_tag, train_summary
from hf_lightning.cadence import TrainingPlan, epoch_end_flags, epoch_progress, plan_training, step_end_flags

__all__ = ["HFTrainerFlow", "tensorboard_tag"]


class HFTrainerFlow(Callback):
    """Drives logging, evaluation and checkpointing at the HF Trainer's steps, and feeds HF `TrainerCallback`s.

    Args:
        args: the training arguments (strategies, intervals, output directory, best-model settings).
        callbacks: `transformers.TrainerCallback` instances or classes, called with HF's arguments.
        processing_class: tokenizer / processor passed to HF callbacks and saved with checkpoints.

    Example::

        flow = HFTrainerFlow(TrainingArguments(eval_strategy="steps", eval_steps=50), [EarlyStoppingCallback(2)])
        lightning.Trainer(callbacks=[flow]).fit(TransformerModule(model, args), datamodule=dm)
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
        self.best = BestModelTracker(args)
        self.plan: TrainingPlan | None = None
        self.loss = TrainLossTracker(args.logging_nan_inf_filter)
        self.flos = FlopsCounter()
        self.last_eval_metrics: dict[str, Any] = {}
        self.eval_prefix = "eval"
        self._eval_finished: set[int] = set()
        self._eval_current = -1
        self._epoch_index = 0
        self._train_start = 0.0
        self.resume_from_checkpoint: str | bool | None = None
        """A checkpoint folder (or True: the latest in `output_dir`) to resume from at the next `fit`."""
        self._restorer: Any = None

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
        from hf_lightning.callbacks.best_model import unreachable_best_metric
        from hf_lightning.checkpointing.checks import unreachable_best_checkpoint

        plan = self.plan
        loss_only = self.args.prediction_loss_only or getattr(pl_module, "compute_metrics", None) is None
        problem = unreachable_best_checkpoint(self.args, plan.eval_steps, plan.save_steps, plan.max_steps) or \
            unreachable_best_metric(self.args, getattr(datamodule, "eval_dataset_names", None), loss_only)
        if problem:
            raise ValueError(problem)
        trainer.fit_loop.epoch_loop.max_steps = self.plan.max_steps
        trainer.fit_loop.max_epochs = self.plan.num_train_epochs if self.plan.sized else -1
        # Evaluations are started by this callback at HF's steps; Lightning's own trigger (every epoch by default,
        # counted in batches) is switched off. Private API of lightning 2.6 (pinned).
        trainer.fit_loop.epoch_loop._should_check_val_fx = lambda data_fetcher: False  # type: ignore[method-assign]

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Resume from `resume_from_checkpoint`, or refuse to overwrite another run's checkpoints (resume/load.py)."""
        from hf_lightning.resume.load import start_fit
        from hf_lightning.threads import warn_if_oversubscribed

        warn_if_oversubscribed(trainer)  # more torch threads than free cores: a warning with the number to set
        self._restorer = start_fit(self, trainer, pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A fresh `TrainerState` (T:1682-1689), HF `on_train_begin`, then `eval_on_start` (T:1655-1656)."""
        import time

        from transformers import TrainerState
        from transformers.trainer_callback import ExportableState

        assert self.plan is not None
        exportable = [cb for cb in [*self.handler.callbacks, self.control] if isinstance(cb, ExportableState)]
        self.state = TrainerState(
            max_steps=self.plan.max_steps,
            num_train_epochs=self.plan.num_train_epochs,
            logging_steps=self.plan.logging_steps,
            eval_steps=self.plan.eval_steps,
            save_steps=self.plan.save_steps,
            train_batch_size=self.args.per_device_train_batch_size,
            is_local_process_zero=trainer.local_rank == 0,
            is_world_process_zero=trainer.is_global_zero,
            stateful_callbacks=exportable,
        )
        self.state.global_step = trainer.global_step
        if self._restorer is not None:
            self._restorer.restore_trainer_state(self, trainer, self.plan.max_steps, self.plan.num_train_epochs)
        self.loss.start(pl_module.device, trainer.global_step)
        self.flos.current = 0.0
        self._train_start = time.time()
        self.handler.optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.handler.lr_scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
        self.handler.train_dataloader = trainer.train_dataloader
        self.control = self.handler.call("on_train_begin", self.args, self.state, self.control)
        if self.args.eval_on_start:
            # No plateau-scheduler step and no best-metric update for this one (T:1655-1656, 3294-3331).
            self._evaluate(trainer, pl_module, during_training=False)

    # ----- per update -----
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_index = trainer.current_epoch
        if self._restorer is not None:
            self._restorer.on_train_epoch_start()  # RNG states of a resumed run, once
        if hasattr(pl_module, "epoch_stop_requested"):
            pl_module.epoch_stop_requested = False
        self.control = self.handler.call("on_epoch_begin", self.args, self.state, self.control)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """HF `on_step_begin`, before the first micro-batch of the update (T:1893)."""
        if getattr(pl_module, "epoch_stop_requested", False):
            return  # the module ends the epoch before this batch runs (HF broke out after the previous update)
        self.control = self.handler.call("on_step_begin", self.args, self.state, self.control)

    def on_hf_event(self, trainer: pl.Trainer, pl_module: pl.LightningModule, name: str) -> None:
        """Step-internal events raised by `TransformerModule` (on_substep_end, on_pre/on_optimizer_step)."""
        self.control = self.handler.call(name, self.args, self.state, self.control)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After an update: HF's bookkeeping, `on_step_end`, the step pass, and at an epoch's end the epoch pass."""
        assert self.plan is not None
        window = [batch] if isinstance(batch, Mapping) else list(batch)
        self.loss.add(self._micro_losses(outputs), self.state.global_step)
        self.flos.add_window(getattr(pl_module, "model", None), window)
        # every earlier window of the epoch is full, so this also holds after a mid-epoch resume
        micro_done = batch_idx * self.args.gradient_accumulation_steps + len(window)
        self.state.global_step = trainer.global_step
        self.state.epoch = epoch_progress(self._epoch_index, micro_done, self.plan.microbatches_per_epoch)
        step_end_flags(self.state.global_step, self.args, self.plan).merge_into(self.control)
        self.control = self.handler.call("on_step_end", self.args, self.state, self.control)
        self._maybe_log_save_evaluate(trainer, pl_module)
        # HF leaves the epoch when a flag says so after the pass (T:1963-1966); max_steps sets should_training_stop.
        epoch_stop = self.control.should_epoch_stop or self.control.should_training_stop
        last_batch = bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
        if last_batch or epoch_stop or self.state.global_step >= self.plan.max_steps:
            epoch_end_flags(self.state.epoch, self.args).merge_into(self.control)
            self.control = self.handler.call("on_epoch_end", self.args, self.state, self.control)
            self._maybe_log_save_evaluate(trainer, pl_module)
            if self.control.should_training_stop:
                trainer.should_stop = True
            elif epoch_stop and not last_batch and hasattr(pl_module, "epoch_stop_requested"):
                pl_module.epoch_stop_requested = True  # `TransformerModule` returns -1 at the next batch start
        if self.loss.latest_loss is not None and trainer.progress_bar_callback is not None:
            pl_module.log("loss", self.loss.latest_loss, prog_bar=True, logger=False)

    @staticmethod
    def _micro_losses(outputs: Any) -> torch.Tensor:
        """Per-micro-batch losses when the module reports them (`micro_losses`), else the update's summed loss."""
        if isinstance(outputs, Mapping):
            if outputs.get("micro_losses") is not None:
                return torch.as_tensor(outputs["micro_losses"])
            return torch.as_tensor(outputs["loss"])
        return torch.as_tensor(outputs)

    def _maybe_log_save_evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """`Trainer._maybe_log_save_evaluate` (T:2230-2278): log, then evaluate, then save."""
        if self.control.should_log and self.state.global_step > self.loss.last_logged_step:
            self._log_training(trainer, pl_module)
        if self.control.should_evaluate:
            new_best = self._evaluate(trainer, pl_module, during_training=True)
            if self.args.save_strategy == "best":
                self.control.should_save = new_best  # T:2273-2274: "best" saves exactly on a new best
        if self.control.should_save:
            self.flos.store(self.state, trainer)
            self.saver.save(trainer, pl_module, self.state, [*self.handler.callbacks, self.control])
            self.control = self.handler.call("on_save", self.args, self.state, self.control)

    # ----- logging -----
    def record_log(self, trainer: pl.Trainer | None, logs: dict[str, Any]) -> None:
        """HF `Trainer.log` (T:4181-4203): add `epoch`, append to `log_history` with `step`, `on_log`, write to loggers.

        (Not named `log`: Lightning would take it for the module's.)
        """
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.handler.call("on_log", self.args, self.state, self.control, logs=logs)
        numeric = {
            tensorboard_tag(k): v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for logger in trainer.loggers if trainer is not None else []:
            logger.log_metrics(numeric, step=self.state.global_step)

    def _log_training(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The training-loss entry (T:2242-2266): `loss`, `grad_norm` of the last update, LR of the update just done."""
        logs: dict[str, Any] = {"loss": self.loss.pop_log_value(trainer.strategy, self.state.global_step)}
        grad_norm = getattr(pl_module, "last_grad_norm", None)
        if grad_norm is not None:
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            logs["grad_norm"] = float(grad_norm.item()) if torch.is_tensor(grad_norm) else float(grad_norm)
        learning_rate = getattr(pl_module, "last_learning_rate", None)
        if learning_rate is None and trainer.optimizers:
            learning_rate = float(trainer.optimizers[0].param_groups[0]["lr"])
        if learning_rate is not None:
            logs["learning_rate"] = learning_rate
        self.flos.store(self.state, trainer)
        self.record_log(trainer, logs)

    # ----- evaluation -----
    def _evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule, during_training: bool) -> bool:
        """`Trainer._evaluate` + `_determine_best_metric`: run Lightning's validation loop now; True on a new best."""
        datamodule = trainer.datamodule
        if datamodule is not None and not getattr(datamodule, "eval_datasets", True):
            raise ValueError(
                "Trainer: evaluation requires an eval_dataset. `control.should_evaluate` was set at step "
                f"{self.state.global_step} but no eval_dataset was given."
            )
        loop = trainer.fit_loop.epoch_loop.val_loop
        first_loop_iter = trainer._logger_connector._first_loop_iter
        trainer.validating = True  # what Lightning's epoch loop does around its own validation run
        try:
            loop.run()
        finally:
            trainer.training = True
            trainer._logger_connector._first_loop_iter = first_loop_iter
        if not self.last_eval_metrics:  # nothing was evaluated, so no `on_evaluate` cleared the request
            self.control.should_evaluate = False
        if not during_training:
            return False
        self.best.step_plateau_scheduler(trainer, self.last_eval_metrics)
        return self.best.update(self.state, self.last_eval_metrics)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:  # Lightning's pre-training sanity check is not an HF evaluation
            return
        self._eval_finished = set()
        self._eval_current = -1
        self.last_eval_metrics = {}

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """A new eval dataset starts: finish the previous ones first, as HF evaluates datasets one after another."""
        if not trainer.sanity_checking and dataloader_idx != self._eval_current:
            for idx in range(dataloader_idx):
                if idx not in self._eval_finished:
                    self._finish_eval_dataset(trainer, pl_module, idx)
            self._eval_current = dataloader_idx
            loaders = trainer.val_dataloaders
            self.handler.eval_dataloader = loaders[dataloader_idx] if isinstance(loaders, list) else loaders

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self.control = self.handler.call("on_prediction_step", self.args, self.state, self.control)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Finish the datasets not finished yet: one log entry and one `on_evaluate` per dataset."""
        if trainer.sanity_checking:
            return
        count = max(len(trainer.num_val_batches), 1 + max(getattr(pl_module, "eval_accumulators", {}) or [-1]))
        for idx in range(count):
            if idx not in self._eval_finished:
                self._finish_eval_dataset(trainer, pl_module, idx)

    def _eval_accumulator(self, trainer: pl.Trainer, pl_module: pl.LightningModule, idx: int) -> Any:
        """The module's accumulator of eval dataset `idx`; an empty one on a process whose shard had no batch (a tiny
        eval set over many processes), so that every process joins the gather."""
        accumulators = getattr(pl_module, "eval_accumulators", None)
        if accumulators is None or idx in accumulators or trainer.world_size == 1:
            return None if accumulators is None else accumulators.get(idx)
        from hf_lightning.evaluation import EvalAccumulator

        loss_only = self.args.prediction_loss_only or getattr(pl_module, "compute_metrics", None) is None
        if hasattr(pl_module, "_accumulator"):  # the module's own kind (e.g. one that evens out `generate` calls)
            return pl_module._accumulator(idx, loss_only)
        return accumulators.setdefault(idx, EvalAccumulator(pl_module, loss_only))

    def _finish_eval_dataset(self, trainer: pl.Trainer, pl_module: pl.LightningModule, idx: int) -> None:
        """HF `evaluate()` for one dataset (T:2843-2894): metrics with `eval[_name]_` keys, `log`, `on_evaluate`."""
        accumulator = self._eval_accumulator(trainer, pl_module, idx)
        self._eval_finished.add(idx)
        if accumulator is None:
            return
        names = getattr(trainer.datamodule, "eval_dataset_names", None) or [""]
        name = names[idx] if idx < len(names) else str(idx)
        datasets = getattr(trainer.datamodule, "eval_datasets", None) or {}
        dataset = datasets.get(name)
        sized = dataset is not None and hasattr(dataset, "__len__")
        prefix = f"{self.eval_prefix}_{name}" if name else self.eval_prefix
        metrics = dict(accumulator.finish(prefix, num_samples=len(dataset) if sized else None).metrics)
        self.record_log(trainer, metrics)  # adds "epoch" into the same dict, as HF
        self.control = self.handler.call("on_evaluate", self.args, self.state, self.control, metrics=metrics)
        for callback in trainer.callbacks:  # Lightning callbacks acting on HF evaluations (e.g. HFEarlyStopping)
            hook = getattr(callback, "on_hf_evaluate", None)
            if hook is not None:
                hook(trainer, pl_module, self, metrics)
        self.last_eval_metrics.update(metrics)

    # ----- prediction -----
    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        loaders = trainer.predict_dataloaders
        self.handler.eval_dataloader = loaders[dataloader_idx] if isinstance(loaders, list) else loaders

    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.control = self.handler.call("on_prediction_step", self.args, self.state, self.control)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._predict_module = pl_module

    def last_prediction(self, prefix: str, num_samples: int | None) -> Any:
        """Finish the last `predict` run: HF's `PredictionOutput` fields; fires `on_predict` (no log entry)."""
        accumulators = self._predict_module.eval_accumulators
        if 0 not in accumulators:  # this process's shard was empty (more processes than batches): still gather
            module = self._predict_module
            if hasattr(module, "_accumulator"):  # the module's own kind (e.g. one that evens out `generate` calls)
                module._accumulator(0, self.args.prediction_loss_only, is_prediction=True)
            else:
                from hf_lightning.evaluation import EvalAccumulator

                accumulators[0] = EvalAccumulator(module, self.args.prediction_loss_only, is_prediction=True)
        result = accumulators[0].finish(prefix, num_samples=num_samples)
        self.control = self.handler.call("on_predict", self.args, self.state, self.control, metrics=result.metrics)
        return result

    # ----- end -----
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The train summary entry (T:1993-2014), best-model loading, rotation cleanup, then HF `on_train_end`."""
        assert self.plan is not None
        steps = self.state.global_step - self.loss.initial_step
        train_loss = self.loss.train_loss(trainer.strategy, self.state.global_step)
        dataset = getattr(trainer.datamodule, "train_dataset", None)
        total_batch = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps * trainer.world_size
        if self.args.max_steps > 0 or dataset is None or not hasattr(dataset, "__len__"):
            num_samples: float = self.plan.max_steps * total_batch
        else:
            num_samples = len(dataset) * self.args.num_train_epochs
        self.flos.store(self.state, trainer)
        metrics = train_summary(self._train_start, num_samples, steps, self.plan.max_steps, self.state.total_flos,
                                train_loss)
        self.train_metrics = metrics
        self.record_log(trainer, metrics)
        self.best.load_best(pl_module.model, self.state)
        self.saver.finish(trainer, self.state)
        self.control = self.handler.call("on_train_end", self.args, self.state, self.control)

    def state_dict(self) -> dict[str, Any]:
        return {"log_history": list(self.state.log_history), "total_flos": self.state.total_flos}
