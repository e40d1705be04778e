"""`train_sampling_strategy="group_by_length"`: HF's length-grouped training order, seeded per epoch.

HF's `LengthGroupedSampler` (transformers `trainer_pt_utils.py`, built at T:1088-1105 with batch size
`per_device_train_batch_size * gradient_accumulation_steps`) permutes the samples, cuts the permutation into
megabatches of `min(n // (4 * batch), 50)` batches, sorts each megabatch by length (longest first), and moves the
longest sample of all to the very first position so an out-of-memory error comes at once. accelerate then hands
out its batches to the processes like any other order.

Lengths come from the `length_column_name` column when the dataset has one, else from the length of each sample's
main input (`processing_class.model_input_names[0]`, default `input_ids`).

Differences from HF (README "Length-grouped batches"), where HF is weak:
- the permutation is a pure function of `data_seed` (or `seed`) and the epoch, so a resumed run continues the
  epoch's order exactly: the first epoch's is HF's fresh-run order (`length_grouped_order`), later epochs use
  `seed + epoch`; HF draws it from torch's global generator at each epoch start, so from the second epoch on (and
  after any resume) it depends on everything drawn before, and HF ignores `data_seed` here;
- the length column is read before `remove_unused_columns` drops it (HF drops it first and silently measures the
  inputs instead);
- evaluation keeps dataset order (HF length-groups evaluation and prediction too, so `predict()` returns its rows
  in a shuffled order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers.trainer_pt_utils import get_length_grouped_indices

__all__ = ["length_grouped_order", "refuse_unsized", "sample_lengths", "train_sample_lengths"]


def sample_lengths(dataset: Any, length_column: str, model_input_name: str) -> list[int]:
    """The length of every sample: the `length_column` values when the dataset has that column, else the length of
    each sample's `model_input_name` (HF's `LengthGroupedSampler` rule).

    Raises:
        ValueError: the dataset has neither (names both and what the samples hold).
    """
    columns = getattr(dataset, "column_names", None)
    if columns is not None:
        if length_column in columns:
            return [int(n) for n in dataset[length_column]]
        if model_input_name in columns:
            return [len(x) for x in dataset[model_input_name]]
    else:
        first = dataset[0] if len(dataset) else None
        if isinstance(first, Mapping) and model_input_name in first:
            return [len(dataset[i][model_input_name]) for i in range(len(dataset))]
        columns = list(first) if isinstance(first, Mapping) else f"{type(first).__name__} samples"
    raise ValueError(
        f"train_sampling_strategy='group_by_length' needs sample lengths: the train dataset has no "
        f"`length_column_name`={length_column!r} column and no {model_input_name!r} input to measure (it has "
        f"{columns}). Add a length column, or set `length_column_name` to the column holding the lengths."
    )


def length_grouped_order(lengths: Sequence[int], group_batch_size: int, seed: int, epoch: int) -> list[int]:
    """The sample order of one epoch: HF's length grouping (`get_length_grouped_indices`) over a permutation drawn
    from a generator that is a pure function of `(seed, epoch)`, so a resumed run redraws it.

    Epoch 0 is HF's fresh-run order: HF's sampler draws from torch's global generator, which `Trainer.__init__`
    seeded with `seed` (`set_seed`) and from which the first `DataLoader` iterator drew one int64 (its base seed,
    torch `_BaseDataLoaderIter`) before the sampler runs; the same generator state is rebuilt here. Later epochs use
    `seed + epoch` (HF's state there depends on every draw of the training before; README "Length-grouped
    batches")."""
    generator = torch.Generator()
    if epoch == 0:
        generator.manual_seed(seed)
        torch.empty((), dtype=torch.int64).random_(generator=generator)  # the DataLoader iterator's base seed
    else:
        generator.manual_seed(seed + epoch)
    return [int(i) for i in get_length_grouped_indices(list(lengths), group_batch_size, generator=generator)]


def refuse_unsized(dataset: Any) -> None:
    """Refuse `group_by_length` over an `IterableDataset`, where HF warns and reads it in its own order (T:1075-1085).

    Raises:
        ValueError: `dataset` is a torch `IterableDataset` (a `datasets` one included).
    """
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise ValueError(
            "train_sampling_strategy='group_by_length' needs a map-style train dataset; an IterableDataset has "
            "no lengths to group by and is read in its own order. Use train_sampling_strategy='random', or a "
            "map-style dataset."
        )


def train_sample_lengths(dataset: Any, length_column: str, processing_class: Any) -> list[int]:
    """`group_by_length`'s lengths of a train dataset (`sample_lengths`, the tokenizer's first model input as the
    column to measure); an unsized dataset is refused (`refuse_unsized`)."""
    refuse_unsized(dataset)
    names = getattr(processing_class, "model_input_names", None)
    return sample_lengths(dataset, length_column, names[0] if names else "input_ids")
