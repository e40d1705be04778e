"""`hf_lightning.Trainer`: the `transformers.Trainer` constructor and methods, built from the Lightning pieces.

The facade only assembles: a `TransformerModule`, a `TransformerDataModule`, the `HFTrainerFlow` callback and a
`lightning.Trainer` (with `lightning_kwargs` forwarded). Every behaviour lives in those pieces, so the CLI and a
hand-built `lightning.Trainer` get the same results.

The pieces call HF's overridable methods on the trainer (`trainer/step_hooks.py`, `trainer/data_hooks.py`,
`trainer/loop_hooks.py`), so a subclass overrides them as it would a `transformers.Trainer`'s; an override that
cannot be honoured is refused at construction (`trainer/overrides.py`).
"""

from __future__ import annotations

import inspect
import json
import os
import warnings
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar
from torch import nn
from transformers.debug_utils import DebugUnderflowOverflow
from transformers.integrations.integration_utils import KubeflowCallback
from transformers.trainer_utils import PredictionOutput, TrainerMemoryTracker, TrainOutput
from transformers.utils import logging as hf_logging

from hf_lightning.args import HF_BUILT_OPTIMIZERS, TrainingArguments
from hf_lightning.args.accelerator_config import apply_accumulation_steps
from hf_lightning.args.from_transformers import from_hf_training_arguments
from hf_lightning.args.to_lightning import lightning_trainer_kwargs, unknown_lightning_option
from hf_lightning.callbacks.jit_checkpoint import LightningJITCheckpointCallback
from hf_lightning.checkpoint.checks import output_dir_problem
from hf_lightning.checkpoint.distributed import full_model_state_dict
from hf_lightning.checkpoint.final_model import TRAINING_ARGS_NAME, final_save_advice
from hf_lightning.checkpoint.find import resolve_resume
from hf_lightning.checkpoint.io import CHECKPOINT_ADVICE, TMP_PREFIX, save_model_files, torch_save
from hf_lightning.checkpoint.sharded import gather_full_weights
from hf_lightning.data.datamodule import TransformerDataModule
from hf_lightning.data.sampling import dataset_length
from hf_lightning.flow.messages import MAX_STEPS_OVERRIDE, console_callback, logger
from hf_lightning.module.evaluation import EVAL_LOSS_WEIGHTINGS, EvalRequest
from hf_lightning.module.metrics import is_streaming_metric
from hf_lightning.module.module import TransformerModule
from hf_lightning.plan import unreachable_best_metric
from hf_lightning.run_options.memory_plan import MemoryPlan
from hf_lightning.run_options.seeding import seed_as_hf
from hf_lightning.trainer.accelerate_state import provide_accelerate_state
from hf_lightning.trainer.as_transformers import default_lightning_kwargs, is_using_hf_lightning
from hf_lightning.trainer.data_hooks import DataHooks
from hf_lightning.trainer.eval_loop import LOOP_OVERRIDES, EvalLoopHooks
from hf_lightning.trainer.hp_search import HyperparameterSearchMixin
from hf_lightning.trainer.lightning_trainer import (
    build_flow,
    build_lightning_trainer,
    fit_with_batch_search,
    is_hf_callback,
    split_callbacks,
)
from hf_lightning.trainer.loop_hooks import LoopHooks
from hf_lightning.trainer.memory_plan import MemoryPlanWarning, build_memory_plan, print_memory_plan_line
from hf_lightning.trainer.overrides import METRIC_SOURCES, check_overrides, deepspeed_refusals, overridden_methods
from hf_lightning.trainer.rollout_state import RolloutBufferState, has_rollout_buffer
from hf_lightning.trainer.script_api import PassedArguments, ScriptApiMixin
from hf_lightning.trainer.step_hooks import StepHooks

__all__ = ["Trainer"]

MODEL_FILE_WRITERS = frozenset({"save_model", "_save"})
"""Overrides that write each checkpoint's model files (through `save_model(folder, _internal_call=True)`, as HF)."""


def _deepspeed_config(args: TrainingArguments, lightning_kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The DeepSpeed config of the run: `args.deepspeed` (a dict or a JSON file) or the strategy object's."""
    strategy = lightning_kwargs.get("strategy")
    if "DeepSpeed" in type(strategy).__name__:
        return dict(getattr(strategy, "config", None) or {})
    value = args.deepspeed
    if isinstance(value, str) and os.path.isfile(value):
        with open(value) as f:
            value = json.load(f)
    return dict(value) if isinstance(value, Mapping) else None


def _as_list(trainer_kwargs: Mapping[str, Any]) -> list[Any]:
    """The Lightning callbacks passed in `lightning_kwargs["callbacks"]`."""
    callbacks = trainer_kwargs.get("callbacks") or []
    return list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]


def _integration_callbacks(args: TrainingArguments) -> list[Any]:
    """HF's integration callbacks for the `report_to` names served by one (`args.report_to.HF_CALLBACK_INTEGRATIONS`):
    `kubeflow` is HF's `KubeflowCallback`, driven by the flow like any `TrainerCallback`."""
    return [KubeflowCallback()] if "kubeflow" in (args.report_to or []) else []


def _asks_for_lightning_bar(lightning_kwargs: Mapping[str, Any], lightning_callbacks: list[Any]) -> bool:
    """Whether the user asked for Lightning's progress bar: `enable_progress_bar=True` or a `ProgressBar` callback."""
    return bool(lightning_kwargs.get("enable_progress_bar")) or any(
        isinstance(cb, ProgressBar) for cb in lightning_callbacks)


def _check_arguments(
    args: TrainingArguments, train_dataset: Any, eval_dataset: Any, compute_metrics: Callable[..., Any] | None,
    eval_loss_weighting: str, optimizers: tuple[Any, Any] = (None, None),
    optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None,
    model_init: Callable[..., nn.Module] | None = None,
) -> None:
    """The constructor's checks of the arguments against each other, with HF's words where HF makes them.

    Raises:
        ValueError: an unsized `train_dataset` without `max_steps`; an `eval_strategy` without `eval_dataset`; an
            unknown `eval_loss_weighting`; a `batch_eval_metrics` function without `compute_result`.
        RuntimeError: `optimizers` with `optimizer_cls_and_kwargs` or with `model_init` (HF's errors, T:693-700).
    """
    if optimizer_cls_and_kwargs is not None and optimizers[0] is not None:
        raise RuntimeError("Passing both `optimizers` and `optimizer_cls_and_kwargs` arguments is incompatible.")
    if model_init is not None and (optimizers[0] is not None or optimizers[1] is not None):
        raise RuntimeError(
            "Passing a `model_init` is incompatible with providing the `optimizers` argument. You should subclass "
            "`Trainer` and override the `create_optimizer_and_scheduler` method."
        )
    if train_dataset is not None and dataset_length(train_dataset) is None and args.max_steps <= 0:
        # HF raises this in `Trainer.__init__` (T:728-733), not at `train()`: same place, same words.
        raise ValueError(
            "The train_dataset does not implement __len__, so the number of training steps cannot be inferred; "
            "max_steps has to be specified. The total number of steps must be known in advance to bound the "
            f"training loop and to configure the learning rate scheduler (got max_steps={args.max_steps})."
        )
    if args.eval_strategy != "no" and eval_dataset is None:
        raise ValueError(
            f"You have set `args.eval_strategy` to {args.eval_strategy} but you didn't pass an "
            "`eval_dataset` to `Trainer`. Either set `args.eval_strategy` to `no` or pass an `eval_dataset`."
        )
    if eval_loss_weighting not in EVAL_LOSS_WEIGHTINGS:
        raise ValueError(f"`eval_loss_weighting` must be one of {EVAL_LOSS_WEIGHTINGS}, got {eval_loss_weighting!r}.")
    if args.batch_eval_metrics and compute_metrics is not None and not is_streaming_metric(compute_metrics) \
            and "compute_result" not in inspect.signature(compute_metrics).parameters:
        raise ValueError(
            "When using `batch_eval_metrics`, your `compute_metrics` function must take a `compute_result`"
            " boolean argument which will be triggered after the last batch of the eval set to signal that"
            " the summary statistics should be returned by the function."
        )


class Trainer(StepHooks, DataHooks, LoopHooks, EvalLoopHooks, ScriptApiMixin, HyperparameterSearchMixin):
    """Drop-in for `transformers.Trainer` with Lightning underneath.

    Subclass it and override HF's methods as for a `transformers.Trainer` (README "Subclassing the Trainer"): the
    Lightning pieces call them where HF's loop does.

    Args:
        model: the model to train (or None with `model_init`).
        args: `hf_lightning.TrainingArguments` or a `transformers.TrainingArguments` (converted; unsupported
            non-default fields are reported together).
        data_collator: collator; defaults to HF's choice for `processing_class`.
        train_dataset: training data.
        eval_dataset: one dataset or a dict of named datasets.
        processing_class: tokenizer / processor.
        model_init: a function returning a fresh model for every `train()` call (given the trial when it takes
            one argument, during `hyperparameter_search`).
        compute_loss_func: `fn(outputs, labels, num_items_in_batch=...)` computing the loss from the model outputs.
        compute_metrics: `fn(EvalPrediction) -> dict`, or a torchmetrics `Metric` / `MetricCollection` (streaming).
        callbacks: `transformers.TrainerCallback`s and/or Lightning callbacks.
        optimizers: a user `(optimizer, scheduler)` pair.
        optimizer_cls_and_kwargs: `(optimizer class, kwargs)` used instead of `args.optim` (with HF's groups).
        preprocess_logits_for_metrics: `fn(logits, labels) -> tensor`, per eval batch.
        lightning_kwargs: forwarded to `lightning.Trainer` (accelerator, devices, strategy, precision, logger...);
            None: those given to `use_as_transformers_trainer` (a library trainer's constructor has no such
            parameter), else none.
        eval_loss_weighting: "samples" (HF's `eval_loss`) or "tokens" (mean over every label token; README
            "Evaluation and prediction").

    Attributes:
        module_class: the LightningModule class to build (`Seq2SeqTrainer`: `Seq2SeqTransformerModule`).
        lightning_trainer: the `lightning.Trainer` of the last `train()` / `evaluate()` / `predict()` call.

    Raises:
        TypeError: the subclass overrides an HF method that cannot be honoured (`trainer/overrides.py`).
    """

    module_class: type[TransformerModule] = TransformerModule
    hub_model_id: str | None = None
    """HF's `hub_model_id` (the repository `init_hf_repo` creates for `push_to_hub`): always None, there is no hub
    access here; library model cards read it (TRL's `create_model_card`)."""

    def __init__(
        self,
        model: nn.Module | None = None,
        args: PassedArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        model_init: Callable[..., nn.Module] | None = None,
        compute_loss_func: Callable[..., Any] | None = None,
        compute_metrics: Callable[..., dict] | None = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
        lightning_kwargs: dict[str, Any] | None = None,
        eval_loss_weighting: str = "samples",
    ) -> None:
        self.args = self._resolve_args(args)
        # HF's memory metrics (`skip_memory_metrics=False`): HF's own tracker, started and stopped where HF's Trainer
        # does (it names its stage after the calling method: `__init__`, `train`, `evaluate`, `predict`)
        self._memory_tracker = TrainerMemoryTracker(self.args.skip_memory_metrics)
        self._memory_tracker.start()
        apply_accumulation_steps(self.args)  # HF's Trainer rule for `gradient_accumulation_kwargs["num_steps"]`
        # a library trainer's constructor (TRL's) has no `lightning_kwargs`: the ones given to
        # `use_as_transformers_trainer` stand in
        self.lightning_kwargs = dict(default_lightning_kwargs() if lightning_kwargs is None else lightning_kwargs)
        lightning_options = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
        if (problem := unknown_lightning_option(self.lightning_kwargs, lightning_options)) is not None:
            raise ValueError(problem)  # here, naming it: not Lightning's TypeError when the trainer is built
        # every override checked before anything is built: one error naming all that cannot be honoured
        check_overrides(type(self), deepspeed_refusals(_deepspeed_config(self.args, self.lightning_kwargs)))
        self._overridden = frozenset(overridden_methods(type(self)))
        own_save = sorted(self._overridden & MODEL_FILE_WRITERS)
        if self.args.save_async and own_save:
            # an override writes from the live model on the training thread; a background save writes CPU copies
            raise ValueError(f"save_async=True cannot be combined with an overridden {' / '.join(own_save)}: each "
                             "checkpoint's model files are written by your override while training waits, so the save "
                             "would not run in the background. Use save_async=False, or remove the override.")
        hf_logging.set_verbosity(self.args.get_process_log_level())  # as HF's Trainer.__init__ does
        seed_as_hf(self.args)  # `enable_full_determinism` with `full_determinism`, as HF
        if is_using_hf_lightning():  # library code after our constructor reads accelerate's state, as HF's leaves it
            provide_accelerate_state(self.args)
        if (problem := output_dir_problem(self.args.resolved_output_dir)) is not None:
            raise ValueError(problem)  # here, not at the first save after `save_steps` updates
        self.model_init = model_init
        if model is None:
            if model_init is None:
                raise ValueError("`Trainer` requires either a `model` or `model_init` argument (both are None).")
            model = self.call_model_init()
        _check_arguments(self.args, train_dataset, eval_dataset, compute_metrics, eval_loss_weighting, optimizers,
                         optimizer_cls_and_kwargs, model_init)
        if self.args.max_steps > 0 and self.args.num_train_epochs > 0:
            logger.info(MAX_STEPS_OVERRIDE)
        self.eval_loss_weighting = eval_loss_weighting
        self.processing_class = processing_class
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self._module_kwargs: dict[str, Any] = {"compute_loss_func": compute_loss_func,
                                               "optimizer_cls_and_kwargs": optimizer_cls_and_kwargs}
        self.datamodule = TransformerDataModule(
            train_dataset=train_dataset, eval_dataset=eval_dataset, args=self.args,
            data_collator=data_collator, processing_class=processing_class, loader_owner=self,
            columns_owner=self,
        )
        self._eval_dataset = eval_dataset
        hf_callbacks, self._lightning_callbacks = split_callbacks(callbacks)
        if has_rollout_buffer(self):  # TRL's GRPO / RLOO: the rollout buffer and position go into each checkpoint
            self._lightning_callbacks.append(RolloutBufferState(self))  # type: ignore[arg-type]  # checked above
        self._trainer_kwargs = lightning_trainer_kwargs(self.args, self.lightning_kwargs, model)
        # One progress bar: HF's console (its log dicts printed by its printer, or written above its progress bar),
        # unless `lightning_kwargs` / `callbacks` ask for Lightning's bar (callbacks/progress_bar.py) instead
        lightning_callbacks = [*self._lightning_callbacks, *_as_list(self._trainer_kwargs)]
        if _asks_for_lightning_bar(self.lightning_kwargs, lightning_callbacks):
            console = []
        else:
            console = [console_callback(bool(self.args.disable_tqdm))]  # resolved by the arguments (never None)
            self._trainer_kwargs["enable_progress_bar"] = False
        jit = [LightningJITCheckpointCallback()] if self.args.enable_jit_checkpoint else []  # HF's, in its place
        hf_callbacks = [*_integration_callbacks(self.args), *jit, *hf_callbacks]  # before the user's, as HF
        # the flow calls this trainer's overridden HF loop methods and its `evaluate` where HF's loop calls them
        self.flow = build_flow(self.args, [*hf_callbacks, *console], processing_class, owner=self,
                               overridden=self._overridden,
                               resume_hint="trainer.train(resume_from_checkpoint={path!r})")
        for callback in jit:
            callback.set_trainer(self)
        checkpoints = self.flow.checkpoints
        if own_save:  # HF's `_save_checkpoint` calls `save_model(folder, _internal_call=True)`, which calls `_save`
            checkpoints.write_model_files = lambda folder: self.save_model(folder, _internal_call=True)
        if "_load_from_checkpoint" in self._overridden:  # HF's call at a resume, after the folder is verified
            checkpoints.load_model_files = lambda folder, model: (
                self._load_from_checkpoint(folder) if model is None else self._load_from_checkpoint(folder, model))
        if "_load_optimizer_and_scheduler" in self._overridden:  # HF's call at a resume, after the restore
            checkpoints.after_restore = self._load_optimizer_and_scheduler
        if "_load_best_model" in self._overridden:  # HF's call at the end of train(), after the folder is verified
            checkpoints.load_best_model = self._load_best_model
        self.lightning_trainer: pl.Trainer | None = None
        self.module = self._build_module(model, optimizers)
        if self.args.optim in HF_BUILT_OPTIMIZERS and optimizers[0] is None and optimizer_cls_and_kwargs is None \
                and not self._overridden & {"create_optimizer", "get_optimizer_cls_and_kwargs"}:
            # HF's own handler builds it: its error for a missing package (bitsandbytes, torchao...) now, not after
            # the data is prepared
            self.module.get_optimizer_cls_and_kwargs(self.args, model)
        loss_only = self.module.prediction_loss_only(is_prediction=False)
        # checked when `train()` starts (HF raises a KeyError at the first evaluation, after training time is spent):
        # a method patched onto the instance after construction (HF's tests patch `trainer._evaluate`) may make
        # the metric
        self._best_metric_problem = None if self._overridden & METRIC_SOURCES else \
            unreachable_best_metric(self.args, self.datamodule.eval_dataset_names, loss_only)
        self.init_script_api(args)  # the user's arguments object, `output_dir` created (trainer/script_api.py)
        self.flow.hf_init_end(model)
        self.flow.steps.memory_tracker = self._memory_tracker  # the train summary gets the "train" stage's metrics
        self._memory_tracker.stop_and_update_metrics()

    @staticmethod
    def _resolve_args(args: PassedArguments | None) -> TrainingArguments:
        if args is None:
            return TrainingArguments(output_dir="tmp_trainer")
        if isinstance(args, TrainingArguments):
            return args
        return from_hf_training_arguments(args)

    def _build_module(self, model: nn.Module, optimizers: tuple[Any, Any] = (None, None)) -> TransformerModule:
        """The LightningModule around `model`, calling its HF hooks on this trainer."""
        module = self.module_class(
            model, self.args, optimizers=optimizers, compute_metrics=self.compute_metrics,
            preprocess_logits_for_metrics=self.preprocess_logits_for_metrics, processing_class=self.processing_class,
            **self._module_kwargs,
        )
        module.eval_loss_weighting = self.eval_loss_weighting
        for name, value in vars(self).get("_set_attributes", {}).items():  # HF computes these once (step_hooks.py)
            setattr(module, name, value)
        module.attach_hooks(self, self._overridden)
        self.datamodule.signature_model = model
        return module

    @property
    def model(self) -> nn.Module:
        """HF's `model`: the model being trained (replaced by `model_init`'s at every `train()`)."""
        return self.module.model

    @model.setter
    def model(self, model: nn.Module) -> None:
        if "module" not in vars(self):  # before `__init__` built the module: the constructor's model is used
            return
        if model is not self.module.model:
            self.module = self._build_module(model, (self.module.optimizer, self.module.lr_scheduler))
            self.flow.handler.model = model

    def _lightning_trainer(self) -> pl.Trainer:
        """A fresh `lightning.Trainer` for one run (a Lightning trainer runs one fit / validate / predict)."""
        self.lightning_trainer = build_lightning_trainer(self.flow, self._lightning_callbacks, self._trainer_kwargs)
        return self.lightning_trainer

    def add_callback(self, callback: Any) -> None:
        """Add an HF `TrainerCallback` or a Lightning callback."""
        if is_hf_callback(callback):
            self.flow.handler.add_callback(callback)
        else:
            self._lightning_callbacks.append(callback)

    def pop_callback(self, callback: Any) -> Any:
        """Remove and return the first callback of that class (or that instance), HF or Lightning; None if absent."""
        if is_hf_callback(callback):
            return self.flow.handler.pop_callback(callback)
        for existing in self._lightning_callbacks:
            if existing is callback or (isinstance(callback, type) and isinstance(existing, callback)):
                self._lightning_callbacks.remove(existing)
                return existing
        return None

    def remove_callback(self, callback: Any) -> None:
        """Remove the first callback of that class (nothing if there is none), or that instance, HF or Lightning.

        Raises:
            ValueError: `callback` is an instance the trainer does not hold (HF's `list.remove` error,
                `list.remove(x): x not in list`).
        """
        if is_hf_callback(callback):
            self.flow.handler.remove_callback(callback)
        elif isinstance(callback, type):
            self.pop_callback(callback)
        else:
            self._lightning_callbacks.remove(callback)

    # ----- the HF methods -----
    def train(self, resume_from_checkpoint: str | bool | None = None, ignore_keys_for_eval: list[str] | None = None
              ) -> TrainOutput:
        """Train; returns `TrainOutput(global_step, training_loss, metrics)`.

        Args:
            resume_from_checkpoint: a checkpoint folder (ours or `transformers.Trainer`'s), or True for the latest
                `checkpoint-<n>` in `output_dir`; None/False falls back to `args.resume_from_checkpoint`.
            ignore_keys_for_eval: output keys the evaluations during training drop from the predictions.

        Raises:
            ValueError: `resume_from_checkpoint=True` with no checkpoint in `output_dir`.
            FileNotFoundError: the checkpoint folder does not exist or is incomplete (names the missing file).
        """
        if self._best_metric_problem and not METRIC_SOURCES & vars(self).keys():
            raise ValueError(self._best_metric_problem)
        self._memory_tracker.start()  # stopped by the train summary (flow/steps.py), as HF's `_finalize_training`
        self.is_in_train = True
        try:
            if self.model_init is not None:
                seed_as_hf(self.args)  # as HF, before building the model (T:1484-1492)
                # the trial during `hyperparameter_search` (trainer/hp_search.py)
                model = self.call_model_init(self._trial)
                self.module = self._build_module(model)  # a fresh optimizer and scheduler (T:1489)
                self.flow.handler.model = model
            if "underflow_overflow" in self.args.debug:  # HF's `--debug underflow_overflow` (T:1543-1551)
                DebugUnderflowOverflow(self.module.model)  # forward hooks: stops at the first inf / nan, as HF
            resume = resolve_resume(self.args, resume_from_checkpoint) or False  # early, before anything is built
            if not self._overridden & {"get_train_dataloader", "_get_dataloader"}:  # a user loader: their columns
                self.datamodule.check_training_labels(module=self.module)  # one error here, not at the first update
            if self.args.auto_micro_batch:  # the memory plan's line before the run (issue 34)
                print_memory_plan_line(self.module, self.datamodule, self.args, self._trainer_kwargs)
            # the flow restores the HF-layout folder itself (checkpoint/restore.py), not via ckpt_path; with
            # `auto_find_batch_size` a run that ran out of memory starts again with a smaller batch
            # (run_options/batch_search.py)
            return fit_with_batch_search(self.args, resume, lambda: self.flow.fit(
                self._lightning_trainer(), self.module, self.datamodule, resume_from_checkpoint=resume,
                ignore_keys_for_eval=ignore_keys_for_eval))
        finally:
            self.is_in_train = False

    def memory_plan(self, micro_batch: int | None = None, seq_len: int | None = None, budget: int | None = None,
                    world_size: int | None = None) -> MemoryPlan:
        """The peak memory per device of one training update of this run, traced on fake tensors (nothing real is
        allocated), and the largest micro-batch that fits `budget` (README "Memory plan").

        Warns (`MemoryPlanWarning`, naming the numbers) when the peak does not fit `budget`.

        Args:
            micro_batch: samples per device per forward (default: `per_device_train_batch_size`).
            seq_len: the length of every per-token input (default: the longest training row).
            budget: bytes available per device (default: the device's free memory: CUDA's free memory, or the
                available RAM, plus what the model already holds there).
            world_size: processes sharing the update (default: from `WORLD_SIZE` or the Lightning `devices`).

        Raises:
            ValueError: no training rows, a precision or strategy the plan does not model (FSDP1, DeepSpeed), or a
                size below 1.
        """
        plan = build_memory_plan(self.module, self.datamodule, self.args, self._trainer_kwargs,
                                 micro_batch=micro_batch, seq_len=seq_len, budget=budget, world_size=world_size)
        if (warning := plan.warning()) is not None:
            warnings.warn(warning, MemoryPlanWarning, stacklevel=2)
        return plan

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """HF's `evaluate`: the metrics of `eval_dataset` (or the trainer's), with `epoch`; also what `train()`
        calls at every evaluation (through `_evaluate`).

        A dict of datasets is evaluated one dataset after another, each through `self.evaluate(name_or_dataset,
        metric_key_prefix=f"{metric_key_prefix}_{name}")`, as HF does (T:2850-2861).

        Raises:
            ValueError: there is no eval dataset.
        """
        self._memory_tracker.start()  # ignored inside train(), as HF's
        metrics = self._evaluate_metrics(eval_dataset, ignore_keys, metric_key_prefix)
        self._memory_tracker.stop_and_update_metrics(metrics)  # after the log entry, as HF's: the returned dict only
        return metrics

    def _evaluate_metrics(self, eval_dataset: Any, ignore_keys: list[str] | None, metric_key_prefix: str
                          ) -> dict[str, float]:
        """`evaluate`'s metrics (logged), before HF's memory metrics are added."""
        override = eval_dataset is not None
        dataset = eval_dataset if override else self.eval_dataset
        if isinstance(dataset, Mapping):
            metrics: dict[str, float] = {}
            for name, named in dataset.items():
                metrics.update(self.evaluate(named if override else name, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        if self._overridden & LOOP_OVERRIDES:  # HF's evaluate() body around the overridden loop; as in HF, the
            # loader decides whether evaluating without a dataset is an error (sentence-transformers' evaluator runs)
            return self._evaluate_through_loop(eval_dataset, ignore_keys, metric_key_prefix)
        if dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(dataset, str):
            dataset = self.datamodule.get_eval_dataset(dataset)
        request = EvalRequest(metric_key_prefix, ignore_keys, loss_per_batch=self._take_gather_function(None))
        with self.datamodule.evaluating(dataset, eval_dataset):  # its loader comes from `get_eval_dataloader`
            output = self.flow.evaluate_if_running(request)  # during train(): inside the running fit
            if output is not None:
                return output.metrics
            return self.flow.evaluate(self._lightning_trainer(), self.module, self.datamodule,
                                      request=request).metrics

    def predict(
        self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test"
    ) -> PredictionOutput:
        """Predict on `test_dataset`; returns `PredictionOutput(predictions, label_ids, metrics)`, logs nothing."""
        self._memory_tracker.start()
        if self._overridden & LOOP_OVERRIDES:  # HF's predict() body around the overridden loop
            output = self._predict_through_loop(test_dataset, ignore_keys, metric_key_prefix)
        else:
            per_batch = self._take_gather_function(None)
            with self.datamodule.predicting(test_dataset):  # its loader comes from `get_test_dataloader`
                result = self.flow.predict(self._lightning_trainer(), self.module, self.datamodule, ignore_keys,
                                           metric_key_prefix, loss_per_batch=per_batch)
            output = PredictionOutput(predictions=result.predictions, label_ids=result.label_ids,
                                      metrics=result.metrics)
        if output.metrics is not None:
            self._memory_tracker.stop_and_update_metrics(output.metrics)
        return output

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Write the model (and tokenizer, `training_args.bin`) to `output_dir` (default: `args.output_dir`) through
        `self._save`, as HF's; also called for each checkpoint's model files (`_internal_call=True`) when a subclass
        overrides it or `_save`.

        Under FSDP / ZeRO-3 call it on every process (the full weights are gathered); the global-zero process calls
        `_save` with them.
        """
        trainer = self.lightning_trainer
        folder = output_dir or self.args.resolved_output_dir
        gather = partial(gather_full_weights, trainer.strategy) if trainer is not None else full_model_state_dict
        full_state = gather(self.model)  # a collective under FSDP / ZeRO-3; None for a plain model
        if trainer is None or trainer.is_global_zero:
            self._save(folder, state_dict=full_state)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        """HF's `_save`: the model's `save_pretrained` files (with `state_dict` when given: the gathered weights of a
        sharded model), the processing class and `training_args.bin`, into `output_dir` (default
        `args.output_dir`). Called by `save_model` on the global-zero process only (HF calls it on every process,
        whose others return at once); an override (sentence-transformers' writes its own layout) writes every
        checkpoint's model files too, into the temporary folder that is renamed once the checkpoint is complete."""
        folder = Path(output_dir if output_dir is not None else self.args.resolved_output_dir)
        logger.info(f"Saving model checkpoint to {folder}")
        # a full disk: a checkpoint's unfinished folder is removed by the saver, the final model is written in place
        advice = CHECKPOINT_ADVICE if folder.name.startswith(TMP_PREFIX) else final_save_advice(folder)
        save_model_files(self.model, folder, self.processing_class, state_dict=state_dict, advice=advice)
        torch_save(self.passed_args, folder / TRAINING_ARGS_NAME, advice=advice)
