"""Collation: HF's default collator choice, `remove_unused_columns`, and cutting a window into micro-batches.

- `default_collator`: `DataCollatorWithPadding(processing_class)` for a tokenizer or sequence feature extractor,
  otherwise `default_data_collator` (T:562-568).
- `signature_columns` / `remove_unused_columns`: the model's `forward` parameter names plus `label`, `label_ids` and
  the label names (T:1179-1244; the transformers model's, inside PEFT and compile wrappers); a `datasets.Dataset`
  loses the other columns, other datasets are filtered per item.
- `missing_labels_problem`: a training `datasets.Dataset` whose label column has another name (`label_id`) would
  lose it to `remove_unused_columns` and fail at the first update with HF's "The model did not return a loss"; this
  names the dropped columns and the model's arguments before training.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase, default_data_collator
from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor
from transformers.utils import find_labels

from hf_lightning.model_wrappers import unwrap_model

__all__ = [
    "ColumnFilter",
    "default_collator",
    "find_label_names",
    "missing_labels_problem",
    "remove_unused_columns",
    "signature_columns",
]

Collator = Callable[[list[Any]], Any]


def default_collator(processing_class: Any = None) -> Collator:
    """HF's choice: pad with the tokenizer / feature extractor when one is given, else `default_data_collator`."""
    if isinstance(processing_class, (PreTrainedTokenizerBase, SequenceFeatureExtractor)):
        return DataCollatorWithPadding(processing_class)  # type: ignore[arg-type]  # HF passes extractors too
    return default_data_collator


def find_label_names(model: nn.Module) -> list[str]:
    """`forward` parameters whose name contains "label" (plus QA start/end positions), as `transformers.find_labels`,
    of the transformers model inside PEFT / compile wrappers (T:530-532)."""
    return find_labels(type(unwrap_model(model)))


def signature_columns(model: nn.Module, label_names: Sequence[str]) -> list[str]:
    """Columns the model can take: its `forward` parameters plus `label`, `label_ids` and the label names.

    The `forward` inspected is the transformers model's, inside PEFT (as HF, T:1179-1191) and `torch.compile` wrappers:
    a compiled model's own `forward(*args, **kwargs)` names no column (HF inspects that one and drops every input
    column of a model the user compiled; README "Compiling the model").
    """
    model = unwrap_model(model)
    forward = getattr(model, "forward", model)
    params = list(inspect.signature(forward).parameters)
    return list(dict.fromkeys([*params, "label", "label_ids", *label_names]))


def remove_unused_columns(dataset: Any, allowed: Sequence[str], description: str) -> Any:
    """Drop the columns of a `datasets.Dataset` that the model cannot take; other datasets are returned as they are.

    Raises:
        ValueError: no column would remain; the message lists the dataset's columns and the accepted ones.
    """
    columns = getattr(dataset, "column_names", None)
    if columns is None:
        return dataset
    keep = [c for c in columns if c in allowed]
    if not keep:
        raise ValueError(
            f"No columns in the {description} dataset match the model's forward method signature: the dataset has "
            f"columns {list(columns)}, the model accepts {[c for c in allowed if c != 'kwargs']}. Rename the columns "
            "(e.g. tokenise the text into `input_ids`) or set `remove_unused_columns=False`."
        )
    unused = [c for c in columns if c not in keep]
    return dataset.remove_columns(unused) if unused else dataset


_LABEL_COLUMNS = ("label", "label_ids")  # the default collators turn these into `labels`


def missing_labels_problem(columns: Sequence[str], allowed: Sequence[str], label_names: Sequence[str],
                           collator: Any) -> str | None:
    """Why training would get no labels, or None: `remove_unused_columns` drops some columns of the training data,
    none of the kept ones is a label column of the model (`label_names`, `label`, `label_ids`), and the collator is
    one of HF's defaults (`DataCollatorWithPadding`, `default_data_collator`), which only pass label columns on.
    Other collators may build labels themselves (language modelling), so they are not judged here.

    Args:
        columns: the training dataset's columns.
        allowed: the columns the model takes (`signature_columns`).
        label_names: the model's label arguments (`args.label_names` or `find_label_names`).
        collator: the training collator.
    """
    if not label_names or not (collator is default_data_collator or isinstance(collator, DataCollatorWithPadding)):
        return None
    dropped = [c for c in columns if c not in allowed]
    if len(dropped) == len(columns):
        return None  # no column is kept: `remove_unused_columns`'s own error says more
    if not dropped or any(c in columns for c in (*label_names, *_LABEL_COLUMNS)):
        return None
    candidates = [c for c in dropped if "label" in c.lower()] or dropped
    inputs = [c for c in allowed if c not in (*label_names, *_LABEL_COLUMNS, "kwargs")]
    return (
        f"The training dataset has no label column the model takes ({', '.join(label_names)}, or label / label_ids): "
        f"remove_unused_columns drops {dropped}, which the model's forward does not take (its arguments: {inputs}), "
        "so the model would get no labels and return no loss. Rename the label column, e.g. "
        f"dataset.rename_column({candidates[0]!r}, {label_names[0]!r})."
    )


class ColumnFilter:
    """Wraps a collator to drop unknown keys per item, for datasets that are not a `datasets.Dataset` (HF's
    `RemoveColumnsCollator`)."""

    def __init__(self, collator: Collator, allowed: Sequence[str]) -> None:
        self.collator = collator
        self.allowed = set(allowed)

    def __call__(self, features: list[Any]) -> Any:
        if features and isinstance(features[0], Mapping):
            features = [{k: v for k, v in f.items() if k in self.allowed} for f in features]
        return self.collator(features)
