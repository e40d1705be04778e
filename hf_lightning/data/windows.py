"""Grouping a loader's micro-batches into accumulation windows (one Lightning batch = one optimizer update).

The HF Trainer takes each update's micro-batches from its train loader with `get_batch_samples` right before the
update's first forward (T:1876-1881), and accelerate's `DataLoaderShard` fetches one micro-batch ahead of the one it
hands out. A random collator (`DataCollatorForLanguageModeling`) draws its masks while collating, from the same
global RNG that dropout draws from during the forward, so *when* a micro-batch is collated decides the masks and
the dropout of every later step.

`WindowStream` reproduces that order under Lightning, whose loop fetches one batch (here: one window) ahead: it hands
Lightning `LazyWindow`s that collate nothing, and `LazyWindow.materialize` (called by the data module's
`on_before_batch_transfer`, right before the update) fetches the window's micro-batches from one `MicroBatchStream`
per epoch, one micro-batch ahead as accelerate does. The loader itself is iterated (its seed draw included) at the
epoch's first update, as HF's. It needs a sized loader (the number of windows is known without fetching).

An unsized loader (an `IterableDataset`) is grouped by `stream_loader.WindowedStream`, which also records the
stream's position for an O(1) resume: its windows are fetched by Lightning's loop itself, one window ahead of the
update (README "Differences": a random collator's draws over an iterable dataset in the main process come earlier
than HF's; `dataloader_num_workers > 0` draws them in the workers, as HF).

`start_after` starts a loader after its first batches without loading them (resume), as accelerate's
`skip_first_batches`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler
from transformers.trainer_pt_utils import IterableDatasetShard

from hf_lightning.args import TrainingArguments

__all__ = [
    "EpochLoader", "LazyWindow", "MicroBatchStream", "SkipBatchSampler", "WindowStream", "is_sized",
    "loader_options", "num_examples", "set_loader_epoch", "start_after", "window_sizes",
]

_END = object()


def loader_options(args: TrainingArguments) -> dict[str, Any]:
    """The `DataLoader` options of HF's `_get_dataloader` (T:1007-1069) from the training arguments: workers, pinned
    memory (only with CUDA in use), persistent workers and prefetching (only with workers)."""
    options: dict[str, Any] = {
        "num_workers": args.dataloader_num_workers,
        "pin_memory": args.dataloader_pin_memory and not args.use_cpu and torch.cuda.is_available(),
    }
    if args.dataloader_num_workers > 0:
        options["persistent_workers"] = args.dataloader_persistent_workers
        if args.dataloader_prefetch_factor is not None:
            options["prefetch_factor"] = args.dataloader_prefetch_factor
    return options


def is_sized(loader: Any) -> bool:
    """Whether `len(loader)` works (a `DataLoader` over an `IterableDataset` has `__len__` but raises)."""
    try:
        len(loader)
    except (TypeError, NotImplementedError):
        return False
    return True


def num_examples(loader: Any, batch_size: int) -> int:
    """HF's `Trainer.num_examples` (T:993-1005): `len(loader.dataset)` (an `IterableDatasetShard`'s inner dataset),
    else `len(loader) * batch_size`."""
    try:
        dataset = loader.dataset
        if isinstance(dataset, IterableDatasetShard):
            return len(dataset.dataset)  # type: ignore[arg-type]  # an unsized one raises TypeError, caught below
        return len(dataset)
    except (NameError, AttributeError, TypeError):
        return len(loader) * batch_size


def window_sizes(microbatches: int, accumulation: int) -> list[int]:
    """Micro-batches per update of an epoch: `accumulation` each, the last one shorter (T:1870-1880)."""
    full, rest = divmod(microbatches, accumulation)
    return [accumulation] * full + ([rest] if rest else [])


def _set_epoch(obj: Any, epoch: int) -> bool:
    """`obj.set_epoch(epoch)` if `obj` has one; whether it had."""
    set_epoch = getattr(obj, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
        return True
    return False


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """What HF's `_run_epoch` does to its train loader every epoch (T:1847-1855): `loader.set_epoch(epoch)` if it has
    one, and the `set_epoch` of the batch sampler wrapped by accelerate's `BatchSamplerShard`."""
    _set_epoch(loader, epoch)
    _set_epoch(getattr(getattr(loader, "batch_sampler", None), "batch_sampler", None), epoch)


class EpochLoader(DataLoader):
    """A `DataLoader` with `set_epoch`, as accelerate's `DataLoaderShard` that HF's `get_train_dataloader` returns:
    the epoch reaches the batch sampler, the sampler (`set_epoch`) or else the dataset (a shuffled
    `datasets.IterableDataset` reshuffles with `seed + epoch`)."""

    def set_epoch(self, epoch: int) -> None:
        batch_sampler = self.batch_sampler
        _set_epoch(batch_sampler, epoch)
        sampler = getattr(batch_sampler, "sampler", None)
        if sampler is batch_sampler or not _set_epoch(sampler, epoch):
            _set_epoch(self.dataset, epoch)


class MicroBatchStream:
    """One epoch of a loader's micro-batches, fetched one ahead as accelerate's `DataLoaderShard.__iter__` does.

    The loader is iterated at the first `next` (not before), so its seed draw and first collations happen there.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._iterator: Iterator[Any] | None = None
        self._ahead: Any = _END

    def _pull(self) -> Any:
        assert self._iterator is not None
        return next(self._iterator, _END)

    def next(self) -> Any:
        """The next micro-batch (the one after it is fetched first).

        Raises:
            StopIteration: the epoch has no more micro-batches.
        """
        if self._iterator is None:
            self._iterator = iter(self.loader)
            self._ahead = self._pull()
        current = self._ahead
        if current is _END:
            raise StopIteration
        self._ahead = self._pull()
        return current


class LazyWindow:
    """One update's micro-batches, fetched from the epoch's stream only when `materialize` is called.

    Args:
        stream: the epoch's micro-batch stream (shared by the epoch's windows, materialised in order).
        size: the number of micro-batches of this update.
    """

    def __init__(self, stream: MicroBatchStream, size: int) -> None:
        self.stream = stream
        self.size = size

    def materialize(self) -> list[Any]:
        """Fetch this update's micro-batches (fewer if the loader ends early, as HF's `get_batch_samples`)."""
        window = []
        for _ in range(self.size):
            try:
                window.append(self.stream.next())
            except StopIteration:
                break
        return window


class _EpochSetter:
    """Lightning's `_set_sampler_epoch` calls `set_epoch` on `<loader>.sampler` and `<loader>.batch_sampler`: this is
    what a window iterable exposes there, forwarding the epoch to `owner`."""

    def __init__(self, owner: _Windows) -> None:
        self.owner = owner

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)


class _Windows:
    """What both window iterables share: the loader, the accumulation, the resume skip, and the epoch forwarding.

    Args:
        loader: the micro-batch loader (`get_train_dataloader`'s).
        accumulation: `gradient_accumulation_steps`.

    Attributes:
        skip: windows of the next epoch iterated here that were already trained on (resume); used once.
    """

    def __init__(self, loader: Any, accumulation: int) -> None:
        self.loader = loader
        self.accumulation = accumulation
        self.skip = 0

    @property
    def sampler(self) -> _EpochSetter:
        return _EpochSetter(self)

    def set_epoch(self, epoch: int) -> None:
        set_loader_epoch(self.loader, epoch)


class WindowStream(_Windows):
    """`LazyWindow`s over a sized micro-batch loader: `len(loader)` micro-batches per epoch, in windows of
    `accumulation` (the last one shorter).

    Args:
        loader: the micro-batch loader (`get_train_dataloader`'s).
        accumulation: `gradient_accumulation_steps`.

    Attributes:
        skip: windows of the next epoch iterated here that were already trained on (resume): the loader starts after
            their micro-batches (`start_after`), for that one iteration.
    """

    def __init__(self, loader: Any, accumulation: int) -> None:
        if not is_sized(loader):
            raise TypeError("WindowStream needs a loader with a length; use stream_loader.WindowedStream for an "
                            "unsized one.")
        super().__init__(loader, accumulation)

        self.start_sample = 0
        """Elastic resume: every iteration of the resumed epoch (a second one too, e.g. after the RNG states are
        loaded) is the rest of its order after this many samples (the batch sampler's `start_sample`), in windows of
        this run's geometry; cleared when another epoch is set."""
        self._epoch: int | None = None
        self.epoch_start: tuple[int, int] = (0, 0)
        """`(samples, windows)` the current iteration started after: the samples of the epoch's order trained before
        it, and the windows Lightning counts as done then (`samples_done`)."""

    def __len__(self) -> int:
        return len(window_sizes(len(self.loader), self.accumulation))

    def rest_windows(self, start_sample: int) -> int | None:
        """Windows of the rest of the epoch after `start_sample` samples of its order, or None when the loader's
        batch sampler cannot start at a sample (not hf_lightning's own order)."""
        sampler: Any = getattr(self.loader, "batch_sampler", None)
        if not hasattr(sampler, "start_sample"):
            return None
        return len(window_sizes(sampler.num_microbatches(start_sample), self.accumulation))

    def samples_done(self, windows_done: int) -> int | None:
        """Samples of the current epoch's order trained after `windows_done` windows (Lightning's count), over all
        processes, or None when the order is not hf_lightning's own (then no sample position is recorded)."""
        sampler: Any = getattr(self.loader, "batch_sampler", None)
        if not hasattr(sampler, "start_sample"):
            return None
        start, offset = self.epoch_start
        per_window = sampler.batch_size * sampler.world_size * self.accumulation
        return min(start + max(windows_done - offset, 0) * per_window, sampler.num_samples)

    def set_epoch(self, epoch: int) -> None:
        if self.start_sample and self._epoch is not None and epoch != self._epoch:
            self.start_sample = 0  # the resumed epoch is over: the next ones are whole
        self._epoch = epoch
        super().set_epoch(epoch)

    def __iter__(self) -> Iterator[LazyWindow]:
        skip, self.skip = self.skip, 0
        start_sample = self.start_sample
        if start_sample:
            sampler = self.loader.batch_sampler
            sizes = window_sizes(sampler.num_microbatches(start_sample), self.accumulation)
            sampler.start_sample = start_sample
            self.epoch_start = (start_sample, len(self) - len(sizes))
            stream = MicroBatchStream(self.loader)
            for size in sizes:
                yield LazyWindow(stream, size)
            return
        sizes = window_sizes(len(self.loader), self.accumulation)
        sampler = getattr(self.loader, "batch_sampler", None)
        per_window = getattr(sampler, "batch_size", 0) * getattr(sampler, "world_size", 1) * self.accumulation
        self.epoch_start = (skip * per_window, skip)
        source = start_after(self.loader, skip * self.accumulation) if skip else self.loader
        stream = MicroBatchStream(source)
        for size in sizes[skip:]:
            yield LazyWindow(stream, size)


class SkipBatchSampler(Sampler[list[int]]):
    """A batch sampler without its first `skip` batches (accelerate's `SkipBatchSampler`): indices only, no data."""

    def __init__(self, batch_sampler: Any, skip: int) -> None:
        self.batch_sampler = batch_sampler
        self.skip = skip

    def __iter__(self) -> Iterator[list[int]]:
        for index, batch in enumerate(self.batch_sampler):
            if index >= self.skip:
                yield batch

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip, 0)


def start_after(loader: Any, count: int) -> Any:
    """`loader` for one iteration without its first `count` batches of the current epoch, none of them loaded.

    hf_lightning's own batch samplers start there in O(1) (`skip_windows`), a loader with its own `start_after(count)`
    is asked (`dispatch.DispatchLoader`); any other map-style `DataLoader` is
    copied over a `SkipBatchSampler` (its skipped batches' indices are drawn, their samples never loaded, as
    accelerate's `skip_first_batches`).

    Raises:
        TypeError: the loader is not a map-style `torch.utils.data.DataLoader` (it cannot skip without reading).
    """
    own = getattr(loader, "start_after", None)
    if callable(own):  # a loader that skips its own way (`dispatch.DispatchLoader`)
        return own(count)
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is not None and hasattr(batch_sampler, "skip_windows"):
        batch_sampler.skip_windows = count
        return loader
    if not isinstance(loader, DataLoader) or batch_sampler is None:
        raise TypeError(f"Cannot skip batches of a {type(loader).__name__} without reading them.")
    return DataLoader(
        loader.dataset, batch_sampler=SkipBatchSampler(batch_sampler, count), collate_fn=loader.collate_fn,
        num_workers=loader.num_workers, pin_memory=loader.pin_memory, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator, prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
        persistent_workers=loader.persistent_workers,
    )
