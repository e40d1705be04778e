"""Evaluation as the HF Trainer does it: `prediction_step`, accumulation across batches and processes, metrics.

- `hf_prediction_step` is `Trainer.prediction_step` (T:3185-3292).
- `EvalAccumulator` collects one evaluation run: the batch mean loss repeated per sample (so `eval_loss` is HF's
  sample-weighted mean of batch means, T:2999/3089; HF's `Seq2SeqTrainer` repeats it `eval_batch_size` times, see
  `Seq2SeqTransformerModule.eval_loss_repeats`; a token-weighted alternative is `eval_loss_weighting="tokens"`),
  logits after `preprocess_logits_for_metrics`, labels, and optional inputs, kept per batch and concatenated once
  with -100 padding (HF's `EvalLoopContainer` result). A streaming `compute_metrics` (torchmetrics, see
  `hf_lightning.metrics`) or `batch_eval_metrics` is fed per batch instead, and no predictions are kept.
- `finish` gathers the per-rank results in rank order (each rank holds a contiguous, unpadded shard, so the result
  is in dataset order with no duplicate) and builds HF's metric dict (key order and prefix rule of T:3089-3101),
  after `check_metrics` rejected non-numeric values and keys colliding with the built-in ones.
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

__all__ = [
    "EvalAccumulator", "EvalResult", "check_batch_columns", "check_metrics", "concat_padded", "hf_prediction_step",
    "prefix_metrics",
]


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

    check_batch_columns(model, inputs)
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


# Keys HF puts into every evaluation result; a compute_metrics key landing on one of them would overwrite it.
BUILT_IN_SUFFIXES = ("loss", "runtime", "samples_per_second", "steps_per_second", "model_preparation_time")
RESERVED_KEYS = ("epoch", "step", "total_flos")
EVAL_LOSS_WEIGHTINGS = ("samples", "tokens")


def check_metrics(metrics: Any, prefix: str) -> dict[str, Any]:
    """Validate what `compute_metrics` returned: a dict of scalar numbers whose keys do not collide with HF's keys.

    Values are made plain Python numbers first (numpy scalars, one-element tensors/arrays: HF's
    `denumpify_detensorize`).

    Raises:
        TypeError: not a dict, or a value that is not a scalar number (the key, the value's type and shape).
        ValueError: a key that becomes one of the built-in keys (`<prefix>_loss`, runtime keys, `epoch`, `step`).
    """
    from transformers.trainer_utils import denumpify_detensorize

    if not isinstance(metrics, Mapping):
        raise TypeError(f"`compute_metrics` must return a dict of metric name -> number, got {type(metrics).__name__}.")
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.reshape(()).item()
        value = denumpify_detensorize(value)
        if not isinstance(value, (int, float)):
            shape = getattr(value, "shape", None)
            raise TypeError(
                f"`compute_metrics` returned a non-scalar or non-numeric value for {key!r}: {type(value).__name__}"
                f"{f' of shape {tuple(shape)}' if shape is not None else ''} ({str(value)[:60]!r}). Every value must "
                "be "
                "a single number (int or float, a numpy scalar or a one-element tensor); reduce it (e.g. a mean) or "
                "log per-class values under separate keys."
            )
        name = key if str(key).startswith(f"{prefix}_") else f"{prefix}_{key}"
        if key in RESERVED_KEYS or name in {f"{prefix}_{s}" for s in BUILT_IN_SUFFIXES}:
            built_in = key if key in RESERVED_KEYS else name
            raise ValueError(
                f"`compute_metrics` returned the key {key!r}, which collides with the built-in key {built_in!r} "
                f"(built-in: {', '.join(f'{prefix}_{s}' for s in BUILT_IN_SUFFIXES)}, {', '.join(RESERVED_KEYS)}). "
                "Rename the metric."
            )
        out[key] = value
    return out


def check_batch_columns(model: torch.nn.Module, inputs: Mapping[str, Any]) -> None:
    """Raise a clear error when an eval / predict batch lacks the model's main input column.

    Without it the model fails deep in `forward` with a message that names no dataset column.
    """
    main = getattr(model, "main_input_name", None)
    if not isinstance(main, str) or main in inputs or any(str(k).endswith("_embeds") for k in inputs):
        return
    raise ValueError(
        f"The evaluation / prediction batch has no column {main!r}, which {type(model).__name__} needs as its main "
        f"input (`model.main_input_name`); the batch has the columns {sorted(map(str, inputs))}. Add a {main!r} "
        "column to the eval / test dataset (tokenise it), or check the collator."
    )


@dataclass
class EvalResult:
    """One finished evaluation / prediction run (HF's `EvalLoopOutput`)."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float]
    num_samples: int


def _numpy(value: Any) -> Any:
    """Detached numpy copy of a (nested) tensor batch: evaluation results live on the CPU, as numpy, like HF's."""
    from transformers.trainer_pt_utils import nested_detach, nested_numpify

    return None if value is None else nested_numpify(nested_detach(value))


def concat_padded(batches: list[Any], padding_index: int = -100) -> Any:
    """Concatenate per-batch arrays on dim 0 once, padding the other dims with `padding_index` (HF's `nested_concat`
    result, without re-copying the accumulated arrays at every batch)."""
    batches = [b for b in batches if b is not None]
    if not batches:
        return None
    first = batches[0]
    if isinstance(first, (tuple, list)):
        return type(first)(concat_padded([b[i] for b in batches], padding_index) for i in range(len(first)))
    if isinstance(first, Mapping):
        return type(first)({k: concat_padded([b[k] for b in batches], padding_index) for k in first})
    arrays = [np.asarray(b) for b in batches]
    if arrays[0].ndim == 0 or all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
        return np.concatenate(arrays, axis=0) if arrays[0].ndim else np.stack(arrays)
    tail = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
    out = np.full((sum(len(a) for a in arrays), *tail), padding_index, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        out[(slice(row, row + len(a)), *(slice(0, n) for n in a.shape[1:]))] = a
        row += len(a)
    return out


class EvalAccumulator:
    """Collects one evaluation (or prediction) run on one process; `finish` gathers and computes the metrics.

    Per batch it keeps the batch's mean loss repeated per sample (HF's `eval_loss` is their mean), and, only when
    something needs them, the predictions (after `preprocess_logits_for_metrics`), labels and inputs as numpy on the
    CPU. A streaming `compute_metrics` (torchmetrics, see `hf_lightning.metrics`) is updated per batch instead, so an
    evaluation keeps no predictions at all; `batch_eval_metrics` likewise (HF's rule).

    Args:
        module: the module being evaluated (its args, `compute_metrics`, `preprocess_logits_for_metrics`, and
            `eval_loss_weighting`: "samples" (HF) or "tokens", see `finish`).
        prediction_loss_only: keep only losses (no logits, labels or metrics).
        is_prediction: a `predict` run: predictions are always kept (HF's `description == "Prediction"`), and
            missing labels are normal (no metrics, no loss).
    """

    def __init__(self, module: TransformerModule, prediction_loss_only: bool, is_prediction: bool = False) -> None:
        from hf_lightning.metrics import as_streaming_metrics

        self.module = module
        self.args = module.args
        self.prediction_loss_only = prediction_loss_only
        self.is_prediction = is_prediction
        self.start = time.time()
        self.losses: list[Any] = []
        self.preds: list[Any] = []
        self.labels: list[Any] = []
        self.inputs: list[Any] = []
        self.token_loss_sum = 0.0  # sum over batches of mean_loss * label_tokens, for the token-weighted loss
        self.token_count = 0
        self.num_batches = 0
        self.num_samples = 0
        self._pending_batch: Any = None
        self.batch_metrics: dict[str, Any] | None = None
        weighting = getattr(module, "eval_loss_weighting", "samples")
        if weighting not in EVAL_LOSS_WEIGHTINGS:
            raise ValueError(f"`eval_loss_weighting` must be one of {EVAL_LOSS_WEIGHTINGS}, got {weighting!r}.")
        self.weighting = weighting
        compute = module.compute_metrics
        self.streaming = None if prediction_loss_only else as_streaming_metrics(compute)
        if self.streaming is not None:
            self.streaming.reset(getattr(module, "device", None))
        self.per_batch = bool(self.args.batch_eval_metrics) and compute is not None and self.streaming is None

    def _keeps_arrays(self) -> bool:
        return self.is_prediction or (self.streaming is None and not self.per_batch)

    def add(self, batch: Mapping[str, Any], loss: Any, logits: Any, labels: Any) -> None:
        """Record one batch's `prediction_step` output."""
        from transformers.trainer_pt_utils import find_batch_size

        batch_size = find_batch_size(batch) or 1
        self.num_batches += 1
        self.num_samples += batch_size
        if loss is not None:
            # a Python float per batch, expanded at `finish`: a small array kept per batch would pin fragments of
            # the heap between the large per-batch logits, and a long evaluation's memory would creep up. HF repeats
            # it per sample (`Trainer`), or per slot of the loader's batch (`Seq2SeqTrainer`: `eval_loss_repeats`)
            repeats = getattr(self.module, "eval_loss_repeats", None) or batch_size
            self.losses.append((float(loss.detach().float()), repeats))
            if self.weighting == "tokens":
                self._add_tokens(batch, loss)
        self._check_labels(batch, labels)
        if logits is not None and self.module.preprocess_logits_for_metrics is not None:
            logits = self.module.preprocess_logits_for_metrics(logits, labels)
        inputs = None
        if "inputs" in self.args.include_for_metrics:
            inputs = batch.get(getattr(self.module.model, "main_input_name", "input_ids"))
        streams = self.streaming is not None and (labels is not None or not self.streaming.needs_labels)
        if streams and logits is not None:
            from hf_lightning.metrics import EvalBatch

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
        from hf_lightning.loss import count_label_tokens

        tokens = count_label_tokens(batch, bool(getattr(self.module, "_shift_labels", False)))
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
        if labels is not None or self.is_prediction or self.prediction_loss_only or self.module.compute_metrics is None:
            return
        if self.streaming is not None and not self.streaming.needs_labels:
            return
        raise ValueError(
            f"`compute_metrics` needs labels, but the eval batch has no label column {self.module.label_names} "
            f"(`label_names`); the batch has the columns {sorted(map(str, batch))}. Add the labels to the eval "
            "dataset, set `args.label_names`, or evaluate without `compute_metrics`."
        )

    def _flush_batch_metrics(self, compute_result: bool) -> None:
        if self._pending_batch is None:
            return
        from transformers.trainer_utils import EvalPrediction

        logits, labels, inputs, losses = self._pending_batch
        self._pending_batch = None
        include = self.args.include_for_metrics
        pred = EvalPrediction(predictions=logits, label_ids=labels, inputs=inputs if "inputs" in include else None,
                              losses=losses if "loss" in include else None)
        self.batch_metrics = self.module.compute_metrics(pred, compute_result=compute_result)

    def _world(self) -> int:
        trainer = self.module._trainer
        return trainer.world_size if trainer is not None else 1

    def _gathered(self, value: Any) -> Any:
        """Every rank's value in rank order (ranks hold contiguous shards, so this is dataset order); on every rank."""
        if self._world() == 1:
            return [value]
        parts: list[Any] = [None] * self._world()
        torch.distributed.all_gather_object(parts, value)
        return parts

    def _concat(self, batches: list[Any]) -> Any:
        if not self.args.eval_do_concat_batches:
            return [b for b in batches if b is not None] or None
        return concat_padded(batches)

    def finish(self, prefix: str, num_samples: int | None = None) -> EvalResult:
        """Gather, compute the metrics, and return HF's metric dict with the `prefix_` keys and speed keys.

        `<prefix>_loss` is HF's by default: the sample-weighted mean of the batch mean losses. With
        `module.eval_loss_weighting = "tokens"` it is the mean over every label token of the eval set
        (`sum(batch_mean * batch_tokens) / sum(tokens)`), which does not depend on how the samples are batched.
        """
        from transformers.trainer_utils import EvalPrediction, speed_metrics

        gathered = self._gathered((self.num_samples, self.losses, self.preds, self.labels, self.inputs,
                                   self.token_loss_sum, self.token_count))
        total = sum(part[0] for part in gathered)
        n = num_samples if num_samples is not None else total
        pairs = [pair for part in gathered for pair in part[1]]
        losses = np.repeat(np.array([v for v, _ in pairs], dtype=np.float32), [n for _, n in pairs]) if pairs else None
        preds = self._concat([b for part in gathered for b in part[2]])
        labels = self._concat([b for part in gathered for b in part[3]])
        inputs = self._concat([b for part in gathered for b in part[4]])
        metrics: dict[str, Any] = {}
        compute = self.module.compute_metrics
        if self.streaming is not None:
            metrics = self.streaming.compute()
        elif self.per_batch:
            self._flush_batch_metrics(compute_result=True)
            metrics = dict(self.batch_metrics or {})
        elif compute is not None and preds is not None and labels is not None and not self.prediction_loss_only:
            extra: dict[str, Any] = {}
            if "inputs" in self.args.include_for_metrics:
                extra["inputs"] = inputs
            if "loss" in self.args.include_for_metrics:
                extra["losses"] = losses
            metrics = compute(EvalPrediction(predictions=preds, label_ids=labels, **extra))
        metrics = check_metrics(metrics, prefix)
        if losses is not None and np.size(losses):
            if self.weighting == "tokens":
                tokens = sum(part[6] for part in gathered)
                metrics[f"{prefix}_loss"] = sum(part[5] for part in gathered) / tokens if tokens else float("nan")
            else:
                finite = np.isfinite(losses)
                if self.args.logging_nan_inf_filter and finite.any():  # HF drops non-finite batch losses (T:3089-3094)
                    losses = losses[finite]
                metrics[f"{prefix}_loss"] = losses.mean().item()
        metrics = prefix_metrics(metrics, prefix)
        steps = math.ceil(n / (self.args.per_device_eval_batch_size * self._world()))
        metrics.update(speed_metrics(prefix, self.start, num_samples=n, num_steps=steps))
        return EvalResult(predictions=preds, label_ids=labels, metrics=metrics, num_samples=n)
