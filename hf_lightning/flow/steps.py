"""The HF Trainer's per-update steps of `HFTrainerFlow`: log, evaluate, save; each one routed through the owner.

`HFLoopSteps` is the flow's base class. It holds `Trainer._maybe_log_save_evaluate` (T:2238-2286), `Trainer.log`
(T:4189-4211), `Trainer._evaluate` (T:3302-3339), `Trainer._save_checkpoint` (T:3363) and HF's FLOPs count, and calls
each through `owner` when the flow has one (an `hf_lightning.Trainer`, whose subclass may override
`_maybe_log_save_evaluate`, `log`, `_evaluate`, `evaluate`, `_save_checkpoint`, `floating_point_ops`): the owner's base
methods call back into the `*_now` methods here, so an override runs where HF's runs and `super()` reaches the built-in.
Without an owner (the CLI, a hand-built `lightning.Trainer`) the built-ins run directly.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from hf_lightning._lightning_compat import datamodule_of, reload_validation_data
from hf_lightning.checkpoint.best import BestModelTracker
from hf_lightning.checkpoint.find import last_checkpoint
from hf_lightning.checkpoint.write import CheckpointSaver
from hf_lightning.contracts import HFLoopHooks, flow_model
from hf_lightning.data.windows import is_sized, num_examples
from hf_lightning.flow.evaluation import EvaluationHooks
from hf_lightning.flow.hf_callbacks import HFCallbackHandler
from hf_lightning.flow.interruption import TrainingPreempted, signal_name, stop_line
from hf_lightning.flow.messages import evaluation_header, logger, resume_lines, training_header
from hf_lightning.flow.preemption import PreemptionGuard
from hf_lightning.flow.throughput import TokenLogs
from hf_lightning.flow.train_log import FlopsCounter, TrainLossTracker, UpdateReport, tensorboard_tag
from hf_lightning.module.evaluation import EvalRequest, EvaluationOutput

__all__ = ["HFLoopSteps"]


class HFLoopSteps(EvaluationHooks):
    """HF's log / evaluate / save steps of an update, routed through `owner` (see the module docstring).

    Attributes:
        owner: the object whose HF methods run the steps (an `hf_lightning.Trainer`), or None for the built-ins.
        ignore_keys_for_eval: `train(ignore_keys_for_eval=...)`, used by every evaluation during training.
        resume_hint: how the entry point resumes from a checkpoint folder (`{path}`), in the line a stopped run
            prints (`hf_lightning.Trainer`: `trainer.train(resume_from_checkpoint=...)`, the CLI: `--ckpt_path`).
    """

    args: Any
    plan: Any
    state: Any
    control: Any
    handler: HFCallbackHandler
    saver: CheckpointSaver
    best: BestModelTracker
    loss: TrainLossTracker
    flos: FlopsCounter
    tokens: TokenLogs
    owner: HFLoopHooks | None = None
    ignore_keys_for_eval: list[str] | None = None
    preemption: PreemptionGuard
    resume_hint: str = "flow.resume_from_checkpoint = {path!r} before the next fit"
    _train_start: float = 0.0
    _epoch_index: int = 0
    _running: tuple[pl.Trainer, pl.LightningModule] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A pickled or deep-copied flow runs the built-ins: the owner (the whole `Trainer`) stays out."""
        state = dict(self.__dict__)
        state["owner"], state["_running"] = None, None
        return state

    def hf_event(self, name: str, **extra: Any) -> None:
        """Call the HF callbacks' `name` event with HF's arguments; their returned control replaces ours."""
        self.control = self.handler.call(name, self.args, self.state, self.control, **extra)

    @property
    def is_running(self) -> bool:
        """Whether a fit is running (between `on_train_start` and `on_train_end`)."""
        return self._running is not None

    def _run(self) -> tuple[pl.Trainer, pl.LightningModule]:
        if self._running is None:
            raise RuntimeError("This step of HF's training loop runs only inside train() (no fit is running).")
        return self._running

    # ----- what HF tells the user -----
    def num_examples(self, loader: Any) -> int | None:
        """HF's `num_examples(loader)` (the owner's when there is one); None for an unsized loader."""
        if not is_sized(loader):
            return None
        if self.owner is not None:
            return int(self.owner.num_examples(loader))
        return num_examples(loader, self.args.per_device_train_batch_size)

    def _announce_training(self, trainer: pl.Trainer, model: Any, resumed_at: Any) -> None:
        """HF's "***** Running training *****" header (T:1606-1638), and where a resumed run starts."""
        plan = self.plan
        args = self.args
        total_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * trainer.world_size
        examples = self.num_examples(datamodule_of(trainer).train_loader())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        lines = training_header(
            examples if examples is not None else total_batch * plan.max_steps, plan.num_train_epochs,
            plan.updates_per_epoch, args.per_device_train_batch_size, total_batch, args.gradient_accumulation_steps,
            plan.max_steps, trainable,
        )
        if resumed_at is not None:
            lines += resume_lines(resumed_at.epoch, resumed_at.global_step,
                                  resumed_at.windows * args.gradient_accumulation_steps, args.ignore_data_skip)
        for line in lines:
            logger.info(line)

    def announce_evaluation(self, loader: Any, is_prediction: bool) -> None:
        """HF's evaluation-loop header (T:2957-2962) for one dataset (see `EvaluationHost`)."""
        description = "Prediction" if is_prediction else "Evaluation"
        for line in evaluation_header(description, self.num_examples(loader), self.args.per_device_eval_batch_size):
            logger.info(line)

    # ----- after each update -----
    def count_flos(self, model: Any, window: Any) -> None:
        """HF's `floating_point_ops` of every micro-batch of the update (the owner's, when there is one)."""
        if self.owner is None:
            self.flos.add_window(model, window)
            return
        for micro in [window] if isinstance(window, Mapping) else window:
            self.flos.current += float(self.owner.floating_point_ops(micro))

    def maybe_log_save_evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule, update: UpdateReport
                                ) -> None:
        """`Trainer._maybe_log_save_evaluate`, the owner's when there is one (with HF's arguments)."""
        if self.owner is None:
            self.log_save_evaluate_now(update.grad_norm, update.learning_rate)
            return
        self.owner._maybe_log_save_evaluate(
            self.loss.window, update.grad_norm, flow_model(pl_module), None, self._epoch_index,
            self.ignore_keys_for_eval, self._train_start, learning_rate=update.learning_rate,
        )

    def log_save_evaluate_now(self, grad_norm: Any, learning_rate: float | None, tr_loss: Any = None) -> None:
        """The built-in `_maybe_log_save_evaluate` (T:2238-2286): log, then evaluate, then save.

        Args:
            grad_norm: the update's gradient norm (logged as `grad_norm`).
            learning_rate: the LR the update used (logged as `learning_rate`; None: the optimizer's current one).
            tr_loss: the running training-loss sum HF passes; a tensor other than the flow's own replaces it.
        """
        trainer, pl_module = self._run()
        if isinstance(tr_loss, torch.Tensor) and tr_loss is not self.loss.window:
            self.loss.window = tr_loss
        if self.control.should_log and self.state.global_step > self.loss.last_logged_step:
            self._log_training(trainer, grad_norm, learning_rate)
        if self.control.should_evaluate:
            new_best = self.evaluate_step(trainer, during_training=True)
            if self.args.save_strategy == "best":
                self.control.should_save = new_best  # T:2281-2282: "best" saves exactly on a new best
        if self.control.should_save:
            self.save_checkpoint(pl_module)
            self.hf_event("on_save")

    def save_checkpoint(self, pl_module: pl.LightningModule) -> None:
        """HF's `_save_checkpoint(model, trial)` (T:3363), the owner's when there is one: a library's override (TRL
        writes its model card, then calls `super()`) runs at HF's point, and the base writes the checkpoint."""
        if self.owner is None:
            self.save_checkpoint_now()
            return
        self.owner._save_checkpoint(flow_model(pl_module), getattr(self.owner, "_trial", None))

    def save_checkpoint_now(self) -> None:
        """The built-in `_save_checkpoint`: store the FLOPs, write `checkpoint-<global_step>` (crash-safe, with its
        manifest), move the best pointer, rotate (`checkpoint/write.py`).

        Raises:
            RuntimeError: no fit is running (HF's `_save_checkpoint` runs only inside its training loop too).
        """
        trainer, pl_module = self._run()
        self.flos.store(self.state, trainer)
        self.saver.save(trainer, pl_module, self.state, [*self.handler.callbacks, self.control],
                        epoch_ending=self.control.should_epoch_stop, skip_callbacks=(self,))

    # ----- pre-emption (flow/preemption.py, flow/interruption.py) -----
    def stop_if_preempted(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """At the end of every update, on every rank (one collective): when any rank received a pre-emption signal,
        write this update's checkpoint through the normal save (`enable_jit_checkpoint=True`, unless this update's
        own save wrote it), wait until it is complete, and raise `TrainingPreempted`: no further update runs.

        Raises:
            TrainingPreempted: a rank was signalled (every rank raises it, after the same save).
        """
        signum = self.preemption.agreed(trainer)
        if not signum:
            return
        jit = bool(self.args.enable_jit_checkpoint)
        if jit and self.saver.last_saved_step != self.state.global_step:
            self.save_checkpoint(pl_module)
            self.hf_event("on_save")
        self.saver.wait(trainer)  # `save_async`: the checkpoint in flight is in place before the process ends
        self.preemption.requeue(trainer, signum)  # Lightning's SLURM auto-requeue, once the checkpoint is complete
        raise self.preempted(trainer, signum, saved=jit)

    def preempted(self, trainer: pl.Trainer, signum: int, saved: bool, during: str = "") -> TrainingPreempted:
        """The exception for a run stopped by `signum` (`during`: where, after the signal's name); its one line
        printed on global rank 0."""
        checkpoint = last_checkpoint(self.args.resolved_output_dir)
        save_hint = None if self.args.enable_jit_checkpoint else \
            "enable_jit_checkpoint=True writes a checkpoint when a run is pre-empted"
        line = stop_line(signal_name(signum) + during, self.state.global_step, checkpoint, self.resume_hint, saved,
                         save_hint)
        self.say_stopped(trainer, line)
        return TrainingPreempted(signum, self.state.global_step, checkpoint, saved, line)

    @contextmanager
    def preempted_outside_training(self, trainer: pl.Trainer) -> Iterator[None]:
        """`evaluate()` / `predict()`: Lightning ends them at the next batch after a SIGTERM with its
        `SIGTERMException` (a `SystemExit` with status 0: a scheduler would see success); `TrainingPreempted`
        (status 143, with the line) instead.

        Raises:
            TrainingPreempted: Lightning stopped the run on SIGTERM.
        """
        try:
            yield
        except SIGTERMException:
            raise self.preempted(trainer, int(signal.SIGTERM), saved=False, during=" during evaluate() / predict()"
                                 ) from None

    def interrupted_line(self, trainer: pl.Trainer) -> None:
        """Ctrl-C: print the line naming the last complete checkpoint (global rank 0)."""
        checkpoint = last_checkpoint(self.args.resolved_output_dir)
        self.say_stopped(trainer, stop_line("Ctrl-C (KeyboardInterrupt)", self.state.global_step, checkpoint,
                                            self.resume_hint))

    @staticmethod
    def say_stopped(trainer: pl.Trainer, line: str) -> None:
        # printed, not logged: the run's log level (`log_level="error"`...) must not hide where to resume from
        if trainer.is_global_zero:
            print(line, file=sys.stderr, flush=True)

    # ----- logging -----
    def hf_log(self, trainer: pl.Trainer | None, logs: dict[str, Any], start_time: float | None = None) -> None:
        """HF's `Trainer.log`: the owner's when there is one, else `record_log` (not named `log`: Lightning sets
        `log` on every callback to the module's)."""
        if self.owner is None:
            self.record_log(trainer, logs, start_time)
        elif start_time is not None:  # HF passes `start_time` for the training-loss entry only
            self.owner.log(logs, start_time)
        else:
            self.owner.log(logs)

    def record_log(self, trainer: pl.Trainer | None, logs: dict[str, Any], start_time: float | None = None) -> None:
        """The built-in `Trainer.log` (T:4189-4211): add `epoch` and `num_input_tokens_seen` (tokens_seen.py; with this
        call's tokens/s when `start_time` is given), append to `log_history` with `step`, `on_log`, write to the
        Lightning loggers with HF's TensorBoard tag names."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        self.tokens.annotate(logs, self.state, start_time)
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.hf_event("on_log", logs=logs)
        numeric = {
            tensorboard_tag(k): v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for lightning_logger in trainer.loggers if trainer is not None else []:
            lightning_logger.log_metrics(numeric, step=self.state.global_step)

    def _log_training(self, trainer: pl.Trainer, grad_norm: Any, learning_rate: float | None) -> None:
        """The training-loss entry (T:2250-2274): `loss`, `grad_norm` of the last update, LR of the update just done."""
        logs: dict[str, Any] = {"loss": self.loss.pop_log_value(trainer.strategy, self.state.global_step)}
        if grad_norm is not None:
            logs["grad_norm"] = float(grad_norm)
        if learning_rate is None and trainer.optimizers:
            learning_rate = float(trainer.optimizers[0].param_groups[0]["lr"])
        if learning_rate is not None:
            logs["learning_rate"] = learning_rate
        self.flos.store(self.state, trainer)
        self.tokens.training_entry(logs, trainer.strategy, self.state.total_flos)
        self.hf_log(trainer, logs, start_time=self._train_start)

    # ----- evaluation during training -----
    def evaluate_step(self, trainer: pl.Trainer, during_training: bool) -> bool:
        """`Trainer._evaluate` (the owner's when there is one) + `_determine_best_metric`; True on a new best."""
        # with an owner, its `evaluate` decides, as HF's (whose `get_eval_dataloader` raises without an eval dataset;
        # sentence-transformers' returns an empty loader when it has an evaluator instead)
        if self.owner is None and not datamodule_of(trainer).eval_datasets:
            raise ValueError(
                "Trainer: evaluation requires an eval_dataset. `control.should_evaluate` was set at step "
                f"{self.state.global_step} but no eval_dataset was given."
            )
        skip_scheduler = not during_training  # `eval_on_start`: no plateau step, no best metric (T:1655-1656)
        started = time.perf_counter()
        if self.owner is not None:
            metrics = self.owner._evaluate(None, self.ignore_keys_for_eval, skip_scheduler=skip_scheduler)
        else:
            metrics = self.evaluate_now(EvalRequest(ignore_keys=self.ignore_keys_for_eval))
            if not skip_scheduler:
                self.step_plateau_scheduler(metrics)
        self.tokens.exclude(time.perf_counter() - started)  # tokens/s counts training time only
        if not metrics:  # nothing was evaluated, so no `on_evaluate` cleared the request
            self.control.should_evaluate = False
        if not during_training:
            return False
        return self.best.update(self.state, metrics)

    def load_best_now(self) -> None:
        """The built-in `_load_best_model` of the running fit: the best checkpoint's weights into the model."""
        trainer, pl_module = self._run()
        self.best.load_best_weights(flow_model(pl_module), self.state, trainer.strategy)

    def evaluate_now(self, request: EvalRequest) -> dict[str, Any]:
        """Run Lightning's validation loop now, inside `fit` (HF's `evaluate()` during `train()`): the metrics.

        The eval loaders are asked for again (`get_eval_dataloader` runs at every evaluation, as HF's).
        """
        return self.evaluation_now(request).metrics

    def evaluation_now(self, request: EvalRequest) -> EvaluationOutput:
        """`evaluate_now`, returning every dataset's result (an `evaluation_loop` call during `train()`)."""
        trainer, _ = self._run()
        reload_validation_data(trainer)
        return self.evaluator.evaluate_during_fit(trainer, request)

    def step_plateau_scheduler(self, metrics: dict[str, Any]) -> None:
        """A `ReduceLROnPlateau` steps on the best-model metric after a training-time evaluation (T:3322-3339)."""
        trainer, _ = self._run()
        self.best.step_plateau_scheduler(trainer, metrics)

    def _start_steps(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A fit starts: the steps run against this trainer and module until `_end_steps`."""
        self._running = (trainer, pl_module)
        self._train_start = time.time()

    def _end_steps(self) -> None:
        self._running = None
