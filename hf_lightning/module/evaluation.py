"""Evaluation as the HF Trainer does it: `prediction_step`, the metric dict's rules, and what a run returns.

- `hf_prediction_step` is `Trainer.prediction_step` (transformers `trainer.py`, `Trainer.prediction_step`).
- `check_metrics` / `prefix_metrics`: what `compute_metrics` may return and how its keys get the `eval_` prefix
  (`Trainer.evaluation_loop`'s renaming), and `note_missing_main_input`: a note naming the missing column when a
  model fails on an eval batch without its main input.
- `concat_padded`: per-batch arrays concatenated once, padded with -100 (the result of HF's `nested_concat`).
- The value types of a run: `EvalRequest` (what to run), `EvalStep` (what one `validation_step` / `predict_step`
  returns), `EvalResult` (one finished dataset: HF's `EvalLoopOutput`), `EvaluationOutput` (a whole `evaluate()` /
  `predict()`), and `EvalSettings` (what the accumulation needs from the module).

The accumulation across batches and processes is in `module/eval_run.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from transformers.trainer_pt_utils import nested_detach
from transformers.trainer_utils import denumpify_detensorize
from transformers.utils import can_return_loss

from hf_lightning.args import TrainingArguments

__all__ = [
    "EVAL_LOSS_WEIGHTINGS", "EvalRequest", "EvalResult", "EvalSettings", "EvalStep", "EvaluationOutput",
    "PredictionHooks", "check_metrics", "concat_padded", "hf_prediction_step", "note_missing_main_input",
    "prefix_metrics",
]

# Keys HF puts into every evaluation result; a compute_metrics key landing on one of them would overwrite it.
BUILT_IN_SUFFIXES = ("loss", "runtime", "samples_per_second", "steps_per_second", "model_preparation_time")
RESERVED_KEYS = ("epoch", "step", "total_flos")
EVAL_LOSS_WEIGHTINGS = ("samples", "tokens")


@dataclass(frozen=True)
class EvalRequest:
    """What one evaluation or prediction run is asked for (HF's `evaluate` / `predict` arguments).

    Attributes:
        metric_key_prefix: the metric keys' prefix (`eval`, `test`, ...).
        ignore_keys: output keys `prediction_step` drops (None: the model config's `keys_to_ignore_at_inference`).
        is_prediction: a `predict()` run: predictions always kept, no log entry, `on_predict` instead of `on_evaluate`.
        description: set for an `evaluation_loop` call (HF's `description`, e.g. "Evaluation", "Prediction"): the
            run only computes (no log entry, no `on_evaluate` / `on_predict`, no speed metrics); "Prediction" keeps
            the predictions as a `predict()` does.
        prediction_loss_only: the `evaluation_loop` call's resolved `prediction_loss_only`; None: HF's rule of
            `evaluate()` / `predict()` (the module's `prediction_loss_only`).
        loss_per_batch: how the caller gathers (HF's `gather_function`): True for `accelerator.gather` (every
            batch's mean loss counts `per_device_eval_batch_size` times, HF's `Seq2SeqTrainer.evaluate/predict`),
            False for `gather_for_metrics` (counted per sample, HF's `evaluation_loop` default); None: the module's
            own rule (`eval_settings`).
    """

    metric_key_prefix: str = "eval"
    ignore_keys: list[str] | None = None
    is_prediction: bool = False
    description: str | None = None
    prediction_loss_only: bool | None = None
    loss_per_batch: bool | None = None

    @property
    def keeps_predictions(self) -> bool:
        """Whether the run is a prediction for the accumulators (predictions kept, labels optional)."""
        return self.is_prediction or self.description == "Prediction"


@dataclass
class EvalStep:
    """What `validation_step` / `predict_step` return: `prediction_step`'s `(loss, logits, labels)`."""

    loss: torch.Tensor | None
    logits: Any
    labels: Any


@dataclass
class EvalResult:
    """One finished evaluation / prediction of one dataset (HF's `EvalLoopOutput`)."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, Any]
    num_samples: int


@dataclass
class EvaluationOutput:
    """What one `evaluate()` / `predict()` returned: every dataset's result, in evaluation order.

    Attributes:
        results: per eval dataset name (`""` for a single unnamed dataset).
    """

    results: dict[str, EvalResult] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, Any]:
        """Every dataset's metrics in one dict, as HF's `evaluate()` returns them for a dict of eval datasets."""
        merged: dict[str, Any] = {}
        for result in self.results.values():
            merged.update(result.metrics)
        return merged


@dataclass(frozen=True)
class EvalSettings:
    """What accumulating an evaluation needs to know about the module (all of it passed in, nothing looked up).

    Attributes:
        args: the training arguments (`include_for_metrics`, `batch_eval_metrics`, `eval_do_concat_batches`,
            `logging_nan_inf_filter`, `per_device_eval_batch_size`).
        compute_metrics: `fn(EvalPrediction) -> dict`, a streaming metric, or None.
        preprocess_logits_for_metrics: `fn(logits, labels) -> tensor`, or None.
        label_names: the label columns (HF's `label_names`).
        shift_labels: the model predicts token t + 1 at position t (a causal LM), for token counts.
        main_input_name: the model's main input column (for `include_for_metrics=["inputs"]`).
        eval_loss_weighting: "samples" (HF's `eval_loss`) or "tokens" (the mean over every label token).
        eval_loss_repeats: how often each batch's mean loss counts in the "samples" `eval_loss`: None for the
            batch's samples (HF's `Trainer`), or a fixed number (HF's `Seq2SeqTrainer` counts every batch
            `per_device_eval_batch_size` times, see `Seq2SeqTransformerModule.eval_settings`).
    """

    args: TrainingArguments
    compute_metrics: Callable[..., Any] | None = None
    preprocess_logits_for_metrics: Callable[..., Any] | None = None
    label_names: list[str] = field(default_factory=lambda: ["labels"])
    shift_labels: bool = False
    main_input_name: str = "input_ids"
    eval_loss_weighting: str = "samples"
    eval_loss_repeats: int | None = None


class PredictionHooks(Protocol):
    """The HF hooks `hf_prediction_step` calls, with the `transformers.Trainer` signatures (the module's `hooks`)."""

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]: ...

    def _get_num_items_in_batch(self, batch_samples: list[Any], device: Any) -> Any: ...

    def _prepare_context_parallel_inputs(self, model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[Any, Any]: ...

    def compute_loss_context_manager(self) -> Any: ...

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any: ...


def hf_prediction_step(
    hooks: PredictionHooks,
    label_names: list[str],
    model: torch.nn.Module,
    inputs: dict[str, Any],
    prediction_loss_only: bool,
    ignore_keys: list[str] | None,
    device: Any = None,
    can_return: bool | None = None,
) -> tuple[torch.Tensor | None, Any, Any]:
    """`Trainer.prediction_step`: loss (if labels), logits without `loss` and ignored keys, labels.

    The HF hooks it calls (`_prepare_inputs`, `_get_num_items_in_batch`, `compute_loss_context_manager`,
    `compute_loss`) are `hooks`' (the module's owner), in HF's order (T:3193-3300). `can_return` is HF's
    `self.can_return_loss` (a batch without labels gets its loss computed); None: from the model's `forward`.
    """
    if can_return is None:
        can_return = bool(can_return_loss(type(model)))
    try:
        return _prediction_step(hooks, label_names, model, inputs, prediction_loss_only, ignore_keys, device,
                                can_return)
    except Exception as err:  # any model may run without its main input (HF's does not check it): name it only
        note_missing_main_input(err, model, inputs)  # when the model's own error is what the user sees
        raise


def _prediction_step(
    hooks: PredictionHooks, label_names: list[str], model: torch.nn.Module, inputs: dict[str, Any],
    prediction_loss_only: bool, ignore_keys: list[str] | None, device: Any, can_return: bool,
) -> tuple[torch.Tensor | None, Any, Any]:
    has_labels = bool(label_names) and all(inputs.get(k) is not None for k in label_names)
    return_loss = inputs.get("return_loss")
    if return_loss is None:
        return_loss = can_return
    loss_without_labels = not label_names and return_loss
    inputs = hooks._prepare_inputs(inputs)
    if ignore_keys is None:
        config = getattr(model, "config", None)  # any nn.Module may be evaluated; only HF models have a config
        # HF's default (T:3235): transformers 5.24 names the output cache `cache` (5.23: `past_key_values`)
        ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", ["cache"])) if config else []
    labels = None
    if has_labels or loss_without_labels:
        labels = nested_detach(tuple(inputs.get(name) for name in label_names))
        labels = labels[0] if len(labels) == 1 else labels
    with torch.no_grad():
        if has_labels or loss_without_labels:
            num_items_in_batch = hooks._get_num_items_in_batch([inputs], device)
            cp_context, inputs = hooks._prepare_context_parallel_inputs(model, inputs)
            with hooks.compute_loss_context_manager(), cp_context():
                loss, outputs = hooks.compute_loss(model, inputs, return_outputs=True,
                                                   num_items_in_batch=num_items_in_batch)
            loss = loss.detach().mean()
            skip = [*ignore_keys, "loss"]
            logits = _without(outputs, skip) if isinstance(outputs, Mapping) else outputs[1:]
        else:
            loss = None
            with hooks.compute_loss_context_manager():
                outputs = model(**inputs)
            logits = _without(outputs, ignore_keys) if isinstance(outputs, Mapping) else outputs
    if prediction_loss_only:
        return loss, None, None
    logits = nested_detach(logits)
    if isinstance(logits, (tuple, list)) and len(logits) == 1:
        logits = logits[0]
    return loss, logits, labels


def _without(outputs: Mapping[str, Any], keys: list[str]) -> tuple[Any, ...]:
    return tuple(v for k, v in outputs.items() if k not in keys)


def prefix_metrics(metrics: dict[str, Any], prefix: str) -> dict[str, Any]:
    """HF's renaming (`evaluation_loop`): keys not starting with `prefix_` get it, and move after the prefixed ones."""
    out = dict(metrics)
    for key in list(out):
        if not key.startswith(f"{prefix}_"):
            out[f"{prefix}_{key}"] = out.pop(key)
    return out


def check_metrics(metrics: Any, prefix: str) -> dict[str, Any]:
    """Validate what `compute_metrics` returned: a dict of scalar numbers whose keys do not collide with HF's keys.

    Values are made plain Python numbers first (numpy scalars, one-element tensors/arrays: HF's
    `denumpify_detensorize`).

    Raises:
        TypeError: not a dict, or a value that is not a scalar number (the key, the value's type and shape).
        ValueError: a key that becomes one of the built-in keys (`<prefix>_loss`, runtime keys, `epoch`, `step`).
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(f"`compute_metrics` must return a dict of metric name -> number, got {type(metrics).__name__}.")
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.reshape(()).item()
        value = denumpify_detensorize(value)
        if not isinstance(value, (int, float)):
            shape = getattr(value, "shape", None)  # any type may come back from user code
            raise TypeError(
                f"`compute_metrics` returned a non-scalar or non-numeric value for {key!r}: {type(value).__name__}"
                f"{f' of shape {tuple(shape)}' if shape is not None else ''} ({str(value)[:60]!r}). Every value must "
                "be a single number (int or float, a numpy scalar or a one-element tensor); reduce it (e.g. a mean) "
                "or log per-class values under separate keys."
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


def note_missing_main_input(err: BaseException, model: torch.nn.Module, inputs: Mapping[str, Any]) -> None:
    """Add a note to `err` (raised by an eval / predict step) when the batch lacks the model's main input column.

    HF runs any model on the batch it gets (a model may take other inputs than `main_input_name`, e.g. `input_x` or
    `inputs_embeds`), so a missing column is not refused; when the model then fails, its message names no dataset
    column, and this note does.
    """
    main = getattr(model, "main_input_name", None)  # a PreTrainedModel attribute; plain modules have none
    if not isinstance(main, str) or main in inputs:
        return
    note = (
        f"The evaluation / prediction batch has no column {main!r}, which {type(model).__name__} takes as its main "
        f"input (`model.main_input_name`); the batch has the columns {sorted(map(str, inputs))}. If the model needs "
        f"it, add a {main!r} column to the eval / test dataset (tokenise it), or check the collator."
    )
    add_note = getattr(err, "add_note", None)  # Python 3.11+
    if callable(add_note):
        add_note(note)
    else:
        logging.getLogger(__name__).error(note)


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
        mapping_type: Any = type(first)  # the batches' own mapping class (a dict, a `BatchEncoding`...)
        return mapping_type({k: concat_padded([b[k] for b in batches], padding_index) for k in first})
    arrays = [np.asarray(b) for b in batches]
    if arrays[0].ndim == 0 or all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
        return np.concatenate(arrays, axis=0) if arrays[0].ndim else np.stack(arrays)
    tail = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
    out = np.full((sum(len(a) for a in arrays), *tail), padding_index, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        out[(slice(row, row + len(a)),) + tuple(slice(0, n) for n in a.shape[1:])] = a
        row += len(a)
    return out
