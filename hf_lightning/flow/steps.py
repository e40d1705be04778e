"""`HFLoopSteps`: the HF Trainer's per-update steps (log, evaluate, save) and the loop methods they call.

It holds `Trainer._maybe_log_save_evaluate` (T:2238-2286), `Trainer.log` (T:4189-4211), `Trainer._evaluate`
(T:3302-3339), `_save_checkpoint` (T:3363), `_load_best_model`, `floating_point_ops` and `num_examples`. When the flow
belongs to an `hf_lightning.Trainer` (`owner`), a method its class overrides is called on it instead, where HF's loop
calls it; its base method calls back into the built-in here, so `super()` reaches it. A method the class does not
override runs here directly (the owner's base would only call back), except the evaluation itself: `owner.evaluate` runs
HF's `evaluate()` dataset by dataset, with the owner's loaders. Without an owner (the CLI, a hand-built
`lightning.Trainer`) every built-in runs here.

`HFRun` is HF's side of the run as the flow's parts share it: the arguments, the `TrainerState` and `TrainerControl`
(each replaced as HF replaces them: a resumed run's state, a callback's returned control) and the callbacks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from transformers import TrainerControl, TrainerState
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import TrainerMemoryTracker

from hf_lightning._lightning_compat import datamodule_of, reload_validation_data
from hf_lightning.args import TrainingArguments
from hf_lightning.args.accelerator_config import total_train_batch
from hf_lightning.checkpoint.lifecycle import Checkpoints
from hf_lightning.checkpoint.position import ResumePosition
from hf_lightning.contracts import HFLoopHooks, flow_model
from hf_lightning.data.windows import is_sized, num_examples
from hf_lightning.flow.evaluation import HFEvaluator
from hf_lightning.flow.hf_callbacks import HFCallbackHandler
from hf_lightning.flow.messages import evaluation_header, logger, resume_lines, training_header
from hf_lightning.flow.throughput import TokenLogs
from hf_lightning.flow.train_log import FlopsCounter, TrainLossTracker, UpdateReport, tensorboard_tag, train_summary
from hf_lightning.module.evaluation import EvalRequest, EvaluationOutput
from hf_lightning.plan import TrainingPlan, saves_now

__all__ = ["HFLoopSteps", "HFRun", "LOOP_METHODS"]

LOOP_METHODS = frozenset({"_maybe_log_save_evaluate", "log", "_evaluate", "num_examples", "floating_point_ops",
                          "_save_checkpoint"})
"""The HF loop methods an owner's override replaces (`HFLoopHooks`); `evaluate` is always the owner's."""


class HFRun:
    """HF's arguments, `TrainerState` and `TrainerControl` of a run, and the callbacks that read and set them.

    The flow's parts (its steps, its pre-emption stop) hold this one object, so a state or control replaced here (a
    resumed run's `TrainerState`, a control returned by a callback) is the one every part reads next.

    Args:
        args: the training arguments the callbacks receive.
        handler: the HF callbacks and the objects passed to them.
    """

    def __init__(self, args: TrainingArguments, handler: HFCallbackHandler) -> None:
        self.args = args
        self.handler = handler
        self.state = TrainerState()
        self.control = TrainerControl()

    def start_state(self, plan: TrainingPlan, trainer: pl.Trainer) -> None:
        """A fresh `TrainerState` for a fit (T:1682-1689), at the trainer's step."""
        exportable = [cb for cb in [*self.handler.callbacks, self.control] if isinstance(cb, ExportableState)]
        # HF annotates the intervals `int` and `stateful_callbacks` as TrainerCallbacks, but passes what we pass: an
        # interval as given (1.0 stays a float in trainer_state.json) and the control among the exportable states.
        self.state = TrainerState(
            max_steps=plan.max_steps,
            num_train_epochs=plan.num_train_epochs,
            logging_steps=plan.logging_steps,  # type: ignore[arg-type]  # see above
            eval_steps=plan.eval_steps,  # type: ignore[arg-type]  # see above
            save_steps=plan.save_steps,  # type: ignore[arg-type]  # see above
            train_batch_size=self.args.per_device_train_batch_size,
            is_local_process_zero=trainer.local_rank == 0,
            is_world_process_zero=trainer.is_global_zero,
            stateful_callbacks=exportable,  # type: ignore[arg-type]  # see above
        )
        self.state.global_step = trainer.global_step

    def event(self, name: str, **extra: Any) -> None:
        """Call the HF callbacks' `name` event with HF's arguments; their returned control replaces ours."""
        self.control = self.handler.call(name, self.args, self.state, self.control, **extra)


class HFLoopSteps:
    """HF's log / evaluate / save steps of an update, and the loop methods they call (see the module docstring).

    Args:
        args: the training arguments.
        hf: the run's HF state, control and callbacks.
        evaluator: runs the evaluations.
        checkpoints: writes the checkpoints, keeps the best metric (and steps the plateau scheduler).
        loss: the training-loss window.
        flos: the FLOPs counter.
        tokens: the input-token and throughput entries.
        flow: the Lightning callback the steps belong to (its state is not saved in `lightning_state.pt`).
        owner: the object whose overridden HF loop methods run in place of the built-ins (an `hf_lightning.Trainer`),
            or None.
        overridden: the names its class overrides (only those among `LOOP_METHODS` matter).

    Attributes:
        ignore_keys_for_eval: `train(ignore_keys_for_eval=...)`, used by every evaluation during training.
    """

    def __init__(
        self, args: TrainingArguments, hf: HFRun, evaluator: HFEvaluator, checkpoints: Checkpoints,
        loss: TrainLossTracker, flos: FlopsCounter, tokens: TokenLogs, flow: Callback,
        owner: HFLoopHooks | None = None, overridden: frozenset[str] = frozenset(),
    ) -> None:
        self.args = args
        self.hf = hf
        self.evaluator = evaluator
        self.checkpoints = checkpoints
        self.loss = loss
        self.flos = flos
        self.tokens = tokens
        self._flow = flow
        self.owner = owner
        self._overridden = overridden & LOOP_METHODS
        self.ignore_keys_for_eval: list[str] | None = None
        self.train_start = 0.0
        self._running: tuple[pl.Trainer, pl.LightningModule] | None = None
        self.memory_tracker: TrainerMemoryTracker | None = None
        """The owner's HF `TrainerMemoryTracker` (`skip_memory_metrics=False`): the train summary gets its metrics."""

    def __getstate__(self) -> dict[str, Any]:
        """A pickled or deep-copied flow runs the built-ins: the owner (the whole `Trainer`) stays out."""
        state = dict(self.__dict__)
        state["owner"], state["_running"] = None, None
        return state

    def _override(self, name: str) -> HFLoopHooks | None:
        """The owner, when its class overrides the loop method `name` or the instance itself holds one (a method
        patched onto the trainer, as HF's tests patch `trainer._evaluate`); else None (the built-in runs)."""
        if self.owner is None:
            return None
        patched = name in LOOP_METHODS and name in getattr(self.owner, "__dict__", {})
        return self.owner if name in self._overridden or patched else None

    # ----- the fit the steps run in -----
    def start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A fit starts: the steps run against this trainer and module until `end`."""
        self._running = (trainer, pl_module)
        self.train_start = time.time()

    def end(self) -> None:
        self._running = None

    @property
    def is_running(self) -> bool:
        """Whether a fit is running (between `on_train_start` and `on_train_end`)."""
        return self._running is not None

    def _run(self) -> tuple[pl.Trainer, pl.LightningModule]:
        if self._running is None:
            raise RuntimeError("This step of HF's training loop runs only inside train() (no fit is running).")
        return self._running

    # ----- HF's loop methods -----
    def num_examples(self, loader: Any) -> int | None:
        """HF's `num_examples(loader)` (the owner's override when there is one); None for an unsized loader."""
        if not is_sized(loader):
            return None
        if (owner := self._override("num_examples")) is not None:
            return int(owner.num_examples(loader))
        return num_examples(loader, self.args.per_device_train_batch_size)

    def count_flos(self, model: nn.Module, window: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """HF's `floating_point_ops` of every micro-batch of the update (the owner's override when there is one)."""
        if (owner := self._override("floating_point_ops")) is None:
            self.flos.add_window(model, window)
            return
        for micro in [window] if isinstance(window, Mapping) else window:
            self.flos.current += float(owner.floating_point_ops(micro))

    def log(self, trainer: pl.Trainer | None, logs: dict[str, Any], start_time: float | None = None) -> None:
        """HF's `Trainer.log`: the owner's override when there is one, else `record_log`."""
        if (owner := self._override("log")) is None:
            self.record_log(trainer, logs, start_time)
        elif start_time is not None:  # HF passes `start_time` for the training-loss entry only
            owner.log(logs, start_time)
        else:
            owner.log(logs)

    def log_train_summary(self, trainer: pl.Trainer, max_steps: int) -> dict[str, Any]:
        """The train summary entry of `_finalize_training` (T:2001-2022), logged (with "epoch", as HF's
        `TrainOutput.metrics` has it); returns it."""
        state, args = self.hf.state, self.args
        steps = state.global_step - self.loss.initial_step
        train_loss = self.loss.train_loss(trainer.strategy, state.global_step)
        total_batch = total_train_batch(args, trainer.world_size)
        examples = self.num_examples(datamodule_of(trainer).train_loader())
        num_samples: float
        if args.max_steps > 0 or examples is None:
            num_samples = max_steps * total_batch
        else:  # T:2539-2542
            num_samples = examples * args.num_train_epochs
        self.flos.store(state, trainer)
        metrics = train_summary(self.train_start, num_samples, steps, max_steps, state.total_flos, train_loss)
        self.tokens.summary(metrics, trainer.strategy, state.total_flos)
        tracker = self.memory_tracker
        if tracker is not None and not tracker.skip_memory_metrics:  # HF's `_finalize_training` adds them here
            tracker.stop("train")
            tracker.update_metrics("train", metrics)
        self.log(trainer, metrics)
        return metrics

    def record_log(self, trainer: pl.Trainer | None, logs: dict[str, Any], start_time: float | None = None) -> None:
        """The built-in `Trainer.log` (T:4189-4211): add `epoch` and `num_input_tokens_seen` (tokens_seen.py; with this
        call's tokens/s when `start_time` is given), append to `log_history` with `step`, `on_log`, write to the
        Lightning loggers with HF's TensorBoard tag names."""
        state = self.hf.state
        if state.epoch is not None:
            logs["epoch"] = state.epoch
        self.tokens.annotate(logs, state, start_time)
        state.log_history.append({**logs, "step": state.global_step})
        self.hf.event("on_log", logs=logs)
        numeric = {
            tensorboard_tag(k): v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        for lightning_logger in trainer.loggers if trainer is not None else []:
            lightning_logger.log_metrics(numeric, step=state.global_step)

    # ----- what HF tells the user -----
    def announce_training(self, trainer: pl.Trainer, model: nn.Module, plan: TrainingPlan,
                          resumed_at: ResumePosition | None) -> None:
        """HF's "***** Running training *****" header (T:1606-1638), and where a resumed run starts."""
        args = self.args
        total_batch = total_train_batch(args, trainer.world_size)
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
        """HF's evaluation-loop header (T:2957-2962) for one dataset."""
        description = "Prediction" if is_prediction else "Evaluation"
        for line in evaluation_header(description, self.num_examples(loader), self.args.per_device_eval_batch_size):
            logger.info(line)

    # ----- after each update -----
    def maybe_log_save_evaluate(self, pl_module: pl.LightningModule, update: UpdateReport, epoch: int) -> None:
        """`Trainer._maybe_log_save_evaluate`, the owner's override when there is one (with HF's arguments)."""
        if (owner := self._override("_maybe_log_save_evaluate")) is None:
            self.log_save_evaluate_now(update.grad_norm, update.learning_rate)
            return
        owner._maybe_log_save_evaluate(
            self.loss.window, update.grad_norm, flow_model(pl_module), None, epoch, self.ignore_keys_for_eval,
            self.train_start, learning_rate=update.learning_rate,
        )

    def log_save_evaluate_now(self, grad_norm: float | None, learning_rate: float | None,
                              tr_loss: torch.Tensor | None = None) -> None:
        """The built-in `_maybe_log_save_evaluate` (T:2238-2286): log, then evaluate, then save.

        Args:
            grad_norm: the update's gradient norm (logged as `grad_norm`).
            learning_rate: the LR the update used (logged as `learning_rate`; None: the optimizer's current one).
            tr_loss: the running training-loss sum HF passes; a tensor other than the flow's own replaces it.
        """
        trainer, pl_module = self._run()
        if isinstance(tr_loss, torch.Tensor) and tr_loss is not self.loss.window:
            self.loss.window = tr_loss
        if self.hf.control.should_log and self.hf.state.global_step > self.loss.last_logged_step:
            self._log_training(trainer, grad_norm, learning_rate)
        new_best: bool | None = None  # None: this pass does not evaluate
        if self.hf.control.should_evaluate:
            new_best = self.evaluate_step(trainer, during_training=True)
        control, step = self.hf.control, self.hf.state.global_step
        control.should_save = saves_now(self.checkpoints.policy, step, control.should_save, new_best)  # the plan's
        if self.hf.control.should_save:
            self.save(trainer, pl_module)

    def save(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """HF's `_save_checkpoint(model, trial)` (T:3363) then `on_save`: this update's checkpoint. A library's
        override (TRL's writes its model card, then calls `super()`) runs at HF's point; the built-in writes it."""
        if (owner := self._override("_save_checkpoint")) is not None:
            owner._save_checkpoint(flow_model(pl_module), owner._trial)
        else:
            self.save_checkpoint_now()
        self.hf.event("on_save")

    def save_checkpoint_now(self) -> None:
        """The built-in `_save_checkpoint`: store the FLOPs, write `checkpoint-<global_step>` (crash-safe, with its
        manifest), move the best pointer, rotate (`checkpoint/write.py`).

        Raises:
            RuntimeError: no fit is running (HF's `_save_checkpoint` runs only inside its training loop too).
        """
        trainer, pl_module = self._run()
        state = self.hf.state
        self.flos.store(state, trainer)
        self.checkpoints.save(trainer, pl_module, state, [*self.hf.handler.callbacks, self.hf.control],
                              epoch_ending=self.hf.control.should_epoch_stop, skip_callbacks=(self._flow,))

    def load_best_now(self) -> None:
        """The built-in `_load_best_model` of the running fit: the (verified) best checkpoint's weights."""
        trainer, pl_module = self._run()
        self.checkpoints.load_best_now(trainer, flow_model(pl_module), self.hf.state)

    def _log_training(self, trainer: pl.Trainer, grad_norm: float | None, learning_rate: float | None) -> None:
        """The training-loss entry (T:2250-2274): `loss`, `grad_norm` of the last update, LR of the update just done."""
        state = self.hf.state
        logs: dict[str, Any] = {"loss": self.loss.pop_log_value(trainer.strategy, state.global_step)}
        if grad_norm is not None:
            logs["grad_norm"] = float(grad_norm)
        if learning_rate is None and trainer.optimizers:
            learning_rate = float(trainer.optimizers[0].param_groups[0]["lr"])
        if learning_rate is not None:
            logs["learning_rate"] = learning_rate
        self.flos.store(state, trainer)
        self.tokens.training_entry(logs, trainer.strategy, state.total_flos)
        self.log(trainer, logs, start_time=self.train_start)

    # ----- evaluation during training -----
    def evaluate_step(self, trainer: pl.Trainer, during_training: bool) -> bool:
        """`Trainer._evaluate` (the owner's override when there is one) + `_determine_best_metric`; True on a new
        best."""
        # with an owner, its `evaluate` decides, as HF's (whose `get_eval_dataloader` raises without an eval dataset;
        # sentence-transformers' returns an empty loader when it has an evaluator instead)
        if self.owner is None and not datamodule_of(trainer).eval_datasets:
            raise ValueError(
                "Trainer: evaluation requires an eval_dataset. `control.should_evaluate` was set at step "
                f"{self.hf.state.global_step} but no eval_dataset was given."
            )
        skip_scheduler = not during_training  # `eval_on_start`: no plateau step, no best metric (T:1655-1656)
        started = time.perf_counter()
        if (owner := self._override("_evaluate")) is not None:
            metrics = owner._evaluate(None, self.ignore_keys_for_eval, skip_scheduler=skip_scheduler)
        else:
            if self.owner is not None:  # HF's `evaluate()`, dataset by dataset, with the owner's loaders
                metrics = self.owner.evaluate(ignore_keys=self.ignore_keys_for_eval)
            else:
                metrics = self.evaluate_now(EvalRequest(ignore_keys=self.ignore_keys_for_eval)).metrics
            if not skip_scheduler:
                self.step_plateau_scheduler(metrics)
        self.tokens.exclude(time.perf_counter() - started)  # tokens/s counts training time only
        if not metrics:  # nothing was evaluated, so no `on_evaluate` cleared the request
            self.hf.control.should_evaluate = False
        if not during_training:
            return False
        return self.checkpoints.update_best(self.hf.state, metrics)

    def evaluate_now(self, request: EvalRequest) -> EvaluationOutput:
        """Run Lightning's validation loop now, inside `fit` (HF's `evaluate()` during `train()`): every dataset's
        result.

        The eval loaders are asked for again (`get_eval_dataloader` runs at every evaluation, as HF's).
        """
        trainer, _ = self._run()
        reload_validation_data(trainer)
        return self.evaluator.evaluate_during_fit(trainer, request)

    def step_plateau_scheduler(self, metrics: dict[str, Any]) -> None:
        """A `ReduceLROnPlateau` steps on the best-model metric after a training-time evaluation (T:3322-3339)."""
        trainer, _ = self._run()
        self.checkpoints.step_plateau_scheduler(trainer, metrics)
