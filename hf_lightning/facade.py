"""`hf_lightning.Trainer`: the `transformers.Trainer` constructor and methods, built from the Lightning pieces.

The facade only assembles: a `TransformerModule`, a `TransformerDataModule`, the `HFTrainerFlow` callback and a
`lightning.Trainer` (with `lightning_kwargs` forwarded). Every behaviour lives in those pieces, so the CLI and a
hand-built `lightning.Trainer` get the same results.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

import lightning.pytorch as pl
from torch import nn
from transformers.trainer_utils import PredictionOutput, TrainOutput
from transformers.utils import logging as hf_logging

from hf_lightning.args import TrainingArguments
from hf_lightning.args.from_transformers import from_hf_training_arguments
from hf_lightning.args.to_lightning import lightning_trainer_kwargs
from hf_lightning.callbacks.best_model import unreachable_best_metric
from hf_lightning.checkpointing.checks import output_dir_problem
from hf_lightning.checkpointing.final_model import save_final_model
from hf_lightning.data.datamodule import TransformerDataModule
from hf_lightning.data.sampling import dataset_length
from hf_lightning.evaluation import EVAL_LOSS_WEIGHTINGS
from hf_lightning.lightning_trainer import (
    build_flow,
    build_lightning_trainer,
    fit_with_batch_search,
    is_hf_callback,
    split_callbacks,
)
from hf_lightning.metrics import is_streaming_metric
from hf_lightning.module import TransformerModule
from hf_lightning.parallel.checkpoint import gather_full_weights
from hf_lightning.resume.find import resolve_resume
from hf_lightning.seeding import seed_as_hf

__all__ = ["Trainer"]


def _check_arguments(
    args: TrainingArguments, train_dataset: Any, eval_dataset: Any, compute_metrics: Any, eval_loss_weighting: str
) -> None:
    """The constructor's checks of the arguments against each other, with HF's words where HF makes them.

    Raises:
        ValueError: an unsized `train_dataset` without `max_steps`; an `eval_strategy` without `eval_dataset`; an
            unknown `eval_loss_weighting`; a `batch_eval_metrics` function without `compute_result`.
    """
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


class Trainer:
    """Drop-in for `transformers.Trainer` with Lightning underneath.

    Args:
        model: the model to train (or None with `model_init`).
        args: `hf_lightning.TrainingArguments` or a `transformers.TrainingArguments` (converted; unsupported
            non-default fields are reported together).
        data_collator: collator; defaults to HF's choice for `processing_class`.
        train_dataset: training data.
        eval_dataset: one dataset or a dict of named datasets.
        processing_class: tokenizer / processor.
        model_init: a function returning a fresh model for every `train()` call.
        compute_metrics: `fn(EvalPrediction) -> dict`, or a torchmetrics `Metric` / `MetricCollection` (streaming).
        callbacks: `transformers.TrainerCallback`s and/or Lightning callbacks.
        optimizers: a user `(optimizer, scheduler)` pair.
        preprocess_logits_for_metrics: `fn(logits, labels) -> tensor`, per eval batch.
        lightning_kwargs: forwarded to `lightning.Trainer` (accelerator, devices, strategy, precision, logger...).
        eval_loss_weighting: "samples" (HF's `eval_loss`) or "tokens" (mean over every label token; README
            "Evaluation and prediction").

    Attributes:
        module_class: the LightningModule class to build; set it to your `TransformerModule` subclass to use
            overridden `compute_loss` / `prediction_step`.
    """

    module_class: type[TransformerModule] = TransformerModule

    def __init__(
        self,
        model: nn.Module | None = None,
        args: Any = None,
        data_collator: Callable | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        model_init: Callable[[], nn.Module] | None = None,
        compute_metrics: Callable[..., dict] | None = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        preprocess_logits_for_metrics: Callable | None = None,
        lightning_kwargs: dict[str, Any] | None = None,
        eval_loss_weighting: str = "samples",
    ) -> None:
        self.args = self._resolve_args(args)
        hf_logging.set_verbosity(self.args.get_process_log_level())  # as HF's Trainer.__init__ does
        seed_as_hf(self.args)  # `enable_full_determinism` with `full_determinism`, as HF
        if (problem := output_dir_problem(self.args.resolved_output_dir)) is not None:
            raise ValueError(problem)  # here, not at the first save after `save_steps` updates
        if model is None:
            if model_init is None:
                raise ValueError("`Trainer` requires either a `model` or `model_init` argument (both are None).")
            model = model_init()
        _check_arguments(self.args, train_dataset, eval_dataset, compute_metrics, eval_loss_weighting)
        self.eval_loss_weighting = eval_loss_weighting
        plain_function = compute_metrics is not None and not is_streaming_metric(compute_metrics)
        if self.args.batch_eval_metrics and plain_function and compute_metrics is not None \
                and "compute_result" not in inspect.signature(compute_metrics).parameters:
            raise ValueError(
                "When using `batch_eval_metrics`, your `compute_metrics` function must take a `compute_result`"
                " boolean argument which will be triggered after the last batch of the eval set to signal that"
                " the summary statistics should be returned by the function."
            )
        self.model = model
        self.model_init = model_init
        self.processing_class = processing_class
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizers = optimizers
        self.datamodule = TransformerDataModule(
            train_dataset=train_dataset, eval_dataset=eval_dataset, args=self.args,
            data_collator=data_collator, processing_class=processing_class,
        )
        self.module = self._build_module(model)
        loss_only = self.module.prediction_loss_only(is_prediction=False)
        problem = unreachable_best_metric(self.args, self.datamodule.eval_dataset_names, loss_only)
        if problem:  # HF raises a KeyError at the first evaluation, after training time is spent
            raise ValueError(problem)
        hf_callbacks, self._lightning_callbacks = split_callbacks(callbacks)
        self.flow = build_flow(self.args, hf_callbacks, processing_class)
        self.lightning_kwargs = dict(lightning_kwargs or {})
        self._trainer_kwargs = lightning_trainer_kwargs(self.args, self.lightning_kwargs, model)
        self.lightning_trainer: pl.Trainer | None = None
        """The `lightning.Trainer` of the last `train()` / `evaluate()` / `predict()` call."""
        self.flow.hf_init_end(model)

    @staticmethod
    def _resolve_args(args: Any) -> TrainingArguments:
        if args is None:
            return TrainingArguments(output_dir="tmp_trainer")
        if isinstance(args, TrainingArguments):
            return args
        return from_hf_training_arguments(args)

    def _build_module(self, model: nn.Module) -> TransformerModule:
        module = self.module_class(
            model, self.args, optimizers=self.optimizers, compute_metrics=self.compute_metrics,
            preprocess_logits_for_metrics=self.preprocess_logits_for_metrics, processing_class=self.processing_class,
        )
        module.eval_loss_weighting = self.eval_loss_weighting
        return module

    def _lightning_trainer(self) -> pl.Trainer:
        """A fresh `lightning.Trainer` for one run (a Lightning trainer runs one fit / validate / predict)."""
        self.lightning_trainer = build_lightning_trainer(self.flow, self._lightning_callbacks, self._trainer_kwargs)
        return self.lightning_trainer

    @property
    def state(self) -> Any:
        """HF's `TrainerState`: `global_step`, `epoch`, `log_history`, `best_metric`, `best_model_checkpoint`..."""
        return self.flow.state

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
        """Remove the first callback of that class (or that instance), HF or Lightning."""
        self.pop_callback(callback)

    # ----- the HF methods -----
    def train(self, resume_from_checkpoint: str | bool | None = None) -> TrainOutput:
        """Train; returns `TrainOutput(global_step, training_loss, metrics)`.

        Args:
            resume_from_checkpoint: a checkpoint folder (ours or `transformers.Trainer`'s), or True for the latest
                `checkpoint-<n>` in `output_dir`; None/False falls back to `args.resume_from_checkpoint`.

        Raises:
            ValueError: `resume_from_checkpoint=True` with no checkpoint in `output_dir`; `output_dir` holds
                checkpoints of another run (see README "Checkpoints and resume").
            FileNotFoundError: the checkpoint folder does not exist or is incomplete (names the missing file).
        """
        if self.model_init is not None:
            seed_as_hf(self.args)
            self.model = self.model_init()
            self.module = self._build_module(self.model)
            self.flow.handler.model = self.model
        resume = resolve_resume(self.args, resume_from_checkpoint) or False  # early, before anything is built
        # the flow restores the HF-layout folder itself (resume/load.py), not via ckpt_path; with
        # `auto_find_batch_size` a run that ran out of memory starts again with a smaller batch (batch_search.py)
        return fit_with_batch_search(self.args, resume, lambda: self.flow.fit(
            self._lightning_trainer(), self.module, self.datamodule, resume_from_checkpoint=resume))

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Evaluate on `eval_dataset` (or the trainer's) and return HF's metric dict (with `epoch`)."""
        datamodule = self.datamodule
        if eval_dataset is not None:
            datamodule = self._datamodule_with(eval_dataset=eval_dataset)
        if not datamodule.eval_datasets:
            raise ValueError("Trainer: evaluation requires an eval_dataset (pass one to `evaluate` or `Trainer`).")
        output = self.flow.evaluate(self._lightning_trainer(), self.module, datamodule, ignore_keys, metric_key_prefix)
        return output.metrics

    def predict(
        self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test"
    ) -> PredictionOutput:
        """Predict on `test_dataset`; returns `PredictionOutput(predictions, label_ids, metrics)`, logs nothing."""
        datamodule = self._datamodule_with(predict_dataset=test_dataset)
        result = self.flow.predict(self._lightning_trainer(), self.module, datamodule, ignore_keys, metric_key_prefix)
        return PredictionOutput(predictions=result.predictions, label_ids=result.label_ids, metrics=result.metrics)

    def _datamodule_with(self, **datasets: Any) -> TransformerDataModule:
        dm = self.datamodule
        return TransformerDataModule(
            train_dataset=dm.train_dataset,
            eval_dataset=datasets.get("eval_dataset", dm.eval_datasets),
            predict_dataset=datasets.get("predict_dataset"),
            args=self.args, data_collator=dm.data_collator, processing_class=dm.processing_class,
        )

    def save_model(self, output_dir: str | None = None) -> None:
        """Write the model (and tokenizer, `training_args.bin`) to `output_dir` (default: `args.output_dir`).

        Under FSDP2 call it on every process (the full weights are gathered); the global-zero process writes.
        """
        trainer = self.lightning_trainer
        gather = partial(gather_full_weights, trainer.strategy) if trainer is not None else None  # FSDP, ZeRO-3
        save_final_model(self.model, output_dir or self.args.resolved_output_dir, self.processing_class, self.args,
                         is_global_zero=trainer is None or trainer.is_global_zero, gather=gather)
