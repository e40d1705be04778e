"""One evaluation or prediction run: per-batch accumulation on each process, gathering, metrics, per-dataset results.

- `EvalAccumulator` collects one dataset of a run on one process: the batch mean loss repeated per sample (so
  `eval_loss` is HF's sample-weighted mean of batch means; HF's `Seq2SeqTrainer` repeats it `eval_batch_size` times,
  `EvalSettings.eval_loss_repeats`; a token-weighted alternative is `eval_loss_weighting="tokens"`), logits after
  `preprocess_logits_for_metrics`, labels and optional inputs, kept per batch and concatenated once with -100 padding
  (HF's `EvalLoopContainer` result). A streaming `compute_metrics` (torchmetrics, see `hf_lightning.module.metrics`) or
  `batch_eval_metrics` is fed per batch instead, and no predictions are kept. `finish` gathers the per-rank results in
  rank order (each rank holds a contiguous, unpadded shard, so the result is in dataset order with no duplicate) and
  builds HF's metric dict (key order and prefix rule of `Trainer.evaluation_loop`), after `check_metrics` rejected
  non-numeric values and colliding keys.
- Lock-step forwards: shards differ by up to one batch (9 rows on 2 processes in batches of 2: 3 and 2 batches).
  Where every forward is a collective (FSDP1 / FSDP2 / ZeRO-3 gather the weights in each forward; `generate` with
  `synced_gpus` syncs each decoding step; `parallel/lockstep.py` says when), a short rank would leave the others'
  last forwards unpaired. Every rank computes the busiest rank's batch count from the dataset length alone (a
  collective to agree on it would itself pair with a pending forward), and before gathering, `finish` runs the
  missing steps (`pad_step`, the strategy's own eval step on this dataset's first batch) and drops their outputs:
  they pair with the other ranks' last real batches. A rank whose shard is only a padding row (fewer samples than
  ranks, `ContiguousShardSampler.padding_only`) drops that batch's outputs the same way. The results are thus those
  of the single-process run.
- `EvaluationRun` is one `evaluate()` / `predict()` over one or several named datasets: it makes an accumulator per
  dataset when its first batch arrives, finishes datasets one after another, and returns every result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from transformers.trainer_pt_utils import nested_detach, nested_numpify
from transformers.trainer_utils import EvalPrediction, speed_metrics

from hf_lightning.data.sampling import ContiguousShardSampler
from hf_lightning.module.evaluation import (
    EVAL_LOSS_WEIGHTINGS,
    EvalRequest,
    EvalResult,
    EvalSettings,
    EvalStep,
    EvaluationOutput,
    check_metrics,
    concat_padded,
    prefix_metrics,
)
from hf_lightning.module.loss import count_label_tokens, count_samples
from hf_lightning.module.metrics import EvalBatch, as_streaming_metrics

__all__ = ["EvalAccumulator", "EvaluationRun", "busiest_rank_batches", "eval_shard"]

PadStep = Callable[[dict[str, Any]], object]
"""Runs one evaluation step on a batch whose outputs are dropped (the strategy's `validation_step` / `predict_step`)."""


def eval_shard(loader: Any) -> tuple[ContiguousShardSampler, int, bool] | None:
    """`(sampler, batch_size, drop_last)` of an eval loader sharded by `ContiguousShardSampler`, else None.

    Lightning rebuilds a prediction loader around a batch sampler (to record indices); the loader's own `sampler`
    and `batch_size` are then a default `SequentialSampler` and None, and ours sit on its `batch_sampler`.
    """
    for holder in (loader, getattr(loader, "batch_sampler", None)):
        sampler, batch_size = getattr(holder, "sampler", None), getattr(holder, "batch_size", None)
        if isinstance(sampler, ContiguousShardSampler) and batch_size:
            return sampler, int(batch_size), bool(getattr(holder, "drop_last", False))
    return None


def busiest_rank_batches(loader: Any) -> int | None:
    """The batches of the busiest rank for this eval loader, or None when its sharding is not ours (e.g. a
    `DistributedSampler` pads every shard to the same number of batches, an unsized dataset is read whole)."""
    shard = eval_shard(loader)  # any Lightning eval loader may come here, not only ours
    if shard is None:
        return None
    sampler, batch_size, drop_last = shard
    return max(size // batch_size if drop_last else -(-size // batch_size) for size in sampler.shard_sizes())


def _numpy(value: Any) -> Any:
    """Detached numpy copy of a (nested) tensor batch: evaluation results live on the CPU, as numpy, like HF's."""
    return None if value is None else nested_numpify(nested_detach(value))


class EvalAccumulator:
    """Collects one dataset of an evaluation (or prediction) run on one process; `finish` gathers and computes.

    Args:
        settings: what the module contributes (args, `compute_metrics`, label names...; see `EvalSettings`).
        prediction_loss_only: keep only losses (no logits, labels or metrics).
        is_prediction: a `predict` run: predictions are always kept (HF's `description == "Prediction"`), and
            missing labels are normal (no metrics, no loss).
        world_size: the number of processes whose shards `finish` gathers (collectively).
        device: where a streaming metric keeps its state (the module's device).
        loader: the dataset's loader (its sampler gives every rank's number of batches, and marks a padding shard).
        pad_step: set when forwards must run in lock-step across ranks: runs one step whose outputs are dropped
            (see the module docstring); None: no padding steps.

    Raises:
        ValueError: an unknown `eval_loss_weighting`.
    """

    def __init__(
        self,
        settings: EvalSettings,
        prediction_loss_only: bool,
        is_prediction: bool = False,
        world_size: int = 1,
        device: torch.device | None = None,
        *,
        loader: Any = None,
        pad_step: PadStep | None = None,
    ) -> None:
        if settings.eval_loss_weighting not in EVAL_LOSS_WEIGHTINGS:
            raise ValueError(
                f"`eval_loss_weighting` must be one of {EVAL_LOSS_WEIGHTINGS}, got {settings.eval_loss_weighting!r}."
            )
        self.settings = settings
        self.args = settings.args
        self.prediction_loss_only = prediction_loss_only
        self.is_prediction = is_prediction
        self.world_size = world_size
        self.start = time.time()
        self.losses: list[tuple[float, int]] = []
        self.preds: list[Any] = []
        self.labels: list[Any] = []
        self.inputs: list[Any] = []
        self.token_loss_sum = 0.0  # sum over batches of mean_loss * label_tokens, for the token-weighted loss
        self.token_count = 0
        self.num_batches = 0
        self.num_samples = 0
        self.loader = loader
        self.pad_step = pad_step
        self.steps = 0  # every step run for this dataset on this rank: its batches, padding ones included
        self.padding_steps = 0  # the steps whose outputs were dropped
        shard = eval_shard(loader)
        self._padding_batches = 1 if shard is not None and shard[0].padding_only else 0
        self.template: dict[str, Any] | None = None  # the first batch, for padding steps
        self._pending_batch: tuple[Any, Any, Any, Any] | None = None
        self.batch_metrics: dict[str, Any] | None = None
        compute = settings.compute_metrics
        self.streaming = None if prediction_loss_only else as_streaming_metrics(compute)
        if self.streaming is not None:
            self.streaming.reset(device)
        self.per_batch = bool(self.args.batch_eval_metrics) and compute is not None and self.streaming is None

    def _keeps_arrays(self) -> bool:
        return self.is_prediction or (self.streaming is None and not self.per_batch)

    def add(self, batch: Mapping[str, Any], step: EvalStep) -> None:
        """Record one batch's `prediction_step` output (dropped for a padding shard's batch)."""
        self.steps += 1
        if self.template is None and self.pad_step is not None:
            self.template = dict(batch)  # the whole batch: a slice of a padding-free batch would not be one
        if self._padding_batches:  # a padding row, read so that this rank runs the loop: its outputs are dropped
            self._padding_batches -= 1
            self.padding_steps += 1
            return
        loss, logits, labels = step.loss, step.logits, step.labels
        batch_size = count_samples(batch)  # the sequences of a padding-free batch, not its one row
        self.num_batches += 1
        self.num_samples += batch_size
        if loss is not None:
            # a Python float per batch, expanded at `finish`: a small array kept per batch would pin fragments of
            # the heap between the large per-batch logits, and a long evaluation's memory would creep up. HF repeats
            # it per sample (`Trainer`), or per slot of the loader's batch (`Seq2SeqTrainer`: `eval_loss_repeats`)
            self.losses.append((float(loss.detach().float()), self.settings.eval_loss_repeats or batch_size))
            if self.settings.eval_loss_weighting == "tokens":
                self._add_tokens(batch, loss)
        self._check_labels(batch, labels)
        if logits is not None and self.settings.preprocess_logits_for_metrics is not None:
            logits = self.settings.preprocess_logits_for_metrics(logits, labels)
        inputs = (batch.get(self.settings.main_input_name)
                  if "inputs" in self.args.include_for_metrics and isinstance(batch, Mapping) else None)
        streams = self.streaming is not None and (labels is not None or not self.streaming.needs_labels)
        if streams and logits is not None:
            assert self.streaming is not None
            self.streaming.update(EvalBatch(preds=logits, labels=labels, inputs=batch, loss=loss))
        if self.per_batch and logits is not None and labels is not None:
            self._flush_batch_metrics(compute_result=False)
            losses = loss.detach().repeat(batch_size) if loss is not None else None
            self._pending_batch = (logits, labels, batch if inputs is not None else None, losses)
        if self._keeps_arrays():
            self.preds.append(_numpy(logits))
            self.labels.append(_numpy(labels))
            self.inputs.append(_numpy(inputs))

    def _add_tokens(self, batch: Mapping[str, Any], loss: torch.Tensor) -> None:
        tokens = count_label_tokens(batch, self.settings.shift_labels)
        if tokens is None:
            raise ValueError(
                "`eval_loss_weighting='tokens'` needs a `labels` (or `shift_labels`) column in the eval batches to "
                f"count label tokens; the batch has {sorted(map(str, batch))}. Use eval_loss_weighting='samples'."
            )
        count = int(tokens)
        if count:  # a batch without label tokens has a NaN mean loss and no weight
            self.token_loss_sum += float(loss.detach().double()) * count
            self.token_count += count

    def _check_labels(self, batch: Mapping[str, Any], labels: Any) -> None:
        """An evaluation whose metrics need labels must get them (HF silently skips the metrics instead)."""
        if labels is not None or self.is_prediction or self.prediction_loss_only:
            return
        if self.settings.compute_metrics is None or (self.streaming is not None and not self.streaming.needs_labels):
            return
        raise ValueError(
            f"`compute_metrics` needs labels, but the eval batch has no label column {self.settings.label_names} "
            f"(`label_names`); the batch has the columns {sorted(map(str, batch))}. Add the labels to the eval "
            "dataset, set `args.label_names`, or evaluate without `compute_metrics`."
        )

    def _flush_batch_metrics(self, compute_result: bool) -> None:
        if self._pending_batch is None or self.settings.compute_metrics is None:
            return
        logits, labels, inputs, losses = self._pending_batch
        self._pending_batch = None
        include = self.args.include_for_metrics
        pred = EvalPrediction(predictions=logits, label_ids=labels, inputs=inputs if "inputs" in include else None,
                              losses=losses if "loss" in include else None)
        self.batch_metrics = self.settings.compute_metrics(pred, compute_result=compute_result)

    def _gathered(self, value: Any) -> list[Any]:
        """Every rank's value in rank order (ranks hold contiguous shards, so this is dataset order); on every rank."""
        if self.world_size == 1:
            return [value]
        parts: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(parts, value)
        return parts

    def _concat(self, batches: list[Any]) -> Any:
        if not self.args.eval_do_concat_batches:
            return [b for b in batches if b is not None] or None
        return concat_padded(batches)

    def _metrics(self, preds: Any, labels: Any, inputs: Any, losses: Any) -> dict[str, Any]:
        """What `compute_metrics` (function, streaming or per batch) returns for the gathered run."""
        compute = self.settings.compute_metrics
        if self.streaming is not None:
            return self.streaming.compute()
        if self.per_batch:
            self._flush_batch_metrics(compute_result=True)
            return dict(self.batch_metrics or {})
        if compute is None or preds is None or labels is None or self.prediction_loss_only:
            return {}
        extra: dict[str, Any] = {}
        if "inputs" in self.args.include_for_metrics:
            extra["inputs"] = inputs
        if "loss" in self.args.include_for_metrics:
            extra["losses"] = losses
        return compute(EvalPrediction(predictions=preds, label_ids=labels, **extra))

    def _loss(self, losses: np.ndarray, gathered: list[Any]) -> float:
        """`<prefix>_loss`: HF's sample-weighted mean of batch means, or the token-weighted mean."""
        if self.settings.eval_loss_weighting == "tokens":
            tokens = sum(part[6] for part in gathered)
            return sum(part[5] for part in gathered) / tokens if tokens else float("nan")
        finite = np.isfinite(losses)
        if self.args.logging_nan_inf_filter and finite.any():  # HF drops non-finite batch losses (evaluation_loop)
            losses = losses[finite]
        return float(losses.mean().item())

    def pad_to_busiest_rank(self) -> int:
        """With a `pad_step`: run the steps this rank owes so that every rank ran as many (the busiest rank's batch
        count), dropping their outputs; returns how many were run.

        Raises:
            RuntimeError: steps are owed but this rank never had a batch to repeat (a `dataloader_drop_last`
                shard without a full batch: Lightning skips such a process's loop).
        """
        if self.pad_step is None or self.world_size < 2:
            return 0
        target = busiest_rank_batches(self.loader)
        owed = 0 if target is None else max(target - self.steps, 0)
        if owed and self.template is None:
            raise RuntimeError(
                f"This process evaluated no batch but owes {owed} lock-step forward(s) to the other processes; "
                "with `dataloader_drop_last=True` every process needs at least one full eval batch: lower "
                "`per_device_eval_batch_size` or evaluate with fewer processes."
            )
        for _ in range(owed):
            assert self.template is not None
            with torch.no_grad():
                self.pad_step(dict(self.template))
        self.steps += owed
        self.padding_steps += owed
        return owed

    def finish(self, prefix: str, num_samples: int | None = None) -> EvalResult:
        """Run the lock-step padding steps this rank owes (`pad_to_busiest_rank`), gather (a collective when
        `world_size > 1`), compute the metrics, and return HF's `EvalLoopOutput`.

        `<prefix>_loss` is HF's by default: the sample-weighted mean of the batch mean losses. With
        `eval_loss_weighting="tokens"` it is the mean over every label token of the eval set
        (`sum(batch_mean * batch_tokens) / sum(tokens)`), which does not depend on how the samples are batched.
        """
        self.pad_to_busiest_rank()
        gathered = self._gathered((self.num_samples, self.losses, self.preds, self.labels, self.inputs,
                                   self.token_loss_sum, self.token_count))
        total = sum(part[0] for part in gathered)
        n = num_samples if num_samples is not None else total
        pairs = [pair for part in gathered for pair in part[1]]
        losses = np.repeat(np.array([v for v, _ in pairs], dtype=np.float32), [k for _, k in pairs]) if pairs else None
        preds = self._concat([b for part in gathered for b in part[2]])
        labels = self._concat([b for part in gathered for b in part[3]])
        inputs = self._concat([b for part in gathered for b in part[4]])
        metrics = check_metrics(self._metrics(preds, labels, inputs, losses), prefix)
        if losses is not None and np.size(losses):
            metrics[f"{prefix}_loss"] = self._loss(losses, gathered)
        metrics = prefix_metrics(metrics, prefix)
        steps = math.ceil(n / (self.args.per_device_eval_batch_size * self.world_size))
        metrics.update(speed_metrics(prefix, self.start, num_samples=n, num_steps=steps))
        return EvalResult(predictions=preds, label_ids=labels, metrics=metrics, num_samples=n)


class EvaluationRun:
    """One `evaluate()` or `predict()`: an accumulator per dataset, finished one after another, results returned.

    Created with its request; `open` gives it the datasets once the Lightning loop knows them.

    Args:
        request: what was asked (`metric_key_prefix`, `ignore_keys`, prediction or evaluation).
    """

    def __init__(self, request: EvalRequest) -> None:
        self.request = request
        self.dataset_names: list[str] = [""]
        self.dataset_sizes: list[int | None] = []
        self.world_size = 1
        self._new_accumulator: Callable[[int], EvalAccumulator] | None = None
        self.accumulators: dict[int, EvalAccumulator] = {}
        self.finished: set[int] = set()
        self.output = EvaluationOutput()

    def open(
        self,
        dataset_names: list[str],
        dataset_sizes: list[int | None],
        world_size: int,
        new_accumulator: Callable[[int], EvalAccumulator],
    ) -> None:
        """Start the run over these datasets.

        Args:
            dataset_names: the datasets' names in loader order (`[""]` for one unnamed dataset).
            dataset_sizes: their lengths (None for an unsized one: the gathered sample count is used).
            world_size: the number of processes.
            new_accumulator: makes the accumulator of dataset `i` (the module's kind, see `FlowModule`).

        Raises:
            RuntimeError: the run was already opened (one run is one Lightning loop).
        """
        if self._new_accumulator is not None:
            raise RuntimeError("This evaluation run already ran; start a new one.")
        self.dataset_names = dataset_names or [""]
        self.dataset_sizes = dataset_sizes
        self.world_size = world_size
        self._new_accumulator = new_accumulator

    def _accumulator(self, index: int) -> EvalAccumulator:
        if self._new_accumulator is None:
            raise RuntimeError("The evaluation run was not opened.")
        return self._new_accumulator(index)

    def name(self, index: int) -> str:
        """The name of dataset `index` (its index as text when the names do not cover it)."""
        return self.dataset_names[index] if index < len(self.dataset_names) else str(index)

    def add(self, index: int, batch: Mapping[str, Any], step: EvalStep) -> None:
        """Record one batch of dataset `index`."""
        if index not in self.accumulators:
            self.accumulators[index] = self._accumulator(index)
        self.accumulators[index].add(batch, step)

    def finish(self, index: int) -> EvalResult | None:
        """Gather and compute dataset `index` (once); None for an evaluation dataset without any batch.

        A process whose shard of the dataset had no batch (a tiny eval set over many processes) still joins the
        gather with an empty accumulator: the gather is a collective. A prediction always has a result.
        """
        if index in self.finished:
            return None
        self.finished.add(index)
        accumulator = self.accumulators.get(index)
        if accumulator is None:
            if self.world_size == 1 and not self.request.keeps_predictions:
                return None
            accumulator = self.accumulators[index] = self._accumulator(index)
        name = self.name(index)
        prefix = f"{self.request.metric_key_prefix}_{name}" if name else self.request.metric_key_prefix
        size = self.dataset_sizes[index] if index < len(self.dataset_sizes) else None
        result = accumulator.finish(prefix, num_samples=size)
        del self.accumulators[index]  # its arrays now live in the result only
        self.output.results[name] = result
        return result

    def unfinished(self, count: int) -> list[int]:
        """The datasets among the first `count` (and any that got batches) not finished yet, in order."""
        total = max(count, 1 + max(self.accumulators, default=-1))
        return [index for index in range(total) if index not in self.finished]
