"""HF's `evaluation_loop` (and its legacy twin `prediction_loop`) on `hf_lightning.Trainer`.

`evaluation_loop(dataloader, description, ...)` runs Lightning's validation loop over the given loader (inside the
running fit during `train()`, `lightning.Trainer.validate` otherwise) with the same per-batch accumulation, gathering
and metrics as `evaluate()`, and returns HF's `EvalLoopOutput`; like HF's it neither logs nor calls `on_evaluate`,
and its metrics have no speed entries (the caller adds them). It reads `self.compute_metrics` at the call, so the
pattern of HF's question-answering trainer (set `compute_metrics = None`, call the loop, post-process, compute the
metrics itself) works as in HF. Under several processes a loader that is not yet sharded is split into contiguous
shards (`data.datamodule.shard_eval_loader`), so the gathered predictions are in dataset order without duplicates.

When a subclass overrides `evaluation_loop` or `prediction_loop`, `evaluate()` and `predict()` run HF's own bodies
around it (`get_eval_dataloader` / `get_test_dataloader`, the loop, speed metrics, `log` + `on_evaluate` or
`on_predict`), so the override is honoured by every evaluation, those during `train()` included.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from transformers import TrainerControl, TrainerState
from transformers.trainer_utils import EvalLoopOutput, PredictionOutput, speed_metrics

from hf_lightning.args import TrainingArguments
from hf_lightning.data.datamodule import TransformerDataModule
from hf_lightning.data.windows import is_sized
from hf_lightning.flow.flow import HFTrainerFlow
from hf_lightning.flow.hf_callbacks import HFCallbackHandler
from hf_lightning.module.evaluation import EvalRequest
from hf_lightning.module.module import TransformerModule
from hf_lightning.trainer.accelerator import LightningAccelerator

__all__ = ["EvalLoopHooks", "LOOP_OVERRIDES", "SPEED_SUFFIXES"]

LOOP_OVERRIDES = frozenset({"evaluation_loop", "prediction_loop"})
"""Overrides that make `evaluate()` / `predict()` run HF's bodies around `self.evaluation_loop`."""

SPEED_SUFFIXES = ("runtime", "samples_per_second", "steps_per_second")
"""The speed metrics `evaluate()` / `predict()` add after the loop (HF's `evaluation_loop` returns none)."""


class EvalLoopHooks:
    """HF's `evaluation_loop` / `prediction_loop`, and `evaluate()` / `predict()` routed through an override."""

    flow: HFTrainerFlow
    module: TransformerModule
    datamodule: TransformerDataModule
    args: TrainingArguments
    compute_metrics: Callable[..., dict] | None
    _overridden: frozenset[str]
    lightning_trainer: pl.Trainer | None = None  # until the first run builds one (set again in `__init__`)
    _lightning_trainer: Callable[[], pl.Trainer]
    get_eval_dataloader: Callable[..., Any]
    get_test_dataloader: Callable[..., Any]
    log: Callable[..., None]
    state: TrainerState
    control: TrainerControl

    if TYPE_CHECKING:  # `LoopHooks.callback_handler` / `accelerator`, read-only properties there
        @property
        def callback_handler(self) -> HFCallbackHandler: ...

        @property
        def accelerator(self) -> LightningAccelerator: ...

    @property
    def gather_function(self) -> Callable[..., Any]:
        """HF's `gather_function`: how the next evaluation gathers its losses, predictions and labels.

        `accelerator.gather_for_metrics` by default (each batch's loss counted per sample); HF's
        `Seq2SeqTrainer.evaluate` / `predict` set `accelerator.gather` (each batch counted as a full batch), and a
        subclass may set either. As in HF, an `evaluation_loop` run uses it and resets it to the default.
        """
        chosen = self.__dict__.get("_gather_function")
        if chosen is not None:
            return chosen
        return functools.partial(self.accelerator.gather_for_metrics,
                                 use_gather_object=self.args.eval_use_gather_object)

    @gather_function.setter
    def gather_function(self, function: Callable[..., Any]) -> None:
        self.__dict__["_gather_function"] = function

    def _take_gather_function(self, default: bool | None) -> bool | None:
        """How the set `gather_function` weighs the eval loss (`EvalRequest.loss_per_batch`): True for `gather`,
        False for `gather_for_metrics`, `default` when none was set; then back to the default, as HF's loop.

        Raises:
            ValueError: `gather_function` is another function (hf_lightning gathers inside Lightning's loop).
        """
        chosen = self.__dict__.pop("_gather_function", None)
        if chosen is None:
            return default
        function = chosen.func if isinstance(chosen, functools.partial) else chosen
        if function == self.accelerator.gather:
            return True
        if function == self.accelerator.gather_for_metrics:
            return False
        raise ValueError(
            f"`gather_function`={chosen!r}: hf_lightning gathers evaluation results inside Lightning's loop and "
            "honours `self.accelerator.gather` (every batch's loss counted as a full batch, HF's Seq2SeqTrainer) "
            "or `self.accelerator.gather_for_metrics` (counted per sample); set one of those."
        )

    def evaluation_loop(
        self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """HF's `evaluation_loop`: predictions, labels, metrics and sample count of `dataloader`, on every process.

        Args:
            dataloader: any loader: `get_eval_dataloader()`, `get_test_dataloader()`, or the user's own (under
                several processes, a map-style one with a `batch_size`; it is split into contiguous shards).
            description: HF's description ("Evaluation", "Prediction": predictions are then always kept).
            prediction_loss_only: keep only the loss; None: `args.prediction_loss_only`.
            ignore_keys: model output keys dropped from the predictions.
            metric_key_prefix: the metric keys' prefix.

        Returns:
            HF's `EvalLoopOutput`; its metrics hold `compute_metrics`' (the trainer's `compute_metrics` at this
            call) and `<prefix>_loss`, without speed metrics, as HF's.
        """
        if is_sized(dataloader) and len(dataloader) == 0:  # e.g. sentence-transformers' loader when its evaluator
            # does the evaluation: HF's loop still makes the loader's iterator, which draws a base seed from the
            # global torch RNG (Lightning would skip the loader), so later dropout masks stay HF's
            for _ in dataloader:
                pass
            nothing: Any = None
            return EvalLoopOutput(predictions=nothing, label_ids=None, metrics={}, num_samples=0)
        loss_only = bool(self.args.prediction_loss_only) if prediction_loss_only is None else bool(prediction_loss_only)
        request = EvalRequest(metric_key_prefix, ignore_keys, description=description, prediction_loss_only=loss_only,
                              loss_per_batch=self._take_gather_function(False))
        module = self.module
        saved = module.compute_metrics
        module.compute_metrics = self.compute_metrics  # read at the call, as HF's loop reads `self.compute_metrics`
        try:
            with self.datamodule.running_loader(dataloader):
                output = self.flow.evaluate_if_running(request)  # during train(): inside the running fit
                if output is None:
                    output = self.flow.evaluate(self._lightning_trainer(), module, self.datamodule, request=request)
        finally:
            module.compute_metrics = saved
        result = output.results.get("")
        if result is None:  # no batch at all (an empty loader)
            # HF's loop returns None predictions and labels when it kept none
            return EvalLoopOutput(predictions=None, label_ids=None, metrics={}, num_samples=0)  # type: ignore[arg-type]
        speed = {f"{metric_key_prefix}_{suffix}" for suffix in SPEED_SUFFIXES}
        metrics = {key: value for key, value in result.metrics.items() if key not in speed}
        return EvalLoopOutput(predictions=result.predictions, label_ids=result.label_ids, metrics=metrics,
                              num_samples=result.num_samples)

    def prediction_loop(
        self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """HF 4's legacy `prediction_loop` (removed in 5): the same signature and result as
        `evaluation_loop`, which it runs (HF 4's differed only in how it gathered, not in what it returned)."""
        return self.evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)

    def _loop(self) -> Callable[..., EvalLoopOutput]:
        """The overridden loop (`prediction_loop` when only it is overridden, as HF 4's `use_legacy_prediction_loop`
        would pick it), else `evaluation_loop`."""
        if "prediction_loop" in self._overridden and "evaluation_loop" not in self._overridden:
            return self.prediction_loop
        return self.evaluation_loop

    def _evaluate_through_loop(self, eval_dataset: Any, ignore_keys: list[str] | None, metric_key_prefix: str
                               ) -> dict[str, float]:
        """HF's `evaluate()` body for one dataset around the (overridden) loop: loader, loop, speed metrics, `log`,
        `on_evaluate`."""
        loader = self.get_eval_dataloader(eval_dataset)
        start = time.time()
        output = self._loop()(loader, description="Evaluation",
                              prediction_loss_only=True if self.compute_metrics is None else None,
                              ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        metrics = self._add_speed(output, metric_key_prefix, start)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self.flow.report_to_listeners(self.lightning_trainer, self.module, metrics)
        return metrics

    def _predict_through_loop(self, test_dataset: Any, ignore_keys: list[str] | None, metric_key_prefix: str
                              ) -> PredictionOutput:
        """HF's `predict()` body around the (overridden) loop: loader, loop, speed metrics, `on_predict`."""
        loader = self.get_test_dataloader(test_dataset)
        start = time.time()
        output = self._loop()(loader, description="Prediction", ignore_keys=ignore_keys,
                              metric_key_prefix=metric_key_prefix)
        metrics = self._add_speed(output, metric_key_prefix, start)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=metrics)

    def _add_speed(self, output: EvalLoopOutput, prefix: str, start: float) -> dict[str, float]:
        """The loop's metrics (the same dict) with HF's speed metrics added."""
        trainer = self.lightning_trainer
        world_size = trainer.world_size if trainer is not None else self.args.world_size
        total_batch_size = self.args.per_device_eval_batch_size * world_size
        metrics = output.metrics if output.metrics is not None else {}
        num_samples = int(output.num_samples or 0)
        metrics.update(speed_metrics(prefix, start, num_samples=num_samples,
                                     num_steps=math.ceil(num_samples / total_batch_size)))
        return metrics
