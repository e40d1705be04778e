"""`HFTrainerFlow`: the HF Trainer's log / evaluate / save cadence and logged values, as one Lightning callback.

One Lightning training batch is one optimizer update (see `TransformerDataModule`). After each update, in
`on_train_batch_end`, the callback replays `Trainer._run_epoch` + `_maybe_log_save_evaluate` (T:1943-1999, 2238-2286):

    on_step_end (HF callbacks, `DefaultFlowCallback` first) -> log -> evaluate -> save
    [last update of the epoch, or a stop flag] on_epoch_end (HF callbacks) -> log -> evaluate -> save

Evaluations run Lightning's own validation loop synchronously, right where HF evaluates (`HFEvaluator`,
`flow/evaluation.py`), so several evaluations in one update (a step pass and an epoch pass, or a flag set by a
callback) run in HF's order, and other Lightning callbacks see normal validation hooks. Lightning's own validation
trigger is switched off (`_lightning_compat.disable_validation_trigger`). `TrainerControl` flags set by HF callbacks are
honoured exactly where HF reads them. Logged entries go to `state.log_history` in HF's format and to every Lightning
logger at `step=global_step` with HF's TensorBoard tag names.

The flow is the one Lightning callback; each part it holds does one thing, constructed with what it needs:

- `hf` (`HFRun`, flow/steps.py): HF's `TrainerState`, `TrainerControl` and callbacks (`handler`);
- `steps` (`HFLoopSteps`, flow/steps.py): the log / evaluate / save step and the HF loop methods it calls;
- `evaluator` (`HFEvaluator`, flow/evaluation.py): evaluations and predictions on Lightning's loops;
- `loss`, `flos` (flow/train_log.py), `tokens` (flow/throughput.py): what a log line holds;
- `checkpoints` (`Checkpoints`, checkpoint/lifecycle.py): the checkpoints (resume, saves, rotation) and the best model;
- `preemption` (`PreemptionStop`, flow/preemption.py): pre-emption signals and the stop they lead to; Ctrl-C leaves
  `fit` as `KeyboardInterrupt` (not `SystemExit(1)`).

What the flow needs from the module and the data module is declared in `hf_lightning.contracts` and checked once in
`setup`. `fit`, `evaluate` and `predict` run Lightning's entry points and return HF's results.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import nn
from transformers import DefaultFlowCallback, TrainerCallback, TrainerControl, TrainerState
from transformers.trainer_utils import TrainOutput
from typing_extensions import override

from hf_lightning._lightning_compat import (
    callbacks_of,
    datamodule_of,
    defer_validation_data,
    disable_validation_trigger,
    ignore_mid_epoch_resume_warning,
    position_in_epoch,
    set_step_budget,
)
from hf_lightning.args import TrainingArguments
from hf_lightning.callbacks.lightning_console import tidy_lightning_console
from hf_lightning.checkpoint.csv_logs import continue_resumed_logs
from hf_lightning.checkpoint.find import resume_folder
from hf_lightning.checkpoint.lifecycle import Checkpoints
from hf_lightning.checkpoint.restore import CheckpointRestorer, plan_for_resume
from hf_lightning.console import install_console_filters
from hf_lightning.contracts import HFEvaluationListener, HFLoopHooks, check_flow_contracts, flow_model, flow_module
from hf_lightning.flow.evaluation import HFEvaluator
from hf_lightning.flow.hf_callbacks import HFCallbackHandler
from hf_lightning.flow.interruption import TrainingPreempted
from hf_lightning.flow.messages import TRAINING_COMPLETED, logger
from hf_lightning.flow.preemption import PreemptionStop
from hf_lightning.flow.setup_stop import SetupStop
from hf_lightning.flow.steps import HFLoopSteps, HFRun
from hf_lightning.flow.throughput import TokenLogs
from hf_lightning.flow.train_log import (
    FlopsCounter,
    TrainLossTracker,
    UpdateReport,
    tensorboard_tag,
)
from hf_lightning.module.evaluation import EvalRequest, EvalResult, EvaluationOutput
from hf_lightning.module.full_eval import cast_for_full_eval
from hf_lightning.plan import (
    TrainingPlan,
    epoch_progress,
    evaluates_on_start,
    unreachable_best_checkpoint,
    unreachable_best_metric,
)
from hf_lightning.run_options.neftune import NEFTune
from hf_lightning.run_options.threads import warn_if_oversubscribed

__all__ = ["FLOW_RESUME_HINT", "HFTrainerFlow", "tensorboard_tag"]

FLOW_RESUME_HINT = "flow.resume_from_checkpoint = {path!r} before the next fit"
"""How a hand-built `lightning.Trainer` resumes, in the line a stopped run prints (`{path}`: the folder)."""


class HFTrainerFlow(Callback):
    """Drives logging, evaluation and checkpointing at the HF Trainer's steps, and feeds HF `TrainerCallback`s.

    Args:
        args: the training arguments (strategies, intervals, output directory, best-model settings).
        callbacks: `transformers.TrainerCallback` instances or classes, called with HF's arguments.
        processing_class: tokenizer / processor passed to HF callbacks and saved with checkpoints.
        lightning_console: keep a hand-built `lightning.Trainer`'s output as configured; by default it prints as
            `hf_lightning.Trainer` does (no default model summary, evaluation metrics and HF's epoch count in the
            bar, no `v_num`: `callbacks/lightning_console.py`).
        owner: the object whose overridden HF loop methods run where HF's loop calls them, and whose `evaluate`
            runs the evaluations during training (an `hf_lightning.Trainer`); None: the built-ins (flow/steps.py).
        overridden: the method names the owner's class overrides.
        resume_hint: how the entry point resumes from a checkpoint folder (`{path}`), in the line a stopped run
            prints (`hf_lightning.Trainer`: `trainer.train(resume_from_checkpoint=...)`, the CLI: `--ckpt_path`).

    Attributes:
        resume_from_checkpoint: a checkpoint folder (or True: the latest in `output_dir`) the next `fit` resumes
            from; None falls back to `args.resume_from_checkpoint` (see `fit`).

    Example::

        flow = HFTrainerFlow(TrainingArguments(eval_strategy="steps", eval_steps=50), [EarlyStoppingCallback(2)])
        lightning.Trainer(callbacks=[flow], max_epochs=-1).fit(TransformerModule(model, args), datamodule=dm)
    """

    def __init__(
        self, args: TrainingArguments, callbacks: list[TrainerCallback | type[TrainerCallback]] | None = None,
        processing_class: Any = None, lightning_console: bool = False, owner: HFLoopHooks | None = None,
        overridden: frozenset[str] = frozenset(), resume_hint: str = FLOW_RESUME_HINT,
    ) -> None:
        self.args = args
        self.lightning_console = lightning_console
        if not lightning_console:  # now: a hand-built `lightning.Trainer` prints its first lines when it is built
            install_console_filters()
        # HF's handler starts with `DefaultFlowCallback`: it raises the log / evaluate / save / stop flags at each
        # update's and epoch's end, so removing it stops them as in HF
        handler = HFCallbackHandler([DefaultFlowCallback, *(callbacks or [])])
        handler.processing_class = processing_class
        self.hf = HFRun(args, handler)
        self.checkpoints = Checkpoints(args, processing_class)
        self.evaluator = HFEvaluator(self)
        self.plan: TrainingPlan | None = None
        self.loss = TrainLossTracker(args.logging_nan_inf_filter)
        self.neftune = NEFTune(args.neftune_noise_alpha)
        self.flos = FlopsCounter()
        self.tokens = TokenLogs(args)
        self.steps = HFLoopSteps(args, self.hf, self.evaluator, self.checkpoints, self.loss, self.flos,
                                 self.tokens, self, owner, overridden)
        self.preemption = PreemptionStop(args, self.hf, self.steps, self.checkpoints, resume_hint)
        self.resume_from_checkpoint: str | bool | None = None
        self._eval_listeners: list[HFEvaluationListener] = []
        self._epoch_index = 0
        self._epoch_stop_requested = False
        self._restorer: CheckpointRestorer | None = None
        self._resumes_mid_epoch = False
        self._quiet_resume = ExitStack()  # holds the scoped warning filter of a mid-epoch resume while it is open
        self._summary: dict[str, Any] | None = None  # the train summary of the fit running now
        self._keyboard_interrupt: KeyboardInterrupt | None = None  # Ctrl-C seen by `on_exception` in this fit
        self._late_signal = 0  # a pre-emption signal after the last update (`on_train_end`'s agreement)

    @property
    @override
    def state_key(self) -> str:
        return "HFTrainerFlow"

    # ----- HF's state, control and callbacks (`hf`) -----
    @property
    def state(self) -> TrainerState:
        """HF's `TrainerState` of the run (replaced by a resumed run's)."""
        return self.hf.state

    @state.setter
    def state(self, state: TrainerState) -> None:
        self.hf.state = state

    @property
    def control(self) -> TrainerControl:
        """HF's `TrainerControl`: the flags the callbacks set, read where HF reads them."""
        return self.hf.control

    @control.setter
    def control(self, control: TrainerControl) -> None:
        self.hf.control = control

    @property
    def handler(self) -> HFCallbackHandler:
        """The HF callbacks and the objects passed to them."""
        return self.hf.handler

    def hf_event(self, name: str, **extra: Any) -> None:
        """Call the HF callbacks' `name` event with HF's arguments; their returned control replaces ours."""
        self.hf.event(name, **extra)

    # ----- runs that return their results -----
    def hf_init_end(self, model: nn.Module) -> None:
        """HF's `on_init_end` (end of `Trainer.__init__`), with the model HF callbacks receive."""
        self.handler.model = model
        self.hf_event("on_init_end")

    def fit(
        self, trainer: pl.Trainer, module: pl.LightningModule, datamodule: pl.LightningDataModule,
        resume_from_checkpoint: str | bool | None = None, ignore_keys_for_eval: list[str] | None = None,
    ) -> TrainOutput:
        """`trainer.fit`, resuming from `resume_from_checkpoint` (see the attribute); returns HF's `TrainOutput`.

        `ignore_keys_for_eval`: output keys the evaluations during this fit drop from the predictions.

        Raises:
            TrainingPreempted: a pre-emption signal stopped the run, or arrived after its last update.
            KeyboardInterrupt: Ctrl-C (Lightning turns it into `SystemExit(1)`; HF's `train()` raises it).
        """
        previous = self.resume_from_checkpoint
        self.resume_from_checkpoint = resume_from_checkpoint
        self.steps.ignore_keys_for_eval = ignore_keys_for_eval
        self._keyboard_interrupt, self._late_signal = None, 0
        # before Lightning opens the loggers; `rank` is set from the launcher's environment at import
        if getattr(rank_zero_only, "rank", 0) == 0 and resume_from_checkpoint is not False:
            continue_resumed_logs(trainer.loggers, self.args, resume_from_checkpoint)
        try:
            # until Lightning's handlers take over (the fit loop): a signal stops at once, with its line
            with SetupStop(self.preemption.resume_hint, lambda: self._setup_checkpoint(resume_from_checkpoint)):
                trainer.fit(module, datamodule=datamodule)
            metrics, self._summary = dict(self._summary or {}), None
        except SystemExit as stop:
            interrupt, self._keyboard_interrupt = self._keyboard_interrupt, None
            if interrupt is None or isinstance(stop, TrainingPreempted):
                raise
            self.preemption.interrupted_line(trainer)
            raise interrupt from None
        finally:
            self.resume_from_checkpoint = previous
            self.steps.ignore_keys_for_eval = None
        # a signal after the last update (agreed at the end of `on_train_end`, or just after): the run is complete
        late = self._late_signal or self.preemption.guard.local_signal
        if late:
            raise self.preemption.preempted(trainer, late, saved=False)
        metrics["epoch"] = self.state.epoch
        return TrainOutput(self.state.global_step, metrics.get("train_loss", 0.0), metrics)

    def evaluate(
        self, trainer: pl.Trainer, module: pl.LightningModule, datamodule: pl.LightningDataModule,
        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval", ckpt_path: str | None = None,
        request: EvalRequest | None = None,
    ) -> EvaluationOutput:
        """HF's `evaluate()` with `trainer.validate`: every eval dataset's result (`.metrics`: HF's return value);
        `request` (an `evaluation_loop` call's) replaces `ignore_keys` and `metric_key_prefix`."""
        cast_for_full_eval(flow_model(module), self.args)  # bf16 / fp16_full_eval, outside training only (as HF)
        request = request if request is not None else EvalRequest(metric_key_prefix, ignore_keys)
        with self.preemption.outside_training(trainer):
            return self.evaluator.evaluate(trainer, module, datamodule, request, ckpt_path)

    def evaluate_if_running(self, request: EvalRequest) -> EvaluationOutput | None:
        """During a fit: Lightning's validation loop now, inside it (HF's `evaluate()` during `train()`), every
        dataset's result; None when no fit is running (the caller runs `evaluate` with a trainer of its own)."""
        return self.steps.evaluate_now(request) if self.steps.is_running else None

    def predict(
        self, trainer: pl.Trainer, module: pl.LightningModule, datamodule: pl.LightningDataModule,
        ignore_keys: list[str] | None = None, metric_key_prefix: str = "test", ckpt_path: str | None = None,
        loss_per_batch: bool | None = None,
    ) -> EvalResult:
        """HF's `predict()` with `trainer.predict`: the predictions, labels and metrics (`PredictionOutput`'s);
        `loss_per_batch` is the caller's gathering (`EvalRequest.loss_per_batch`)."""
        cast_for_full_eval(flow_model(module), self.args)
        request = EvalRequest(metric_key_prefix, ignore_keys, is_prediction=True, loss_per_batch=loss_per_batch)
        with self.preemption.outside_training(trainer):
            return self.evaluator.predict(trainer, module, datamodule, request, ckpt_path)

    # ----- setup -----
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Check the contracts, fix the plan (max_steps, intervals) and hand Lightning its step budget."""
        datamodule = datamodule_of(trainer)
        check_flow_contracts(pl_module, datamodule)
        self.handler.model = flow_model(pl_module)
        self._eval_listeners = [cb for cb in callbacks_of(trainer) if isinstance(cb, HFEvaluationListener)]
        if not self.lightning_console:
            tidy_lightning_console(trainer)
        if stage != "fit":
            return
        self.preemption.guard.install(trainer)  # before Lightning registers its signal handlers (flow/preemption.py)
        # knowing the checkpoint: `resume_keep_global_batch`, and the updates of a resume in another geometry
        self.plan = plan = plan_for_resume(trainer, self.args, self.resume_from_checkpoint, datamodule)
        loss_only = flow_module(pl_module).prediction_loss_only(is_prediction=False)
        # an owner (`hf_lightning.Trainer`) checked the metric at construction, knowing which of its methods are
        # overridden to produce metrics of their own (trainer/overrides.py `METRIC_SOURCES`)
        problem = unreachable_best_checkpoint(self.args, plan) \
            or (self.steps.owner is None and unreachable_best_metric(
                self.args, list(datamodule.eval_datasets or {}), loss_only))
        if problem:
            raise ValueError(problem)
        set_step_budget(trainer, plan.max_steps, plan.num_train_epochs if plan.sized else -1)
        # Evaluations are started by this callback at HF's steps; Lightning's own trigger is switched off, and the
        # eval loaders are built at each evaluation, not at fit start.
        disable_validation_trigger(trainer)
        defer_validation_data(trainer)

    def _setup_checkpoint(self, resume: str | bool | None) -> str | None:
        """The checkpoint a run stopped before its first update can resume from: the one it was resuming (None for
        a fresh run: another run's checkpoints in `output_dir` are not this run's)."""
        folder = resume_folder(self.args, resume) if resume is not False else None
        return folder if folder is not None and os.path.isdir(folder) else None

    @property
    def written_steps(self) -> list[int]:
        """The steps whose checkpoints the last fit saved (for the summary: not another run's folders)."""
        return list(self.checkpoints.saver.saved_steps)

    @property
    def resumed_from(self) -> tuple[str, int] | None:
        """`(checkpoint folder, its global step)` when the last fit resumed, else None (for the summary)."""
        restorer = self._restorer
        if restorer is None or restorer.position is None:
            return None
        return restorer.path, restorer.position.global_step

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Resume from `resume_from_checkpoint`; name the checkpoints this run will replace (checkpoint/restore.py)."""
        self._summary = None
        warn_if_oversubscribed(trainer)  # more torch threads than free cores: a warning with the number to set
        self._restorer = self.checkpoints.begin_run(trainer, pl_module, self.resume_from_checkpoint, self.plan)
        position = self._restorer.position if self._restorer is not None else None
        self._resumes_mid_epoch = position is not None and position.windows > 0
        if self._restorer is not None and self._restorer.nothing_left:
            # Resumed at or past the end: Lightning skips its fit loop with its train hooks, HF runs the train
            # begin (state from the checkpoint) and end (summary, best model, on_train_end) around no epoch.
            self.on_train_start(trainer, pl_module)
            self.on_train_end(trainer, pl_module)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The output-directory lock taken in `on_fit_start` is given back when `fit` ends (checkpoint/lifecycle.py)."""
        if stage == "fit":
            self.checkpoints.end_run(trainer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A fresh `TrainerState` (T:1682-1689), HF `on_train_begin`, then `eval_on_start` (T:1655-1656)."""
        assert self.plan is not None
        self.hf.start_state(self.plan, trainer)
        restored = self.checkpoints.restore(trainer, self.plan, self.handler, self.control)
        if restored is not None:
            self.state, self.plan, self.control = restored.state, restored.plan, restored.control
        self.loss.start(pl_module.device, trainer.global_step)
        self.flos.current = 0.0
        self.tokens.start(self.state, pl_module.device, str(trainer.precision), trainer.world_size)
        self.steps.start(trainer, pl_module)
        self.steps.announce_training(trainer, flow_model(pl_module), self.plan,
                                     self._restorer.position if self._restorer else None)
        self.handler.optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.handler.lr_scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
        self.handler.train_dataloader = datamodule_of(trainer).train_loader()
        self.neftune.start(flow_model(pl_module))  # the embeddings' noise hook, while training only (T:1537-1538)
        self.hf_event("on_train_begin")
        if evaluates_on_start(self.args):
            # No plateau-scheduler step and no best-metric update for this one (T:1655-1656, 3302-3339).
            self.steps.evaluate_step(trainer, during_training=False)

    # ----- per update -----
    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_index = trainer.current_epoch
        self._epoch_stop_requested = False
        if self._restorer is not None:
            self._restorer.on_train_epoch_start(trainer)  # RNG states of a resumed run, once
        if self._resumes_mid_epoch:
            # Lightning warns that a plain DataLoader cannot resume mid-epoch (ours starts at the window), when this
            # epoch's loop starts; the filter lasts until the epoch's first batch
            self._resumes_mid_epoch = False
            self._quiet_resume.enter_context(ignore_mid_epoch_resume_warning())
        self.hf_event("on_epoch_begin")

    def _end_quiet_resume(self) -> None:
        self._quiet_resume.close()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """HF `on_step_begin`, after the update's micro-batches were fetched, before the first forward (T:1901)."""
        self._end_quiet_resume()
        if self._restorer is not None:
            self._restorer.on_train_batch_start()  # a mid-epoch resume's RNG states, once
        if self._epoch_stop_requested:
            return  # the module ends the epoch before this batch runs (HF broke out after the previous update)
        self.hf_event("on_step_begin")

    # TrainingStepListener: HF's events inside the update, raised by the module
    def on_substep_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.hf_event("on_substep_end")

    def on_pre_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.hf_event("on_pre_optimizer_step")

    def on_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.hf_event("on_optimizer_step")

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After an update: HF's bookkeeping, `on_step_end`, the step pass, and at an epoch's end the epoch pass."""
        assert self.plan is not None
        update = UpdateReport.from_outputs(outputs)
        window = [batch] if isinstance(batch, Mapping) else list(batch)
        self.loss.add(update.micro_losses, self.state.global_step, update.label_tokens)
        self.steps.count_flos(flow_model(pl_module), window)
        self.tokens.add_window(self.state, window, flow_model(pl_module), self._pad_token_id(), trainer.strategy,
                               pl_module.device)
        # every earlier window of the epoch is full, so this also holds after a mid-epoch resume; the last window of
        # a sized epoch ends it (an epoch resumed in another geometry has fewer windows: checkpoint/elastic.py)
        last_batch = position_in_epoch(trainer)[1]
        micro_done = self.plan.microbatches_per_epoch if last_batch and self.plan.sized else (
            batch_idx * self.args.gradient_accumulation_steps + len(window))
        self.state.global_step = trainer.global_step
        self.state.epoch = epoch_progress(self._epoch_index, micro_done, self.plan.microbatches_per_epoch)
        self.hf_event("on_step_end")  # `DefaultFlowCallback` first: the flags of `cadence.step_end_flags`
        self.steps.maybe_log_save_evaluate(pl_module, update, self._epoch_index)
        # HF leaves the epoch when a flag says so after the pass (T:1971-1974); max_steps sets should_training_stop.
        epoch_stop = self.control.should_epoch_stop or self.control.should_training_stop
        if last_batch or epoch_stop or self.state.global_step >= self.plan.max_steps:
            self.hf_event("on_epoch_end")  # `DefaultFlowCallback`: the flags of `cadence.epoch_end_flags`
            self.steps.maybe_log_save_evaluate(pl_module, update, self._epoch_index)
            if self.control.should_training_stop:
                trainer.should_stop = True
            elif epoch_stop and not last_batch:
                flow_module(pl_module).request_epoch_stop()  # Lightning ends the epoch at the next batch start
                self._epoch_stop_requested = True
        if self.loss.last_logged_step == self.state.global_step and self.loss.latest_loss is not None \
                and trainer.progress_bar_callback is not None:
            # only when a new loss was logged: Lightning's bar keeps a value until it is logged again, and its
            # `log` costs a few milliseconds (signature inspection, result bookkeeping)
            pl_module.log("loss", self.loss.latest_loss, prog_bar=True, logger=False)
        self.preemption.after_update(trainer, pl_module)  # one collective per update, at the same point on every rank

    # ----- evaluation: Lightning's validation and prediction hooks, handed to the evaluator -----
    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:  # Lightning's pre-training sanity check is not an HF evaluation
            self.evaluator.start(trainer, pl_module, is_prediction=False)

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not trainer.sanity_checking:
            self.evaluator.batch_start(trainer, pl_module, dataloader_idx, trainer.val_dataloaders)

    @override
    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self.evaluator.batch_end(batch, outputs, dataloader_idx)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.evaluator.end(trainer, pl_module, len(trainer.num_val_batches))

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.evaluator.start(trainer, pl_module, is_prediction=True)

    @override
    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.evaluator.batch_start(trainer, pl_module, dataloader_idx, trainer.predict_dataloaders)

    @override
    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.evaluator.batch_end(batch, outputs, dataloader_idx)

    @override
    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.evaluator.end(trainer, pl_module, 1)

    # EvaluationHost: what the evaluator reports to
    def set_eval_dataloader(self, loader: Any) -> None:
        self.handler.eval_dataloader = loader

    def announce_evaluation(self, loader: Any, is_prediction: bool) -> None:
        self.steps.announce_evaluation(loader, is_prediction)

    def dataset_evaluated(self, trainer: pl.Trainer, pl_module: pl.LightningModule, metrics: dict[str, Any]) -> None:
        """HF `evaluate()` for one dataset (T:2851-2902): the log entry, `on_evaluate`, then the listeners."""
        self.steps.log(trainer, metrics)  # adds "epoch" into the same dict, as HF
        self.hf_event("on_evaluate", metrics=metrics)
        self.report_to_listeners(trainer, pl_module, metrics)

    def report_to_listeners(self, trainer: pl.Trainer | None, pl_module: pl.LightningModule, metrics: dict[str, Any]
                            ) -> None:
        """Tell the evaluation listeners (`HFEarlyStopping`...) about a finished evaluation's metrics."""
        if trainer is None:  # no run yet: no listener was collected
            return
        for listener in self._eval_listeners:
            listener.on_hf_evaluate(trainer, pl_module, self, metrics)

    def _pad_token_id(self) -> int | None:
        return getattr(self.handler.processing_class, "pad_token_id", None)

    # ----- end -----
    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The train summary entry (T:2001-2022), best-model loading, rotation cleanup, then HF `on_train_end`."""
        assert self.plan is not None
        self._end_quiet_resume()
        self.checkpoints.wait(trainer)  # `save_async`: the last checkpoint is in place before summary and best model
        logger.info(TRAINING_COMPLETED)
        self._summary = self.steps.log_train_summary(trainer, self.plan.max_steps)
        self.checkpoints.finish(trainer, flow_model(pl_module), self.state)
        self.hf_event("on_train_end")
        self.steps.end()
        self.neftune.stop()
        self._late_signal = self.preemption.guard.agreed(trainer)  # every rank ends here: one collective, as per update

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt):
            self._keyboard_interrupt = exception  # `fit` raises it instead of Lightning's `SystemExit(1)`
        self._end_quiet_resume()
        self.checkpoints.end_run(trainer)  # Lightning skips `teardown` after an exception
        self.steps.end()
        self.neftune.stop()

    @override
    def state_dict(self) -> dict[str, Any]:
        """HF's log history and FLOPs (what a Lightning `.ckpt` keeps of the flow; our resume reads
        `trainer_state.json` instead)."""
        return {"log_history": list(self.state.log_history), "total_flos": self.state.total_flos}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state.log_history = list(state_dict.get("log_history", []))
        self.state.total_flos = float(state_dict.get("total_flos", 0.0))
