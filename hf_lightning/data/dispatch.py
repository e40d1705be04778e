"""`accelerator_config={"dispatch_batches": True}` under several processes: rank 0 reads every batch and sends each
process its part, as accelerate's `DataLoaderDispatcher` (what HF's Trainer trains on with that setting).

accelerate's rule, reproduced by `DispatchLoader` (the rows each process gets are `dispatch_slice`'s, a pure
function):

- Every step rank 0 reads one *round* from the whole loader: `processes` batches (one batch with `split_batches`),
  joined along dim 0. Process `r` keeps rows `[r * b, (r + 1) * b)` with `b = rows // processes`: in a full round
  that is the round's batch `r`, the batch it would read itself without dispatching.
- The last round (fewer batches, or a short last batch) is split evenly; when its rows do not divide, they are
  completed with the first `processes` rows of the epoch's first round and `b` is rounded up (every process gets as
  many rows; at most `processes - 1` rows repeat). With `dataloader_drop_last` an incomplete round is dropped.
- `len`: `ceil(len(loader) / processes)` steps (floor with `drop_last`; `len(loader)` with `split_batches`).
- Every process starts an iterator of the whole loader at each epoch (its seed draw from the global generator, as
  accelerate's), only rank 0 reads from it, so only rank 0's collator draws its random numbers (masks).

One difference from accelerate, on purpose: the round is broadcast as the collator made its batches and every process
joins them, so batches of different shapes raise accelerate's error on every process at once (accelerate raises on
rank 0 and leaves the others waiting in the broadcast).

A resumed epoch skips its trained steps without reading them when the loader can start later (`windows.start_after`
on hf_lightning's own samplers): only the first round is read, for the rows that may complete the last round. A
stream (no length) is read and dropped up to the resume point, as accelerate's `skip_first_batches` does. A resume
on another number of processes (`checkpoint/elastic.py`) dispatches the rest of the epoch's order as a whole epoch
(`DispatchedOrder`): its last round is completed with the rest's first rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch
import torch.distributed as dist

from hf_lightning.data.windows import is_sized, set_loader_epoch, start_after

__all__ = ["DispatchLoader", "DispatchedOrder", "dispatch_slice", "join_batches", "rows_of", "slice_rows"]

_SHAPES = ("You can't use batches of different size with `dispatch_batches=True` or when using an `IterableDataset`."
           "either pass `dispatch_batches=False` and have each process fetch its own batch  or pass "
           "`split_batches=True`. By doing so, the main process will fetch a full batch and slice it into "
           "`num_processes` batches for each process.")
"""accelerate's words for a round whose batches cannot be joined (data_loader.py, `_fetch_batches`)."""


def join_batches(batches: list[Any]) -> Any:
    """Batches joined along dim 0, leaf by leaf (dicts, lists, tuples of tensors), as accelerate's `concatenate`.

    Raises:
        RuntimeError: tensors whose shapes beyond dim 0 differ (accelerate's words).
        TypeError: a leaf that is not a tensor.
    """
    first = batches[0]
    if isinstance(first, Mapping):
        return cast(Any, type(first))({key: join_batches([batch[key] for batch in batches]) for key in first})
    if isinstance(first, (list, tuple)):
        return type(first)(join_batches([batch[i] for batch in batches]) for i in range(len(first)))
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"dispatch_batches=True joins tensors (nested in dicts, lists, tuples), but the collator gave "
                        f"a {type(first).__name__}; use dispatch_batches=None to let each process read its own "
                        "batches.")
    try:
        return torch.cat(batches, dim=0)
    except RuntimeError as error:
        raise RuntimeError(_SHAPES) from error


def rows_of(batch: Any) -> int:
    """The rows of a batch: dim 0 of its first tensor (accelerate's `find_batch_size`)."""
    if isinstance(batch, Mapping):
        return rows_of(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)):
        return rows_of(batch[0])
    return int(batch.shape[0])


def slice_rows(batch: Any, rows: slice) -> Any:
    """`batch[rows]` leaf by leaf (accelerate's `slice_tensors`)."""
    if isinstance(batch, Mapping):
        return cast(Any, type(batch))({key: slice_rows(value, rows) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        return type(batch)(slice_rows(value, rows) for value in batch)
    return batch[rows]


def dispatch_slice(rows: int, processes: int, rank: int) -> tuple[slice, int]:
    """Rank `rank`'s rows of a round of `rows` rows, and how many of the epoch's first rows complete the round first
    (0 unless `rows` does not divide by `processes`; accelerate's `DataLoaderDispatcher.__iter__`)."""
    size, rest = divmod(rows, processes)
    completed = 0
    if rest:
        size += 1
        completed = size * processes - rows
    return slice(rank * size, (rank + 1) * size), completed


class DispatchedOrder:
    """The whole loader's batch sampler (`sampling.WindowBatchSampler`) as one process sees it under dispatching: a
    step takes `per_round` of its batches, so positions and counts are those of `per_round` processes (what
    `windows.WindowStream` and the elastic resume read: `batch_size`, `world_size`, `num_microbatches`,
    `start_sample`).

    Args:
        whole: the whole loader's batch sampler (one process's view of every sample).
        per_round: batches per step (the processes; 1 with `split_batches`).
        drop_last: an incomplete last round is dropped.
    """

    def __init__(self, whole: Any, per_round: int, drop_last: bool) -> None:
        self.whole, self.per_round, self.drop_last = whole, per_round, drop_last

    @property
    def batch_size(self) -> int:
        return int(self.whole.batch_size)

    @property
    def world_size(self) -> int:
        return self.per_round

    @property
    def num_samples(self) -> int:
        return int(self.whole.num_samples)

    @property
    def start_sample(self) -> int:
        """Elastic resume: the next iteration is the rest of the epoch's order after this many samples, dispatched
        as a whole epoch would be (its last round completed with the rest's first rows)."""
        return int(self.whole.start_sample)

    @start_sample.setter
    def start_sample(self, value: int) -> None:
        self.whole.start_sample = value

    def num_microbatches(self, start_sample: int = 0) -> int:
        """Steps per epoch (of the rest after `start_sample` samples) on every process."""
        whole = self.whole.num_microbatches(start_sample)
        return whole // self.per_round if self.drop_last else -(-whole // self.per_round)


class DispatchLoader:
    """This process's batches of `loader` under `dispatch_batches=True` (module docstring).

    Args:
        loader: the whole loader (every sample, per-process batch size; the batch of all processes with
            `split_batches`), read on rank 0 only.
        processes: the number of processes.
        rank: this process.
        split_batches: accelerate's `split_batches` (a round is one batch, split).
        drop_last: `dataloader_drop_last` (an incomplete round is dropped).

    Attributes:
        total_batch_size: accelerate's: the rows of a full round.
        skip: steps of the next iteration already trained (a resume), skipped once.
    """

    def __init__(self, loader: Any, processes: int, rank: int, split_batches: bool = False,
                 drop_last: bool = False) -> None:
        self.loader = loader
        self.processes, self.rank = processes, rank
        self.per_round = 1 if split_batches else processes
        self.drop_last = drop_last
        self.total_batch_size = loader.batch_sampler.batch_size * self.per_round if hasattr(
            getattr(loader, "batch_sampler", None), "batch_size") else (loader.batch_size or 0) * self.per_round
        self.skip = 0

    @property
    def batch_sampler(self) -> DispatchedOrder | None:
        """The whole loader's order as this process's steps (`DispatchedOrder`), when it can start at a sample
        (hf_lightning's own `seed + epoch` order); else None."""
        whole = getattr(self.loader, "batch_sampler", None)
        return DispatchedOrder(whole, self.per_round, self.drop_last) if hasattr(whole, "start_sample") else None

    @property
    def dataset(self) -> Any:
        """The whole loader's dataset (HF's `num_examples` reads its length)."""
        return self.loader.dataset

    @property
    def batch_size(self) -> int:
        """The rows a process gets from a full round."""
        return self.total_batch_size // self.processes

    def set_epoch(self, epoch: int) -> None:
        """The epoch reaches the whole loader (its sampler's `seed + epoch` order), as accelerate's `set_epoch`."""
        set_loader_epoch(self.loader, epoch)

    def __len__(self) -> int:
        """Steps per epoch (accelerate's `DataLoaderDispatcher.__len__`); a `TypeError` for a stream."""
        whole = len(self.loader)
        return whole // self.per_round if self.drop_last else -(-whole // self.per_round)

    def start_after(self, count: int) -> DispatchLoader:
        """This loader, whose next iteration starts after its first `count` steps (`windows.start_after`)."""
        self.skip = count
        return self

    def _round(self, iterator: Iterator[Any] | None) -> list[Any]:
        """The next round's batches, read on rank 0 and broadcast to every process (empty: the epoch is over)."""
        batches: list[Any] = []
        if self.rank == 0:
            assert iterator is not None
            for _ in range(self.per_round):
                batch = next(iterator, None)
                if batch is None:
                    break
                batches.append(batch)
        holder = [batches]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def _first_rows(self) -> Any:
        """The epoch's first `processes` rows, from its first round read apart (a resumed epoch starts after it). Its
        draws are undone: a resumed run loads its RNG states after its first window is fetched
        (`checkpoint/restore.py`)."""
        first = self._round(iter(self.loader) if self.rank == 0 else None)
        return slice_rows(join_batches(first), slice(0, self.processes)) if first else None

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        first: Any = None
        source = self.loader
        if skip and is_sized(self.loader):  # a stream is read and dropped instead, as accelerate's
            if not self.drop_last:
                first = self._first_rows()
            source, skip = start_after(self.loader, skip * self.per_round), 0
        iterator = iter(source)  # on every process: its seed draw, as accelerate's
        step = 0
        while True:
            batches = self._round(iterator if self.rank == 0 else None)
            if not batches or (self.drop_last and len(batches) < self.per_round):
                return
            joined = join_batches(batches)
            if first is None and not self.drop_last:
                first = slice_rows(joined, slice(0, self.processes))
            rows, completed = dispatch_slice(rows_of(joined), self.processes, self.rank)
            if completed:
                joined = join_batches([joined, first])
            if step >= skip:
                yield slice_rows(joined, rows)
            step += 1
            if len(batches) < self.per_round or completed:
                return
