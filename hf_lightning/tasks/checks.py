"""Data against model, checked after loading and before training: every mismatch is one error naming the `data.` or
`model.` key, instead of a traceback from inside `datasets.map` or the model's forward during training.

- columns: the text column(s) in every split; the label column in the splits whose labels are used (training data,
  and evaluation data);
- text cells: `text_cells.check_text_cells` (reads Arrow columns);
- labels: every label value of the data is in the label list; an explicit `num_labels` agrees with it;
- lengths: the task's length fields (`Task.length_fields`: `data.max_length`, `data.block_size` for language
  modelling; `data.max_target_length` for a decoder with position embeddings) fit the model's position embeddings.
"""

from __future__ import annotations

from typing import Any

from hf_lightning.tasks.task import Task

__all__ = ["check_columns", "check_explicit_num_labels", "check_label_values", "check_lengths", "position_limit"]

_LABELLED_SPLITS = ("train", "validation")  # `test` may come without labels (prediction data)
# position ids of these models start after the padding index, so `pad_token_id + 1` embeddings are never a position
_PADDING_OFFSET_TYPES = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text")


def check_columns(task: Task, spec: Any, raw: dict[str, Any]) -> None:
    """Every loaded split has the text column(s); training and evaluation splits have the label column.

    Raises:
        ValueError: naming the `data.` key, the split, its value and the columns that exist.
    """
    for split, dataset in raw.items():
        names = getattr(dataset, "column_names", None)
        if names is None:
            continue
        for key in ("text_column", "text_pair_column"):
            column = getattr(spec, key, None)
            if column and column not in names:
                raise ValueError(f"data.{key}={column!r} is not a column of the {split} data; its columns: {names}.")
        if task.label_values is not None and split in _LABELLED_SPLITS and spec.label_column not in names:
            raise ValueError(f"data.label_column={spec.label_column!r} is not a column of the {split} data; its "
                             f"columns: {names}.")


def check_label_values(task: Task, spec: Any, raw: dict[str, Any], labels: list[str] | None) -> None:
    """Every label value of every split with labels is in the label list (`_label_id` maps `str(value)`).

    Raises:
        ValueError: naming the unknown values, the split and where the label list came from.
    """
    if task.label_values is None or labels is None:
        return
    known = set(labels)
    for split, dataset in raw.items():
        if dataset is None or spec.label_column not in getattr(dataset, "column_names", []):
            continue
        unknown = sorted({str(v) for v in task.label_values(dataset, spec)} - known)
        if unknown:
            source = "data.label_list" if spec.label_list else "the model's id2label"
            raise ValueError(
                f"data.label_column={spec.label_column!r}: the {split} data has label(s) {unknown[:10]} that are not "
                f"in the label list {labels} ({source}: {len(labels)} classes); add them to data.label_list, or fix "
                "the data."
            )


def check_explicit_num_labels(model_spec: Any, labels: list[str] | None) -> None:
    """A `num_labels` set in `model.config_kwargs` / `model.config_overrides` agrees with the label list (the
    label list decides the classifier size, so a different number would be silently replaced).

    Raises:
        ValueError: naming the key, its value and the number of classes.
    """
    if labels is None:
        return
    for key in ("config_kwargs", "config_overrides"):
        value = getattr(model_spec, key, {}).get("num_labels")
        if value is not None and value != len(labels):
            raise ValueError(f"model.{key}.num_labels={value} but the data has {len(labels)} classes ({labels}); "
                             "drop num_labels (it follows the label list) or fix data.label_list.")


def position_limit(config: Any) -> int | None:
    """The longest sequence the model's position embeddings accept, or None (relative positions, e.g. T5)."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            if getattr(config, "model_type", "") in _PADDING_OFFSET_TYPES:
                value -= int(getattr(config, "pad_token_id", None) or 0) + 1
            return value
    return None


def check_lengths(task: Task, spec: Any, config: Any,
                  positions: tuple[int | None, int | None] | None = None) -> None:
    """The configured sequence lengths fit the model's position embeddings.

    Args:
        task: the task (its `length_fields`).
        spec: the `data:` section.
        config: the model's config (for messages, and the limits when `positions` is None).
        positions: `(inputs, decoder)` limits measured on the model's position tables (`row_checks.RowLimits`):
            a model with rotary or relative positions (Llama, T5), which takes any length, has None.

    Raises:
        ValueError: naming the `data.` key, its value, the model's limit and the config attribute it comes from.
    """
    inputs, decoder = positions if positions is not None else (position_limit(config), position_limit(config))
    keys = [(key, inputs) for key in task.length_fields]  # the preset's, so a derived task keeps them
    if getattr(config, "is_encoder_decoder", False):
        keys.append(("max_target_length", decoder))
    for key, limit in keys:
        value = getattr(spec, key)
        if limit is not None and value > limit:
            raise ValueError(
                f"data.{key}={value} is longer than the model's position embeddings allow ({limit} tokens, from "
                f"its config {type(config).__name__}); lower data.{key} to {limit} or less (or build the model with "
                "more positions, e.g. model.config_kwargs.max_position_embeddings)."
            )
