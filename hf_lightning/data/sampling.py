"""Training order: HF's seeded per-epoch shuffle, sharded like accelerate, grouped into accumulation windows.

One Lightning training batch is one *window*: the micro-batches of one optimizer update. The order of samples is a
pure function of `(seed, epoch, dataset size, batch size, world size, rank)`, so a resumed run can start at any
window of any epoch by slicing, without iterating the skipped data (O(1) in the number of skipped batches).

- The permutation is `torch.randperm(n, generator=manual_seed(seed + epoch))`: what accelerate's
  `SeedableRandomSampler` draws for the HF Trainer (seed = `data_seed` or `seed`). With sample lengths
  (`group_by_length`), HF's length grouping of a permutation drawn from torch's global generator when the epoch's
  iteration starts, as HF's `LengthGroupedSampler` draws it (`length_grouping.py`); the generator state it was drawn
  from is kept (`grouping_draw`) for checkpoints, and a resumed run restores it (`restore_grouping_draw`).
- Sharding across processes reproduces accelerate's `BatchSamplerShard` with `even_batches=True`: batch `i` goes to
  rank `i % world_size`, and the tail is completed with samples from the start so every rank has as many batches.
- Windows hold `gradient_accumulation_steps` micro-batches; the last window of an epoch may be shorter (T:1870-1880).

- `EpochSampler` is that order as a plain sampler (what `Trainer._get_train_sampler` returns); the data module turns it
  into a `WindowBatchSampler` of micro-batches (`accumulation=1`), whose resume is O(1). Any other sampler (a
  `_get_train_sampler` override) is batched and sharded the same way by `OrderBatchSampler`.

Evaluation and prediction order: `ContiguousShardSampler` gives each rank one contiguous, unpadded block (of the
dataset, or of another sampler's order); only a rank left without any row (fewer samples than ranks) reads one
padding row, whose outputs the accumulator drops.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Sampler

from hf_lightning.data.length_grouping import draw_global_state, draw_grouping_state, length_grouped_order

__all__ = [
    "BatchShard", "ContiguousShardSampler", "EpochSampler", "GroupingDraw", "OrderBatchSampler", "WindowBatchSampler",
    "batch_shard_problem", "dataset_length", "draw_sampler_state", "epoch_order", "random_sampler_order",
    "shard_batches", "shard_rest", "split_batch_size",
    "split_by_node", "uneven_batches_problem",
]


def dataset_length(dataset: Any) -> int | None:
    """`len(dataset)`, or None for a dataset without a length (an `IterableDataset`, or None); HF's `has_length`."""
    try:
        return len(dataset)
    except (TypeError, AttributeError, NotImplementedError):
        return None


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """Sample indices of one epoch: the `SeedableRandomSampler` permutation, or `range(n)` when not shuffling."""
    if not shuffle:
        return list(range(num_samples))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator).tolist()


def draw_sampler_state() -> torch.Tensor:
    """The global generator state from which torch's `RandomSampler` without a generator of its own draws an epoch's
    order now (its seed, `torch.empty((), dtype=torch.int64).random_()`), moved past that draw as under HF; rank
    0's under several processes (`draw_global_state`). HF's order with `use_seedable_sampler=False`."""
    return draw_global_state(lambda: torch.empty((), dtype=torch.int64).random_())


def random_sampler_order(num_samples: int, rng_state: torch.Tensor) -> list[int]:
    """The order torch's `RandomSampler` (no generator of its own) yields when the global generator is in
    `rng_state` (pure): its seed drawn from that state, then `randperm` of a generator seeded with it."""
    generator = torch.Generator()
    generator.set_state(rng_state)
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
    return torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed)).tolist()


@dataclass(frozen=True)
class GroupingDraw:
    """One epoch's `group_by_length` draw: the global generator state its permutation was drawn from, and what it
    was drawn for (a saved draw is only reused for the same samples and group size)."""

    epoch: int
    rng_state: torch.Tensor
    num_samples: int
    group_size: int

    def fits(self, epoch: int, num_samples: int, group_size: int) -> bool:
        """Whether this draw is that epoch's, for that many samples in groups of that size."""
        return (self.epoch, self.num_samples, self.group_size) == (epoch, num_samples, group_size)

    def to_dict(self) -> dict[str, Any]:
        """Plain values and one tensor (a checkpoint loads it with `weights_only=True`)."""
        return {"epoch": self.epoch, "rng_state": self.rng_state, "num_samples": self.num_samples,
                "group_size": self.group_size}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> GroupingDraw:
        """The draw `to_dict` wrote (read back from a checkpoint's `lightning_state.pt`)."""
        return cls(int(saved["epoch"]), saved["rng_state"], int(saved["num_samples"]), int(saved["group_size"]))


def shard_batches(
    order: list[int], batch_size: int, world_size: int, rank: int, drop_last: bool, even_batches: bool = True
) -> list[list[int]]:
    """The micro-batches of one rank, as accelerate's `BatchSamplerShard(split_batches=False, even_batches=...)`.

    Batch `i` of the epoch goes to rank `i % world_size`; a round is only handed out when its last batch is full, and
    without `drop_last` the tail is completed with samples from the start of the epoch so every rank gets as many
    batches (accelerate `data_loader.py`, `_iter_with_no_split`); with `even_batches=False` the tail is not completed:
    the ranks of the last round's batches get them as they are, the others none.

    accelerate's `split_batches=True` with a batch of `B` over `w` processes is this with `batch_size = B // w`: chunk
    `r` of batch `i` is micro-batch `i * w + r`, and the tail rules give the same chunks (`split_batch_size`).
    """
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    if world_size == 1:
        return batches
    mine: list[list[int]] = []
    initial: list[int] = []
    to_yield: list[int] = []
    idx, batch = -1, list[int]()
    for idx, batch in enumerate(batches):
        if not drop_last and idx < world_size:
            initial += batch
        if idx % world_size == rank:
            to_yield = batch
        if idx % world_size == world_size - 1 and len(batch) == batch_size:
            mine.append(to_yield)
            to_yield = []
    if drop_last or not initial:
        return mine
    if not even_batches:
        return mine + ([to_yield] if to_yield else [])
    if len(to_yield) == batch_size:
        mine.append(to_yield)
    while len(initial) < world_size * batch_size:
        initial += initial
    batch = list(batch)
    if len(batch) == batch_size:
        batch, idx = [], idx + 1
    cursor = 0
    while idx % world_size != 0 or batch:
        end = cursor + batch_size - len(batch)
        batch += initial[cursor:end]
        if idx % world_size == rank:
            mine.append(batch)
        cursor, batch, idx = end, [], idx + 1
    return mine


def shard_rest(rows: list[int], batch_size: int, world_size: int, rank: int, drop_last: bool) -> list[list[int]]:
    """The micro-batches of one rank for the rest of an epoch resumed at a sample position (an elastic resume).

    Full rounds of `batch_size x world_size` rows are handed out as accelerate does (batch `i` to rank
    `i % world_size`); the tail round is split evenly (contiguous blocks, sizes differing by at most one) instead of
    being completed with repeated rows, so every remaining row is trained exactly once. Only a tail with fewer rows
    than processes is completed as accelerate does (`shard_batches`: some rows repeat). `drop_last` drops the tail.
    """
    round_size = batch_size * world_size
    full = len(rows) // round_size
    mine = [rows[(r * world_size + rank) * batch_size:(r * world_size + rank + 1) * batch_size] for r in range(full)]
    tail = rows[full * round_size:]
    if not tail or drop_last:
        return mine
    if len(tail) < world_size:
        return mine + shard_batches(tail, batch_size, world_size, rank, False)
    base, extra = divmod(len(tail), world_size)
    start = rank * base + min(rank, extra)
    return [*mine, tail[start:start + base + (1 if rank < extra else 0)]]


def split_batch_size(batch_size: int, world_size: int, what: str) -> int:
    """The per-process batch of accelerate's `split_batches=True`: `batch_size` split over the processes.

    Raises:
        ValueError: `batch_size` is not a multiple of `world_size` (accelerate's words, with the argument named).
    """
    if world_size < 2:
        return batch_size
    if batch_size % world_size:
        raise ValueError(
            f"To use a `DataLoader` in `split_batches` mode, the batch size ({batch_size}) needs to be a round "
            f"multiple of the number of processes ({world_size}). (`{what}` with "
            "`accelerator_config={'split_batches': True}`: the batch of all processes together.)"
        )
    return batch_size // world_size


def uneven_batches_problem(num_batches: int, world_size: int, drop_last: bool) -> str | None:
    """Why a training epoch of `num_batches` batches cannot run with `even_batches=False` over `world_size`
    processes, or None: some processes would get one batch fewer (accelerate's `BatchSamplerShard`), so they would
    run fewer updates than the others and the gradient all-reduce would wait for them forever."""
    if world_size < 2 or drop_last or num_batches % world_size == 0:
        return None
    return (f"accelerator_config={{'even_batches': False}}: the epoch's {num_batches} training batches do not split "
            f"evenly over {world_size} processes, so some processes would run one batch fewer and the gradient "
            "all-reduce of the others would never complete. Use even_batches=True (the tail completed with samples "
            f"from the start, as accelerate), dataloader_drop_last=True, or a dataset whose batches are a multiple of "
            f"{world_size}.")


def batch_shard_problem(num_batches: int, last_batch_full: bool, world_size: int, even_batches: bool) -> str | None:
    """Why a loader of `num_batches` batches cannot be sharded over `world_size` processes exactly as accelerate's
    `BatchSamplerShard` does without what hf_lightning does not do, or None.

    Batch `i` goes to rank `i % world_size` (accelerate, `split_batches=False`). accelerate completes an uneven last
    round with repeated samples from the start (`even_batches=True`), which its `gather_for_metrics` drops, or leaves
    some ranks a batch short (`even_batches=False`), so the ranks run different numbers of steps; hf_lightning does
    neither, so both are refused with what to change.
    """
    if num_batches % world_size == 0 and (last_batch_full or not even_batches):
        return None
    if num_batches % world_size:
        why = (f"its {num_batches} batches do not split evenly over {world_size} processes (accelerate would "
               + ("repeat batches from the start" if even_batches else "give some processes one batch fewer") + ")")
    else:
        why = "its last batch is short and even_batches=True (accelerate would complete it with repeated samples)"
    return (f"accelerator.prepare(DataLoader): {why}; hf_lightning shards a prepared loader only when every process "
            f"gets the same number of batches and no sample is repeated. Use a dataset size that is a multiple of "
            f"{world_size} x the batch size, or dataloader_drop_last=True.")


class BatchShard(Sampler[list[int]]):
    """This process's batches of `batch_sampler`: batch `i` goes to rank `i % world_size`, accelerate's
    `BatchSamplerShard` where it repeats no sample and gives every rank as many batches (`batch_shard_problem`).

    `batch_sampler` keeps accelerate's attribute name, so the epoch reaches it as it does through accelerate's
    wrapper (`windows.set_loader_epoch`); `set_epoch` forwards it too.
    """

    def __init__(self, batch_sampler: Iterable[list[int]], world_size: int, rank: int) -> None:
        self.batch_sampler = batch_sampler
        self.world_size, self.rank = world_size, rank

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.batch_sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        for index, batch in enumerate(self.batch_sampler):
            if index % self.world_size == self.rank:
                yield list(batch)

    def __len__(self) -> int:
        return len(self.batch_sampler) // self.world_size  # type: ignore[arg-type]


class WindowBatchSampler(Sampler[list[int]]):
    """Yields, per optimizer update, the flat sample indices of its micro-batches; resumable mid-epoch in O(1).

    Lightning calls `set_epoch` at every epoch start. `skip_windows` makes the next iteration start at that window
    of the current epoch (used on resume), and resets after one epoch.

    Args:
        num_samples: dataset length.
        batch_size: micro-batch size per process.
        accumulation: micro-batches per window (`gradient_accumulation_steps`).
        seed: the shuffle seed (`data_seed` or `seed`; `group_by_length` draws from the global generator instead).
        shuffle: random (HF "random") or sequential order.
        drop_last: drop the last incomplete micro-batch of each epoch.
        world_size: number of processes.
        rank: this process.
        lengths: the samples' lengths for `group_by_length` order (None: `shuffle` decides).
        group_size: the samples per length group (default `batch_size * accumulation`, HF's
            `train_batch_size * gradient_accumulation_steps`, T:1100-1105).
        even_batches: accelerate's `even_batches` (False: an epoch's tail is not completed, `shard_batches`).
        seedable: accelerate's `use_seedable_sampler` (False with `shuffle`: each epoch's order is torch's
            `RandomSampler`'s, drawn from the global generator when the epoch's iteration starts, as HF's).
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        accumulation: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
        world_size: int = 1,
        rank: int = 0,
        lengths: Sequence[int] | None = None,
        group_size: int | None = None,
        even_batches: bool = True,
        seedable: bool = True,
    ) -> None:
        self.num_samples = num_samples
        self.even_batches = even_batches
        self.seedable = seedable
        self.lengths = lengths
        self.group_size = group_size if group_size is not None else batch_size * accumulation
        self.batch_size = batch_size
        self.accumulation = accumulation
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.world_size = world_size
        self.rank = rank
        self.epoch = 0
        self.skip_windows = 0
        self.start_sample = 0
        """Elastic resume: the next iteration is the rest of the epoch's order after this many samples (`shard_rest`),
        whatever geometry trained them; used once (0: the whole epoch)."""
        self.grouping_draw: GroupingDraw | None = None
        """`group_by_length`: the epoch whose order was drawn last, and the global generator state it was drawn
        from (what a checkpoint keeps)."""
        self._restored_draw: GroupingDraw | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next iteration draws (Lightning calls this every epoch)."""
        self.epoch = epoch

    def restore_grouping_draw(self, draw: GroupingDraw) -> None:
        """`group_by_length` on resume: the next iteration, if it is of `draw.epoch`, uses that epoch's saved draw
        instead of drawing (the run resumed inside that epoch continues its order); used once."""
        self._restored_draw = draw

    @property
    def draws_globally(self) -> bool:
        """Whether each epoch's order is drawn from the global generator when its iteration starts (`group_by_length`,
        or a random order with `use_seedable_sampler=False`): not the pure `seed + epoch` order."""
        return self.lengths is not None or (self.shuffle and not self.seedable)

    @property
    def sampler(self) -> WindowBatchSampler:
        """Lightning's `_set_sampler_epoch` only calls `set_epoch` on `loader.sampler` and
        `loader.batch_sampler.sampler` (never on the batch sampler itself): exposing ourselves as `.sampler` is what
        makes every epoch reshuffle. Without it every epoch repeated epoch 0's order (found by the HF parity test)."""
        return self

    def microbatches(self, epoch: int | None = None) -> list[list[int]]:
        """This rank's micro-batches of `epoch` (default: the current one).

        `group_by_length`: the order of the epoch's draw (`grouping_draw`), drawn now from the global generator if
        that epoch has none yet (at the epoch's first iteration, as HF's sampler draws)."""
        epoch = self.epoch if epoch is None else epoch
        if not self.draws_globally:
            order = epoch_order(self.num_samples, self.seed, epoch, self.shuffle)
        else:
            if self.grouping_draw is None or self.grouping_draw.epoch != epoch:
                state = draw_grouping_state(self.num_samples) if self.lengths is not None else draw_sampler_state()
                self.grouping_draw = GroupingDraw(epoch, state, self.num_samples, self.group_size)
            state = self.grouping_draw.rng_state
            order = length_grouped_order(self.lengths, self.group_size, state) if self.lengths is not None \
                else random_sampler_order(self.num_samples, state)
        if self.start_sample:
            return shard_rest(order[self.start_sample:], self.batch_size, self.world_size, self.rank, self.drop_last)
        return shard_batches(order, self.batch_size, self.world_size, self.rank, self.drop_last, self.even_batches)

    def num_microbatches(self, start_sample: int = 0) -> int:
        """Micro-batches per epoch for this rank (the same on every rank), without drawing a permutation; with
        `start_sample`, of the rest of the epoch after that many samples (`shard_rest`)."""
        if start_sample:
            rest = list(range(self.num_samples - start_sample))
            return len(shard_rest(rest, self.batch_size, self.world_size, 0, self.drop_last))
        return len(shard_batches(list(range(self.num_samples)), self.batch_size, self.world_size, 0, self.drop_last,
                                 self.even_batches))

    def __len__(self) -> int:
        micro = self.num_microbatches()
        return -(-micro // self.accumulation)

    def __iter__(self) -> Iterator[list[int]]:
        if self.draws_globally:  # a fresh draw every iteration (HF's sampler draws at each `iter`) ...
            restored, self._restored_draw = self._restored_draw, None
            self.grouping_draw = restored if restored is not None and restored.fits(
                self.epoch, self.num_samples, self.group_size) else None  # ... but the resumed epoch's saved one
        micro = self.microbatches()
        start, self.skip_windows, self.start_sample = self.skip_windows, 0, 0
        for w in range(start * self.accumulation, len(micro), self.accumulation):
            yield [i for batch in micro[w : w + self.accumulation] for i in batch]


class EpochSampler(Sampler[int]):
    """HF's default training order as a sampler: the `seed + epoch` permutation, `range(n)` when not shuffling, or
    the `group_by_length` order (HF's `LengthGroupedSampler`, drawn from the global generator at each `iter`) when
    `lengths` are given.

    Args:
        num_samples: dataset length.
        seed: the shuffle seed (`data_seed` or `seed`).
        shuffle: random (HF "random") or sequential order.
        lengths: the samples' lengths for `group_by_length` order (None: `shuffle` decides).
        group_size: the samples per length group (HF: `train_batch_size * gradient_accumulation_steps`).
        seedable: accelerate's `use_seedable_sampler` (False with `shuffle`: torch's `RandomSampler` order, drawn
            from the global generator at each `iter`).
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool = True, lengths: Sequence[int] | None = None,
                 group_size: int = 1, seedable: bool = True) -> None:
        self.num_samples = num_samples
        self.seedable = seedable
        self.seed = seed
        self.shuffle = shuffle
        self.lengths = lengths
        self.group_size = group_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        if self.lengths is not None:
            return iter(length_grouped_order(self.lengths, self.group_size, draw_grouping_state(self.num_samples)))
        if self.shuffle and not self.seedable:  # torch's `RandomSampler`, as HF's with `use_seedable_sampler=False`
            return iter(random_sampler_order(self.num_samples, draw_sampler_state()))
        return iter(epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle))


class OrderBatchSampler(Sampler[list[int]]):
    """Micro-batches of any sampler's order, sharded across processes as accelerate's `BatchSamplerShard`.

    The sampler is iterated once per epoch (its order may be random); `set_epoch` is forwarded to it, as accelerate's
    `DataLoaderShard.set_epoch` does. `skip_windows` starts the next iteration after that many micro-batches (their
    indices are drawn, no sample is loaded).

    Args:
        sampler: the order (a `_get_train_sampler` override's sampler).
        batch_size: micro-batch size per process.
        drop_last: drop the last incomplete micro-batch.
        world_size: number of processes.
        rank: this process.
        even_batches: accelerate's `even_batches` (False: an epoch's tail is not completed, `shard_batches`).
    """

    def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool = False, world_size: int = 1,
                 rank: int = 0, even_batches: bool = True) -> None:
        self.sampler = sampler
        self.even_batches = even_batches
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.world_size = world_size
        self.rank = rank
        self.skip_windows = 0

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __len__(self) -> int:
        size = len(self.sampler)  # type: ignore[arg-type]  # a batch sampler of an unsized sampler has no length
        return len(shard_batches(list(range(size)), self.batch_size, self.world_size, 0, self.drop_last,
                                 self.even_batches))

    def __iter__(self) -> Iterator[list[int]]:
        order = [int(i) for i in self.sampler]
        start, self.skip_windows = self.skip_windows, 0
        yield from shard_batches(order, self.batch_size, self.world_size, self.rank, self.drop_last,
                                 self.even_batches)[start:]


class ContiguousShardSampler(Sampler[int]):
    """Rank `r` of `w` reads one contiguous block of the dataset; nothing repeats, nothing is dropped.

    Blocks are cut at multiples of `batch_size` (their sizes in batches differ by at most one), so every eval batch
    of a rank is exactly a batch of the single-process run with the same `per_device_eval_batch_size`: same rows,
    same padding, hence bit-identical logits and batch losses, and an `eval_loss` that does not depend on the number
    of processes. With fewer batches than processes, blocks are cut per sample instead, so that every process
    still gets rows (Lightning refuses a process with an empty loader); the predictions are the same, but the
    batches, hence HF's sample-weighted `eval_loss`, are those of a smaller batch size. With fewer samples than
    processes, a process whose block is empty reads one *padding* row (the first of the order) instead, so that it
    still runs the loop and joins the gather: `padding_only` tells the accumulator to drop its outputs (accelerate
    pads such a shard with repeated rows too, and drops them when gathering).

    Args:
        num_samples: the dataset's length.
        world_size: number of processes.
        rank: this process.
        batch_size: the evaluation batch size (blocks are cut at its multiples).
        order: another sampler whose order is split (a `_get_eval_sampler` override's), iterated at each pass.
    """

    def __init__(self, num_samples: int, world_size: int, rank: int, batch_size: int = 1,
                 order: Iterable[int] | None = None) -> None:
        self.order = order
        self.num_samples, self.world_size, self.batch_size = num_samples, world_size, batch_size
        self.start, self.stop = self._block(rank)
        self.padding_only = num_samples > 0 and self.start == self.stop
        """Whether this rank's shard is one padding row whose outputs are dropped (fewer samples than ranks)."""

    def _block(self, rank: int) -> tuple[int, int]:
        """`(start, stop)` of rank `rank`'s block of the order."""
        num_samples, batch_size = self.num_samples, self.batch_size
        unit = batch_size if -(-num_samples // batch_size) >= self.world_size else 1
        base, extra = divmod(-(-num_samples // unit), self.world_size)
        first = rank * base + min(rank, extra)
        return min(first * unit, num_samples), min((first + base + (1 if rank < extra else 0)) * unit, num_samples)

    def shard_sizes(self) -> list[int]:
        """The number of rows every rank reads, padding rows included (each rank can compute it alone, without a
        collective: see `eval_run.busiest_rank_batches`)."""
        return [max(stop - start, 1 if self.num_samples else 0)
                for start, stop in map(self._block, range(self.world_size))]

    def __len__(self) -> int:
        return self.stop - self.start + (1 if self.padding_only else 0)

    def __iter__(self) -> Iterator[int]:
        indices = range(self.num_samples) if self.order is None else [int(i) for i in self.order]
        if self.padding_only:
            return iter([indices[0]])
        return iter(indices[self.start:self.stop])


def split_by_node(dataset: Any, world: int, rank: int) -> Any:
    """A `datasets.IterableDataset` split across processes by node (a torch one cannot be).

    Raises:
        ValueError: `dataset` is a torch `IterableDataset`, not a `datasets` one.
    """
    # `datasets` (with pandas and pyarrow) only for this case: importing the data modules stays light
    from datasets import IterableDataset as HFIterable
    from datasets.distributed import split_dataset_by_node

    if not isinstance(dataset, HFIterable):
        raise ValueError(
            "A torch IterableDataset cannot be sharded across processes by hf_lightning; use a "
            "`datasets.IterableDataset` or a map-style dataset for `train_dataset` under DDP."
        )
    return split_dataset_by_node(dataset, rank=rank, world_size=world)
