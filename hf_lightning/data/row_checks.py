"""Rows the model cannot take, named before training: one error with the split, row, column, value and what is allowed.

Without this, such a row ends the run at whichever step first draws it, with a framework error and the progress since
the last save lost: a label 7 with `num_labels=2` (`IndexError: Target 7 is out of bounds`), a sequence longer than the
model's position table (`IndexError: index out of range in self`), an empty row (`cannot reshape a tensor of 0
elements`), a token id past the vocabulary. A NaN regression label trains on and poisons the weights.

What is allowed comes from the model (`RowLimits.of`), as its own forward and loss decide, so valid HF data is never
refused:

- `input_ids`: not empty; ids in `[0, rows of the input embedding)`; no longer than the position table where the
  model has one (learned or sinusoidal absolute positions: BERT, RoBERTa, GPT-2, OPT, BART); rotary or relative
  positions (Llama, T5) take any length, so nothing is checked there;
- labels (`labels` / `label` / `label_ids`), by the model's head: sequence classification with integer labels:
  `[0, num_labels)`; with float labels: finite, one per row when `num_labels == 1` (regression), `num_labels` per
  row otherwise (HF's multi-label rule); token classification: `[0, num_labels)`; language modelling and seq2seq:
  `[0, vocabulary)`; `-100` (ignored by the loss) is always allowed for integer labels. A model with another head is
  not label-checked;
- seq2seq: `labels` / `decoder_input_ids` no longer than the decoder's position table.

`check_dataset` is one vectorised pass over the Arrow columns of a `datasets.Dataset` (before training);
`RowCheckingCollator` checks the rows of each batch as it is collated, for data that cannot be read ahead (a stream,
a torch dataset): the row is named when it is met.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn
from torch.utils.data import get_worker_info

from hf_lightning.model_wrappers import unwrap_model

__all__ = ["BadRowError", "RowCheckingCollator", "RowLimits", "can_check_ahead", "check_dataset", "check_features"]

IGNORE_INDEX = -100
LABEL_COLUMNS = ("labels", "label", "label_ids")
_BATCH_ROWS = 50_000
_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration", "ForSeq2SeqLM",
                "WithLMHead")


class BadRowError(ValueError):
    """A row of the data that the model cannot take."""


@dataclass(frozen=True)
class RowLimits:
    """What the model takes, from its config and modules (see the module docstring).

    Attributes:
        model_name: the model class, for messages.
        vocab_size: rows of the input embedding table (None: not checked).
        max_positions: the longest `input_ids` the position table takes (None: no table, any length).
        decoder_max_positions: the longest `labels` / `decoder_input_ids` (encoder-decoder models with a table).
        head: `sequence`, `token`, `lm` or None (labels not checked).
        num_labels: the classes of a classification head.
        problem_type: the config's `problem_type` (None: HF's rule from `num_labels` and the label dtype).
        label_vocab: the classes of an `lm` head (rows of the output embedding).
        float_dtype: the floating dtype float labels are computed in: the model's (its first floating parameter),
            never wider than float32, the dtype the collator turns Python floats into. A label past its range is
            `inf` there (1e200 in float32).
    """

    model_name: str
    vocab_size: int | None = None
    max_positions: int | None = None
    decoder_max_positions: int | None = None
    head: str | None = None
    num_labels: int | None = None
    problem_type: str | None = None
    label_vocab: int | None = None
    float_dtype: str = "float32"

    @property
    def float_max(self) -> float:
        """The largest finite float label (`float_dtype`'s range)."""
        if self.float_dtype == "bfloat16":
            return 3.3895313892515355e38
        return float(np.finfo(np.dtype(self.float_dtype)).max)

    @classmethod
    def of(cls, model: Any) -> RowLimits:
        """The limits of a transformers model (inside PEFT / compile wrappers); a model without a config has none."""
        model = unwrap_model(model)
        config = getattr(model, "config", None)
        name = type(model).__name__
        if config is None or not isinstance(model, nn.Module):
            return cls(model_name=name)
        encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        inputs, decoder = _position_limits(model, encoder_decoder)
        head, label_vocab = None, None
        if name.endswith("ForSequenceClassification"):
            head = "sequence"
        elif name.endswith("ForTokenClassification"):
            head = "token"
        elif name.endswith(_LM_SUFFIXES):
            head, label_vocab = "lm", _rows(getattr(model, "get_output_embeddings", lambda: None)())
            label_vocab = label_vocab or getattr(config, "vocab_size", None)
        return cls(model_name=name, vocab_size=_rows(_input_embeddings(model)), max_positions=inputs,
                   decoder_max_positions=decoder, head=head, num_labels=getattr(config, "num_labels", None),
                   problem_type=getattr(config, "problem_type", None), label_vocab=label_vocab,
                   float_dtype=_float_dtype(model))


def _float_dtype(model: nn.Module) -> str:
    """The name of the model's floating dtype, at most float32 wide (see `RowLimits.float_dtype`)."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            name = str(parameter.dtype).removeprefix("torch.")
            return name if name in ("float16", "bfloat16") else "float32"
    return "float32"


def _input_embeddings(model: Any) -> Any:
    try:
        return model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None


def _rows(module: Any) -> int | None:
    if isinstance(module, nn.Embedding):
        return int(module.num_embeddings)
    if isinstance(module, nn.Linear):
        return int(module.out_features)
    return None


def _position_limits(model: nn.Module, encoder_decoder: bool) -> tuple[int | None, int | None]:
    """`(inputs, decoder)`: the longest sequence each position table takes (None: no table).

    A table is an `nn.Embedding` named `*position*`, `wpe` or `embed_positions`: position `i` reads row `i + offset`
    (BART / OPT keep an `offset` of 2; RoBERTa-like tables start after their `padding_idx`).
    """
    inputs: list[int] = []
    decoder: list[int] = []
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        if not isinstance(module, nn.Embedding) or not ("position" in leaf or leaf in ("wpe", "embed_positions")):
            continue
        start = int(getattr(module, "offset", 0) or 0)
        if module.padding_idx is not None:
            start = max(start, int(module.padding_idx) + 1)
        limit = int(module.num_embeddings) - start
        (decoder if encoder_decoder and "decoder" in name else inputs).append(limit)
    return min(inputs, default=None), min(decoder, default=None)


# ----- the rules, over one column of many rows -----
@dataclass
class _Column:
    """One column of `rows` rows: its values (flattened for list columns) and, for a list column, each row's length
    and the row of each value."""

    name: str
    flat: np.ndarray
    lengths: np.ndarray | None = None
    parents: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.lengths) if self.lengths is not None else len(self.flat)

    def rows_with(self, bad_values: np.ndarray) -> np.ndarray:
        """A mask over the values -> a mask over the rows that hold one."""
        if self.parents is None:
            return bad_values
        mask = np.zeros(self.rows, dtype=bool)
        mask[self.parents[bad_values]] = True
        return mask

    def value(self, row: int) -> Any:
        """The row's value, for messages (a long list is cut)."""
        if self.parents is None:
            return self.flat[row].item()
        own = self.flat[self.parents == row]
        return own.tolist() if len(own) <= 12 else f"{own[:11].tolist()}... ({len(own)} values)"

    def bad_value(self, row: int, bad_values: np.ndarray) -> str:
        """The first bad value of the row, for messages (with its position and the row, in a list column)."""
        if self.parents is None:
            return f"value {self.flat[row].item()!r}"
        mine = self.parents == row
        position = int(np.flatnonzero(bad_values[mine])[0])
        return f"value {self.flat[mine][position].item()!r} at position {position} (the row: {self.value(row)})"


Rule = tuple[np.ndarray, Callable[[int], str]]
"""A mask over rows, and what is wrong with a bad row (its value and what is allowed)."""


def _rules(column: _Column, limits: RowLimits) -> list[Rule]:
    name, flat, lengths = column.name, column.flat, column.lengths
    integers, floats = flat.dtype.kind in "iu", flat.dtype.kind == "f"
    rules: list[Rule] = []
    ids = name in ("input_ids", "decoder_input_ids")
    if ids and lengths is not None:
        rules.append((lengths == 0, lambda row: (
            f"an empty row (0 tokens), which the model cannot take; drop it (e.g. `dataset.filter(lambda row: "
            f"len(row[{name!r}]) > 0)`) or fix its text")))
    if ids or (name in LABEL_COLUMNS and limits.head == "lm"):
        limit = limits.max_positions if name == "input_ids" else limits.decoder_max_positions
        if limit is not None and lengths is not None:
            rules.append((lengths > limit, lambda row: (
                f"{int(lengths[row])} tokens, longer than the {limit} positions of {limits.model_name}'s position "
                f"embeddings (it would fail with `index out of range`); tokenise with `truncation=True, "
                f"max_length={limit}` (the CLI: data.max_length / data.max_target_length <= {limit}), or drop the "
                "long rows")))
        vocab = limits.vocab_size if ids else limits.label_vocab
        if vocab is not None and integers:
            low = 0 if ids else IGNORE_INDEX
            allowed = (f"token ids in [0, {vocab}) (the rows of {limits.model_name}'s input embeddings: the tokenizer "
                       "and the model must agree)" if ids else _label_rule(limits, floats=False, column=name))
            rules.append(_value_rule(column, ((flat < 0) & (flat != low)) | (flat >= vocab), allowed))
        return rules
    if name not in LABEL_COLUMNS or limits.head not in ("sequence", "token") or not limits.num_labels:
        return rules
    if floats:
        allowed = _label_rule(limits, floats=True, column=name)
        # in the dtype the loss sees: a finite float64 such as 1e200 is inf in float32
        with np.errstate(invalid="ignore"):
            out_of_range = ~np.isfinite(flat) | (np.abs(flat) > limits.float_max)
        rules.append(_value_rule(column, out_of_range, allowed))
        if limits.head == "sequence" and not _regression(limits):  # HF's multi-label: num_labels floats per row
            count = (lengths != limits.num_labels) if lengths is not None else np.ones(column.rows, dtype=bool)
            rules.append((count, lambda row: f"value {column.value(row)!r} is not allowed: {allowed}"))
    elif integers and not (limits.head == "sequence" and _regression(limits)):
        if limits.head == "sequence" and lengths is not None:  # integer labels are one class id per row
            rules.append((np.ones(column.rows, dtype=bool), lambda row: (
                f"value {column.value(row)!r} is not allowed: one class id per row (integer labels are single-label "
                f"classes); multi-label rows are {limits.num_labels} floats, e.g. "
                f"`dataset.cast_column({name!r}, datasets.Sequence(datasets.Value('float32')))`")))
        bad = ((flat < 0) & (flat != IGNORE_INDEX)) | (flat >= limits.num_labels)
        rules.append(_value_rule(column, bad, _label_rule(limits, floats=False, column=name)))
    return rules


def _value_rule(column: _Column, bad_values: np.ndarray, allowed: str) -> Rule:
    return column.rows_with(bad_values), lambda row: f"{column.bad_value(row, bad_values)} is not allowed: {allowed}"


def _label_rule(limits: RowLimits, floats: bool, column: str) -> str:
    """What a label may be, in words."""
    if limits.head == "lm":
        return (f"token ids in [0, {limits.label_vocab}) ({limits.model_name}'s vocabulary), or {IGNORE_INDEX} for a "
                "token the loss ignores")
    if floats:
        dtype = f"in {limits.float_dtype}, |value| <= {limits.float_max:.4g}"
        if _regression(limits):
            return f"a finite number (a regression label: num_labels=1; {dtype})"
        return (f"{limits.num_labels} finite numbers per row (float labels with num_labels={limits.num_labels} are "
                f"multi-label, by HF's problem_type rule; {dtype}); for class ids cast the column to integers, e.g. "
                f"`dataset.cast_column({column!r}, datasets.Value('int64'))`")
    return (f"class ids in [0, {limits.num_labels}) (num_labels={limits.num_labels} in {limits.model_name}'s config), "
            f"or {IGNORE_INDEX} for a row or token the loss ignores; fix the data or the label mapping, or build the "
            "model with more labels (num_labels)")


def _regression(limits: RowLimits) -> bool:
    return limits.problem_type == "regression" or (limits.problem_type is None and limits.num_labels == 1)


class _Rows:
    """Where the rows of one part of the table read are in the dataset: the same rows, or through an indices mapping
    (`shuffle`, `select`, `filter`, `train_test_split` give a view of the table; rows outside the view are not the
    dataset's and are not refused)."""

    def __init__(self, view: np.ndarray | None) -> None:
        self.view = view
        if view is not None:
            self.order = np.argsort(view, kind="stable")
            self.sorted = view[self.order]

    def hits(self, mask: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """`(dataset rows, part rows)` of the rows `mask` marks in the part that starts at table row `start`."""
        if self.view is None:
            local = np.flatnonzero(mask)
            return local + start, local
        low, high = np.searchsorted(self.sorted, [start, start + len(mask)])
        rows, local = self.order[low:high], self.sorted[low:high] - start
        keep = mask[local]
        order = np.argsort(rows[keep], kind="stable")
        return rows[keep][order], local[keep][order]


def _raise_first(column: _Column, limits: RowLimits, split: str, where: Callable[[int], str],
                 rows: _Rows | None = None, start: int = 0) -> None:
    for mask, problem in _rules(column, limits):
        dataset_rows, local = (rows or _Rows(None)).hits(mask, start)
        if len(local):
            more = f" ({len(local) - 1} more such rows in this part of the data)" if len(local) > 1 else ""
            raise BadRowError(f"the {split} data, {where(int(dataset_rows[0]))}, column {column.name!r}: "
                              f"{problem(int(local[0]))}{more}.")


# ----- the vectorised pass over Arrow columns -----
def can_check_ahead(dataset: Any) -> bool:
    """A `datasets.Dataset` whose rows are its Arrow columns (no `set_transform`): one pass reads them all."""
    datasets = sys.modules.get("datasets")  # not imported: the data cannot be a `datasets.Dataset`
    return datasets is not None and isinstance(dataset, datasets.Dataset) and dataset.format.get("type") != "custom"


def check_dataset(dataset: Any, split: str, limits: RowLimits) -> None:
    """One vectorised pass over the Arrow columns of `dataset` (in parts of 50,000 rows of its table).

    Raises:
        BadRowError: for the first bad row of the first part that has one, naming the split, row index (the
            dataset's), column, value and what is allowed.
    """
    columns = [c for c in ("input_ids", "decoder_input_ids", *LABEL_COLUMNS) if c in dataset.column_names]
    if not columns:
        return
    table = getattr(dataset.data, "table", dataset.data)  # the Arrow table under `datasets`' wrapper
    indices = getattr(dataset, "_indices", None)  # `datasets`' view of the table; reading rows through it is a copy
    rows = _Rows(None if indices is None else np.asarray(indices.column(0).to_numpy(zero_copy_only=False)))
    for start in range(0, table.num_rows, _BATCH_ROWS):
        part = table.slice(start, _BATCH_ROWS)
        for name in columns:
            array = part.column(name).combine_chunks()
            if array.null_count:
                nulls = array.is_null().to_numpy(zero_copy_only=False)
                found, _ = rows.hits(nulls, start)
                if len(found):
                    raise BadRowError(f"the {split} data, row {int(found[0])}, column {name!r}: no value (None); "
                                      "every row needs one.")
                continue  # missing values only outside the dataset's view (a filter dropped them): part not read
            column = _arrow_column(name, array)
            if column is not None:
                _raise_first(column, limits, split, lambda row: f"row {row}", rows, start)


def _arrow_column(name: str, array: Any) -> _Column | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = pc.list_flatten(array)
        column = _Column(name, values.to_numpy(zero_copy_only=False),
                         lengths=pc.list_value_length(array).to_numpy(zero_copy_only=False),
                         parents=pc.list_parent_indices(array).to_numpy(zero_copy_only=False))
    else:
        values = array
        column = _Column(name, array.to_numpy(zero_copy_only=False))
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        return None  # nested lists, strings: not token ids nor labels of the heads checked here
    return column


# ----- rows met in a batch -----
def check_features(features: Sequence[Any], split: str, limits: RowLimits, batch: int, first: int = 0) -> None:
    """The rows of one batch, before collation (data that is not read ahead: streams, torch datasets).

    Args:
        features: the batch's rows, as the collator gets them.
        split: the data's name in messages.
        limits: what the model takes.
        batch: the batch's number (from 1), as read.
        first: how many rows were read before this batch (by this loader, in this process or worker).

    Raises:
        BadRowError: naming the row by its index as read (`first` + its place in the batch), and the batch.
    """
    rows = [f for f in features if isinstance(f, Mapping)]
    if len(rows) != len(features):
        return
    for name in ("input_ids", "decoder_input_ids", *LABEL_COLUMNS):
        present = [row for row in rows if name in row]
        if not present:
            continue
        if len(present) != len(rows) or any(row[name] is None for row in rows):
            position = next(i for i, row in enumerate(rows) if row.get(name) is None)
            raise BadRowError(f"the {split} data, {_as_read(first, position, batch)}, column {name!r}: no value "
                              "(None); every row needs one.")
        values = [np.asarray(_plain(row[name])) for row in rows]
        if any(v.dtype == object or v.ndim > 1 for v in values) or len({v.ndim for v in values}) > 1:
            continue
        if values[0].ndim == 1:
            lengths = np.array([len(v) for v in values])
            flat = np.concatenate(values) if sum(lengths) else np.zeros(0, dtype=values[0].dtype)
            column = _Column(name, flat, lengths=lengths, parents=np.repeat(np.arange(len(values)), lengths))
        else:
            column = _Column(name, np.array([v.item() for v in values]))
        _raise_first(column, limits, split, lambda row: _as_read(first, row, batch))


def _as_read(first: int, row: int, batch: int) -> str:
    """Where a row of a batch is in the data as it was read: its index in the stream (this worker's part of it under
    DataLoader workers), and its batch."""
    worker = get_worker_info()
    part = f" (DataLoader worker {worker.id}'s part)" if worker is not None else ""
    return f"row {first + row} of the stream as read{part} (row {row} of batch {batch})"


def _plain(value: Any) -> Any:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else value


class RowCheckingCollator:
    """A collator that checks each batch's rows (`check_features`) before the wrapped collator runs.

    Args:
        collator: the collator to wrap.
        split: the data's name in messages (`train`, `eval`...).
        limits: what the model takes.
    """

    def __init__(self, collator: Callable[[list[Any]], Any], split: str, limits: RowLimits) -> None:
        self.collator, self.split, self.limits = collator, split, limits
        self.batches = 0
        self.rows = 0  # rows read before the current batch: a bad row is named by its index in the stream

    def __call__(self, features: list[Any]) -> Any:
        self.batches += 1
        first, self.rows = self.rows, self.rows + len(features)
        check_features(features, self.split, self.limits, self.batches, first)
        return self.collator(features)
