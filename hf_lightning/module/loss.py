"""Loss helpers of the HF Trainer: label counting for `num_items_in_batch`, model introspection, loss extraction.

- `model_accepts_loss_kwargs` (T:515-528) and `loss_shifts_labels` (T:543-545) inspect the model once (the
  transformers model inside compile / DDP / PEFT wrappers, as HF: `model_wrappers.unwrap_model`).
- `count_label_tokens` is HF's `_get_num_items_in_batch` for one micro-batch (T:2289-2367): `labels != -100`, over
  `labels[..., 1:]` for causal-LM losses, or `shift_labels` when the collator provides it.
- `count_samples` is the number of samples of a batch, padding-free (flattened) batches included.
- `loss_from_outputs` is the tail of `Trainer.compute_loss` (T:2202-2208), with HF's error naming the output keys.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.trainer_pt_utils import LabelSmoother, find_batch_size

from hf_lightning.model_wrappers import unwrap_model

__all__ = [
    "count_label_tokens",
    "count_samples",
    "is_causal_lm",
    "label_smoother",
    "loss_from_outputs",
    "loss_shifts_labels",
    "model_accepts_loss_kwargs",
    "unwrap_model",
]


def model_accepts_loss_kwargs(model: nn.Module) -> bool:
    """HF's rule: the model's `accepts_loss_kwargs` attribute, else whether `forward` takes `**kwargs`."""
    model = unwrap_model(model)
    if hasattr(model, "accepts_loss_kwargs"):
        return bool(model.accepts_loss_kwargs)
    params = inspect.signature(model.forward).parameters.values()
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)


def is_causal_lm(model: nn.Module) -> bool:
    """Whether HF's label smoother shifts labels for this model (its class is a registered causal LM)."""
    return unwrap_model(model)._get_name() in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()


def loss_shifts_labels(model: nn.Module) -> bool:
    """Whether the model's loss predicts `labels[..., 1:]` (a decoder-only causal-LM loss).

    HF decides with `LOSS_MAPPING[model.loss_type] is ForCausalLMLoss`; `loss_type` is derived from the class name, so
    we also accept every registered causal-LM class. Encoder-decoder models never shift (their decoder input is).
    """
    model = unwrap_model(model)
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    if LOSS_MAPPING.get(str(getattr(model, "loss_type", None))) is ForCausalLMLoss:
        return True
    return is_causal_lm(model)


def count_label_tokens(inputs: Mapping[str, Any], shift: bool) -> torch.Tensor | None:
    """Label positions that contribute to the loss in one micro-batch, or None when it has no `labels` tensor."""
    if "shift_labels" in inputs and torch.is_tensor(inputs["shift_labels"]):
        return inputs["shift_labels"].ne(-100).sum()
    labels = inputs.get("labels")
    if not torch.is_tensor(labels):
        return None
    if shift and labels.dim() >= 2:
        labels = labels[..., 1:]
    return labels.ne(-100).sum()


def count_samples(batch: Mapping[str, Any] | Sequence[Any]) -> int:
    """The samples in one collated batch: its first dimension (HF's `find_batch_size`), except for a padding-free
    batch (`DataCollatorWithFlattening`: one row of concatenated sequences whose `position_ids` restart at 0 at each
    sequence), which holds as many samples as sequences. HF weights an eval batch's loss by
    `per_device_eval_batch_size` samples (the last one by the rest of the dataset, T:3006-3008), which is the number
    of sequences in a flattened batch too; 1 per row would weigh a batch of 4 sequences like one of 3. A batch that
    is a list of rows (TRL's GRPO collates none: its rows are its samples) counts its rows, which is HF's weighting
    too (`per_device_eval_batch_size`, the last batch by the rest of the dataset).
    """
    if not isinstance(batch, Mapping):
        return max(len(batch), 1)
    position_ids = batch.get("position_ids")
    main = next((v for v in batch.values() if torch.is_tensor(v) and v.dim() >= 1), None)
    if torch.is_tensor(position_ids) and position_ids.dim() == 2 and position_ids.shape[0] == 1 \
            and main is not None and main.shape[0] == 1:
        return max(int(position_ids.eq(0).sum()), 1)
    return int(find_batch_size(dict(batch)) or 1)


def loss_from_outputs(outputs: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
    """`outputs["loss"]` (dict-like) or `outputs[0]` (tuple); HF's error when a dict output has no loss."""
    if isinstance(outputs, Mapping) and "loss" not in outputs:
        raise ValueError(
            "The model did not return a loss from the inputs, only the following keys: "
            f"{','.join(outputs.keys())}. For reference, the inputs it received are {','.join(inputs.keys())}."
        )
    if isinstance(outputs, Mapping):
        loss = outputs["loss"]
    elif torch.is_tensor(outputs):
        loss = outputs
    else:
        loss = outputs[0]
    if loss is None:
        raise ValueError(
            "The model returned `loss=None`: it needs labels to compute a loss. The inputs it received are "
            f"{','.join(inputs.keys())}; check `label_names` and that the dataset has a label column."
        )
    return loss


def label_smoother(model: nn.Module, factor: float) -> LabelSmoother | None:
    """HF's `LabelSmoother` for `label_smoothing_factor`, or None (no smoothing, or a multi-label classifier, where
    HF's smoother does not apply: disabled with a warning)."""
    if not factor:
        return None
    if getattr(getattr(model, "config", None), "problem_type", None) == "multi_label_classification":
        warnings.warn("Label smoothing is not compatible with multi-label classification; disabled.", UserWarning,
                      stacklevel=3)
        return None
    return LabelSmoother(epsilon=factor)
