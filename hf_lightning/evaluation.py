"""Evaluation as the HF Trainer does it: `prediction_step`, accumulation across batches and processes, metrics.

- `hf_prediction_step` is `Trainer.prediction_step` (T:3185-3292).
- `EvalAccumulator` collects one evaluation run: the batch mean loss repeated per sample (so `eval_loss` is HF's
  sample-weighted mean of batch means, T:2999/3089), logits after `preprocess_logits_for_metrics`, labels, and
  optional inputs, concatenated with -100 padding on dim 1 (HF's `EvalLoopContainer`).
- `finish` gathers the per-rank results in rank order (each rank holds a contiguous, unpadded shard, so the result
  is in dataset order with no duplicate) and builds HF's metric dict (key order and prefix rule of T:3089-3101).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from hf_lightning.module import TransformerModule

__all__ = ["EvalAccumulator", "EvalResult", "hf_prediction_step", "prefix_metrics"]


def hf_prediction_step(
    module: TransformerModule,
    model: torch.nn.Module,
    inputs: dict[str, Any],
    prediction_loss_only: bool,
    ignore_keys: list[str] | None,
) -> tuple[torch.Tensor | None, Any, Any]:
    """`Trainer.prediction_step`: loss (if labels), logits without `loss` and ignored keys, labels."""
    from transformers.trainer_pt_utils import nested_detach
    from transformers.utils import can_return_loss

    label_names = module.label_names
    has_labels = bool(label_names) and all(inputs.get(k) is not None for k in label_names)
    return_loss = inputs.get("return_loss")
    if return_loss is None:
        return_loss = can_return_loss(type(model))
    loss_without_labels = not label_names and return_loss
    if ignore_keys is None:
        config = getattr(model, "config", None)
        ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", ["past_key_values"])) if config else []
    labels = None
    if has_labels or loss_without_labels:
        labels = nested_detach(tuple(inputs.get(name) for name in label_names))
        labels = labels[0] if len(labels) == 1 else labels
    with torch.no_grad():
        if has_labels or loss_without_labels:
            loss, outputs = module.compute_loss(model, inputs, return_outputs=True)
            loss = loss.detach().mean()
            skip = [*ignore_keys, "loss"]
            logits = tuple(v for k, v in outputs.items() if k not in skip) if isinstance(outputs, Mapping) else outputs[1:]
        else:
            loss = None
            outputs = model(**inputs)
            logits = tuple(v for k, v in outputs.items() if k not in ignore_keys) if isinstance(outputs, Mapping) else outputs
    if prediction_loss_only:
        return loss, None, None
    logits = nested_detach(logits)
    if isinstance(logits, (tuple, list)) and len(logits) == 1:
        logits = logits[0]
    return loss, logits, labels


def prefix_metrics(metrics: dict[str, Any], prefix: str) -> dict[str, Any]:
    """HF's renaming (T:3098-3101): keys not starting with `prefix_` get it, and move after the prefixed ones."""
    out = dict(metrics)
    for key in list(out):
        if not key.startswith(f"{prefix}_"):
            out[f"{prefix}_{key}"] = out.pop(key)
    return out


@dataclass
class EvalResult:
    """One finished evaluation / prediction run (HF's `EvalLoopOutput` plus the inputs and losses)."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float]
    num_samples: int


def _cat(accumulated: Any, new: Any) -> Any:
    """Concatenate on dim 0, padding dim 1 with -100 when widths differ (HF `nested_concat`)."""
    from transformers.trainer_pt_utils import nested_concat

    if new is None:
        return accumulated
    return new if accumulated is None else nested_concat(accumulated, new, padding_index=-100)


def _to_cpu(value: Any) -> Any:
    from transformers.trainer_pt_utils import nested_detach

    if value is None:
        return None
    value = nested_detach(value)
    if torch.is_tensor(value):
        return value.cpu()
    return type(value)(_to_cpu(v) for v in value)


class EvalAccumulator:
    """Collects one evaluation run on one process; `finish` gathers and computes the metrics.

    Args:
        module: the module being evaluated (its args, `compute_metrics`, `preprocess_logits_for_metrics`).
        prediction_loss_only: keep only losses (no logits, labels or metrics).
    """

    def __init__(self, module: TransformerModule, prediction_loss_only: bool) -> None:
        self.module = module
        self.args = module.args
        self.prediction_loss_only = prediction_loss_only
        self.start = time.time()
        self.losses: Any = None
        self.preds: Any = None
        self.labels: Any = None
        self.inputs: Any = None
        self.num_batches = 0
        self.num_samples = 0
        self._pending_batch: Any = None
        self.batch_metrics: dict[str, Any] | None = None

    def add(self, batch: Mapping[str, Any], loss: Any, logits: Any, labels: Any) -> None:
        """Record one batch's `prediction_step` output."""
        from transformers.trainer_pt_utils import find_batch_size

        batch_size = find_batch_size(batch) or 1
        self.num_batches += 1
        self.num_samples += batch_size
        if loss is not None:
            self.losses = _cat(self.losses, loss.detach().float().repeat(batch_size).cpu())
        if logits is not None and self.module.preprocess_logits_for_metrics is not None:
            logits = self.module.preprocess_logits_for_metrics(logits, labels)
        inputs = None
        if "inputs" in self.args.include_for_metrics:
            inputs = batch.get(getattr(self.module.model, "main_input_name", "input_ids"))
        if self.args.batch_eval_metrics and self.module.compute_metrics is not None:
            self._flush_batch_metrics(compute_result=False)
            self._pending_batch = (_to_cpu(logits), _to_cpu(labels), _to_cpu(inputs), loss)
            return
        self.preds = _cat(self.preds, _to_cpu(logits))
        self.labels = _cat(self.labels, _to_cpu(labels))
        self.inputs = _cat(self.inputs, _to_cpu(inputs))

    def _flush_batch_metrics(self, compute_result: bool) -> None:
        if self._pending_batch is None:
            return
        from transformers.trainer_utils import EvalPrediction

        logits, labels, inputs, loss = self._pending_batch
        self._pending_batch = None
        pred = EvalPrediction(predictions=logits, label_ids=labels, inputs=inputs, losses=loss)
        self.batch_metrics = self.module.compute_metrics(pred, compute_result=compute_result)

    def _gathered(self, value: Any) -> Any:
        """Concatenate every rank's value in rank order (ranks hold contiguous shards)."""
        trainer = self.module.trainer
        if trainer is None or trainer.world_size == 1:
            return value
        parts: list[Any] = [None] * trainer.world_size
        torch.distributed.all_gather_object(parts, value)
        out = None
        for part in parts:
            out = _cat(out, part)
        return out

    def finish(self, prefix: str, num_samples: int | None = None) -> EvalResult:
        """Gather, compute `compute_metrics`, and return HF's metric dict with the `prefix_` keys and speed keys."""
        from transformers.trainer_pt_utils import nested_numpify
        from transformers.trainer_utils import EvalPrediction, denumpify_detensorize, speed_metrics

        losses = self._gathered(self.losses)
        preds = self._gathered(self.preds)
        labels = self._gathered(self.labels)
        inputs = self._gathered(self.inputs)
        world = self.module.trainer.world_size if self.module.trainer is not None else 1
        counts: list[Any] = [self.num_samples] * world
        if world > 1:
            torch.distributed.all_gather_object(counts, self.num_samples)
        total = sum(counts)
        n = num_samples if num_samples is not None else total
        losses, preds, labels, inputs = (nested_numpify(x) if x is not None else None for x in (losses, preds, labels, inputs))
        metrics: dict[str, Any] = {}
        compute = self.module.compute_metrics
        if self.args.batch_eval_metrics and compute is not None:
            self._flush_batch_metrics(compute_result=True)
            metrics = dict(self.batch_metrics or {})
        elif compute is not None and preds is not None and labels is not None and not self.prediction_loss_only:
            extra: dict[str, Any] = {}
            if "inputs" in self.args.include_for_metrics:
                extra["inputs"] = inputs
            if "loss" in self.args.include_for_metrics:
                extra["losses"] = losses
            metrics = compute(EvalPrediction(predictions=preds, label_ids=labels, **extra))
        metrics = denumpify_detensorize(metrics)
        if losses is not None and np.size(losses):
            metrics[f"{prefix}_loss"] = float(np.nanmean(losses) if self.args.logging_nan_inf_filter else losses.mean())
        metrics = prefix_metrics(metrics, prefix)
        steps = math.ceil(n / (self.args.per_device_eval_batch_size * world))
        metrics.update(speed_metrics(prefix, self.start, num_samples=n, num_steps=steps))
        return EvalResult(predictions=preds, label_ids=labels, metrics=metrics, num_samples=n)
