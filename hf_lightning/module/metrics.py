"""Streaming evaluation metrics: a `torchmetrics.Metric` / `MetricCollection` as `compute_metrics`.

An HF `compute_metrics(EvalPrediction)` needs every prediction of the eval set in memory at the end, so evaluation
memory grows with the eval set (all logits of an LM: samples x seq x vocab floats). A torchmetrics metric keeps a
small state instead: it is updated once per eval batch and computed once at the end, and torchmetrics sums its
state over processes (`sync_on_compute`), so the result covers the whole eval set under DDP.

The update rule (one rule, no guessing):

    metric.update(preds, target)

- `preds` = the batch's logits as `prediction_step` returns them, after `preprocess_logits_for_metrics` when given;
  when the model returns several outputs (a tuple), the first one (the logits).
- `target` = the batch's labels (`label_names`; the first label when there are several).
- Nothing is gathered: each process updates with its own batches; `compute()` syncs the states.

`StreamingMetrics` adapts the common other signatures: `argmax=True` passes class ids instead of scores (token
classification with `ignore_index=-100`), `shift_labels=True` drops the last position of `preds` and the first of
`target` (causal-LM metrics such as `torchmetrics.text.Perplexity`), and `prepare=fn(EvalBatch) -> args tuple or
kwargs dict` covers anything else (inputs, per-batch losses). `CombinedMetrics(a, b, ...)` joins adapters with
different options (e.g. accuracy on argmax ids next to perplexity on scores).

Metric names: a `MetricCollection` gives its own keys; a single metric is named by its class (`MulticlassAccuracy`)
unless `StreamingMetrics(metric, name="accuracy")`. Keys get the usual `eval_` prefix.

Example::

    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    metrics = MetricCollection({"accuracy": MulticlassAccuracy(2), "f1": MulticlassF1Score(2)})
    Trainer(model, args, eval_dataset=dev, compute_metrics=metrics).evaluate()  # {"eval_accuracy": ..., ...}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torchmetrics import Metric, MetricCollection

__all__ = ["CombinedMetrics", "EvalBatch", "StreamingMetrics", "as_streaming_metrics", "is_streaming_metric"]


@dataclass
class EvalBatch:
    """What one eval batch offers to a `prepare` function (tensors on the module's device).

    Attributes:
        preds: logits after `preprocess_logits_for_metrics` (the first output when the model returns several).
        labels: the batch's labels, or None.
        inputs: the collated batch (every column).
        loss: the batch's mean loss (a 0-d tensor), or None.
    """

    preds: Any
    labels: Any
    inputs: Mapping[str, Any]
    loss: torch.Tensor | None


def is_streaming_metric(obj: Any) -> bool:
    """Whether `compute_metrics` is a streaming metric (torchmetrics `Metric`, `MetricCollection` or an adapter)."""
    return isinstance(obj, (StreamingMetrics, Metric, MetricCollection))


def as_streaming_metrics(obj: Any) -> StreamingMetrics | None:
    """`obj` as a `StreamingMetrics` adapter, or None when it is a plain `compute_metrics` function."""
    if isinstance(obj, StreamingMetrics):
        return obj
    return StreamingMetrics(obj) if is_streaming_metric(obj) else None


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, (tuple, list)) else value


class StreamingMetrics:
    """Feeds eval batches to a torchmetrics metric with the rule of this module; `compute` gives HF's metric dict.

    Args:
        metric: a `torchmetrics.Metric` or `MetricCollection`.
        argmax: pass `preds.argmax(-1)` (class ids) instead of scores.
        shift_labels: causal LM: `preds[:, :-1]` against `target[:, 1:]` (position t predicts token t + 1).
        prepare: `fn(EvalBatch) -> tuple | dict`, the positional or keyword arguments of `metric.update`;
            replaces the default rule (`argmax` / `shift_labels` then do not apply).
        name: the key of a single metric's value (default: its class name).
        needs_labels: whether an eval batch without labels is an error (the default rule needs them).

    Raises:
        TypeError: `metric` is not a torchmetrics metric.
    """

    def __init__(
        self,
        metric: Any,
        argmax: bool = False,
        shift_labels: bool = False,
        prepare: Callable[[EvalBatch], tuple | dict] | None = None,
        name: str | None = None,
        needs_labels: bool | None = None,
    ) -> None:
        if not isinstance(metric, (Metric, MetricCollection)):
            raise TypeError(
                "StreamingMetrics needs a torchmetrics Metric or MetricCollection, got "
                f"{type(metric).__name__}; a plain function can be passed as `compute_metrics` directly."
            )
        self.metric = metric
        self.argmax = argmax
        self.shift_labels = shift_labels
        self.prepare = prepare
        self.name = name or type(metric).__name__
        self.needs_labels = prepare is None if needs_labels is None else needs_labels

    def reset(self, device: torch.device | None = None) -> None:
        """Start a new evaluation run (states zeroed, on the module's device so updates need no copies)."""
        if device is not None:
            self.metric.to(device)
        self.metric.reset()

    def update(self, batch: EvalBatch) -> None:
        """Update the metric with one eval batch (see the module docstring for the rule)."""
        if self.prepare is not None:
            args = self.prepare(batch)
            if isinstance(args, Mapping):
                self.metric.update(**args)
            else:
                self.metric.update(*args)
            return
        preds, target = _first(batch.preds), _first(batch.labels)
        if self.shift_labels:
            preds, target = preds[:, :-1], target[:, 1:]
        if self.argmax:
            preds = preds.argmax(-1)
        self.metric.update(preds, target)

    def compute(self) -> dict[str, Any]:
        """The metric values over every batch of every process (torchmetrics syncs the states), then a reset."""
        value = self.metric.compute()
        self.metric.reset()
        if isinstance(value, Mapping):
            return dict(value)
        return {self.name: value}


class CombinedMetrics(StreamingMetrics):
    """Several `StreamingMetrics`, each with its own adapter options, as one `compute_metrics`.

    Example::

        CombinedMetrics(StreamingMetrics(MulticlassAccuracy(V, ignore_index=-100), argmax=True, shift_labels=True,
                                         name="accuracy"),
                        StreamingMetrics(Perplexity(ignore_index=-100), shift_labels=True, name="perplexity"))

    Raises:
        TypeError: a part is not a `StreamingMetrics`.
        ValueError: two parts report the same key.
    """

    def __init__(self, *parts: StreamingMetrics) -> None:  # no super().__init__: the parts hold the metrics
        for part in parts:
            if not isinstance(part, StreamingMetrics):
                raise TypeError(f"CombinedMetrics takes StreamingMetrics parts, got {type(part).__name__}.")
        self.parts = parts
        self.needs_labels = any(part.needs_labels for part in parts)

    def reset(self, device: torch.device | None = None) -> None:
        for part in self.parts:
            part.reset(device)

    def update(self, batch: EvalBatch) -> None:
        for part in self.parts:
            part.update(batch)

    def compute(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for part in self.parts:
            values = part.compute()
            clash = set(values) & set(out)
            if clash:
                raise ValueError(f"CombinedMetrics: several parts report {sorted(clash)}; give them distinct names.")
            out.update(values)
        return out
