"""`train_sampling_strategy="group_by_length"`: HF's length-grouped training order, drawn where HF draws it.

HF's `LengthGroupedSampler` (transformers `trainer_pt_utils.py`, built at T:1088-1105 with batch size
`per_device_train_batch_size * gradient_accumulation_steps`) permutes the samples, cuts the permutation into
megabatches of `min(n // (4 * batch), 50)` batches, sorts each megabatch by length (longest first), and moves the
longest sample of all to the very first position so an out-of-memory error comes at once. accelerate then hands
out its batches to the processes like any other order.

HF's sampler has no generator of its own: each epoch's permutation is drawn from torch's global CPU generator when
the epoch's loader iterator first asks for indices, right after that iterator drew its base seed (accelerate's
`DataLoaderShard` syncs no generator for it). So it depends on every draw of the training before it: the seed
`Trainer.__init__` set, dropout, random collators, the evaluations' loader iterators. hf_lightning's global generator
draws the same values in the same order (`windows.py`), so `draw_grouping_state` takes the generator's state at that
same point and moves it on as HF's `randperm` does, and `length_grouped_order` turns the state into the order: every
epoch is HF's. The state is what a checkpoint keeps (`TransformerDataModule.state_dict`), so a run resumed inside an
epoch gets that epoch's order back (HF's own resume draws another one; from a checkpoint without the state, one
written by `transformers.Trainer`, the order is drawn as HF's resume draws it).

Lengths come from the `length_column_name` column when the dataset has one, else from the length of each sample's
main input (`processing_class.model_input_names[0]`, default `input_ids`).

Differences from HF (README "Length-grouped batches"), where HF is weak:
- under several processes every process uses rank 0's draw (HF's processes draw each from their own generator,
  which can differ once their batches differ, and then their shards overlap);
- the length column is read before `remove_unused_columns` drops it (HF drops it first and silently measures the
  inputs instead);
- evaluation keeps dataset order (HF length-groups evaluation and prediction too, so `predict()` returns its rows
  in a shuffled order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers.trainer_pt_utils import get_length_grouped_indices

__all__ = [
    "draw_grouping_state", "length_grouped_order", "refuse_unsized", "sample_lengths", "train_sample_lengths",
]


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


def length_grouped_order(lengths: Sequence[int], group_batch_size: int, rng_state: torch.Tensor) -> list[int]:
    """The sample order of one epoch: HF's length grouping (`get_length_grouped_indices`) of the permutation a
    generator in state `rng_state` draws (pure: the same state gives the same order).

    Args:
        lengths: the samples' lengths.
        group_batch_size: the samples per length group (HF: `train_batch_size * gradient_accumulation_steps`).
        rng_state: a CPU generator state (`draw_grouping_state`, or the one a checkpoint kept).
    """
    generator = torch.Generator()
    generator.set_state(rng_state)
    return [int(i) for i in get_length_grouped_indices(list(lengths), group_batch_size, generator=generator)]


def draw_grouping_state(num_samples: int) -> torch.Tensor:
    """The state from which HF's `LengthGroupedSampler` would draw an epoch's permutation now: torch's global CPU
    generator's, which then moves on past that draw as HF's does (`randperm(num_samples)`), so that dropout and the
    rest draw after it what they draw under HF. Under several processes, rank 0's state (every process must cut the
    same order into its shard).

    Must run where HF's sampler runs: when the epoch's loader iterator first asks for indices (on every process at
    once, since the broadcast is a collective).
    """
    return draw_global_state(lambda: torch.randperm(num_samples))  # HF's draw (`get_length_grouped_indices`)


def draw_global_state(draw: Callable[[], object]) -> torch.Tensor:
    """The state of torch's global CPU generator before `draw()` (a sampler's draw from it, which moves it on as
    under HF); under several processes, rank 0's state (a collective: every process calls it at the same point)."""
    state = torch.get_rng_state()
    draw()
    if torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1:
        shared = [state]
        torch.distributed.broadcast_object_list(shared, src=0)
        state = shared[0]
    return state


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
