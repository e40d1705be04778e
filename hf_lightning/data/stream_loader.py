"""The train loader of an unsized dataset: accumulation windows, and its position for an O(1) resume.

An `IterableDataset` has no random access, so HF resumes it by reading and dropping the trained batches (T:1706-1709,
`skip_first_batches`): hours for a long streaming run. When the stream can say where it is, we save that instead:

- a `datasets.IterableDataset` (its `state_dict()` / `load_state_dict()`, shuffle buffers made exact by
  `stream_shuffle.resumable_stream`), or a torch `IterableDataset` with `state_dict()` / `load_state_dict()` (what
  they mean is the dataset's business: `state_dict()` describes the iteration in progress, `load_state_dict(state)`
  makes the next `iter()` start there);
- read through `torchdata`'s `StatefulDataLoader`, which knows, with `num_workers > 0` too, which worker's state
  belongs to the batches the training loop has received (workers read ahead) and whose turn is next.

`WindowedStream` groups the loader's micro-batches into windows of `gradient_accumulation_steps` and records the
loader's position after each window. Lightning fetches one window ahead of the one it trains (to know the epoch's
last batch), so the position of the window a checkpoint is taken after is looked up by its index, not read from the
loader then. Any other iterable is skipped by reading on resume, as HF does.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from hf_lightning.data.sampling import split_by_node
from hf_lightning.data.stream_state import from_plain
from hf_lightning.data.windows import EpochLoader, set_loader_epoch

__all__ = ["WindowedStream", "is_resumable_stream", "is_stateful_loader", "iterable_loader", "resumable_train_stream",
           "stateful_loader", "stream_windows"]

_KEPT_POSITIONS = 3  # the window being trained, the one prefetched by Lightning, and one spare


def is_resumable_stream(dataset: Any) -> bool:
    """Whether the position of `dataset`'s iteration can be saved and restored (see the module docstring)."""
    from datasets import IterableDataset as HFIterable

    if isinstance(dataset, HFIterable):
        return True
    return isinstance(dataset, IterableDataset) and callable(getattr(dataset, "state_dict", None)) \
        and callable(getattr(dataset, "load_state_dict", None))


def is_stateful_loader(loader: Any) -> bool:
    """Whether `loader` reports and restores its position (`state_dict()` / `load_state_dict()`, as
    `StatefulDataLoader`): the built-in train loader of a resumable stream, or a `get_train_dataloader` override's."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def resumable_train_stream(dataset: Any) -> Any:
    """The dataset to read for training: a `datasets.IterableDataset` as a copy with exactly resumable shuffle buffers,
    anything else unchanged."""
    from datasets import IterableDataset as HFIterable

    if isinstance(dataset, HFIterable):
        from hf_lightning.data.stream_shuffle import resumable_stream

        return resumable_stream(dataset)
    return dataset


def stateful_loader(dataset: Any, **loader_kwargs: Any) -> DataLoader:
    """A `torchdata` `StatefulDataLoader` over `dataset` (same arguments as `DataLoader`).

    With workers, each one sends its dataset's state with its batches; a shuffle buffer's state holds its rows, so
    they are sent every `buffer / (2 * batch_size)` batches only (about once per refill), and a resume re-reads the
    few batches since (`StatefulDataLoader` does that itself): O(buffer), never O(position).
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    if loader_kwargs.get("num_workers", 0) > 0:
        from datasets import IterableDataset as HFIterable

        from hf_lightning.data.stream_shuffle import buffered_rows

        rows = buffered_rows(dataset) if isinstance(dataset, HFIterable) else 0
        loader_kwargs["snapshot_every_n_steps"] = max(1, rows // (2 * loader_kwargs.get("batch_size", 1)))
    with warnings.catch_warnings():
        # torchdata 0.11 calls torch's deprecated `set_vital` in every loader's constructor (harmless, torch >= 2.9)
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        return StatefulDataLoader(dataset, **loader_kwargs)


def iterable_loader(dataset: IterableDataset, is_training: bool, world: int, rank: int, **loader_kwargs: Any
                    ) -> DataLoader:
    """The loader of an `IterableDataset`. Training: each process reads its share (`split_by_node`), a stream that
    reports its position through a `StatefulDataLoader` (O(1) resume), any other through an `EpochLoader` (skipped by
    reading on resume, as HF does); evaluation: a plain `DataLoader`."""
    if not is_training:
        return DataLoader(dataset, **loader_kwargs)
    if world > 1:
        dataset = split_by_node(dataset, world, rank)
    if is_resumable_stream(dataset):
        return stateful_loader(resumable_train_stream(dataset), **loader_kwargs)
    return EpochLoader(dataset, **loader_kwargs)


def stream_windows(loader: Any, accumulation: int, resume_position: tuple[int, int] | None,
                   saved_position: Any) -> WindowedStream:
    """The windows of an unsized train loader; resumed at `resume_position` (`(epoch, windows done)`), it continues
    from `saved_position` (the checkpoint's, plain) when the loader can restore one (`is_stateful_loader`), else it
    reads and drops the trained windows (as HF)."""
    windows = WindowedStream(loader, accumulation, resumable=is_stateful_loader(loader))
    if resume_position is not None:
        epoch, done = resume_position
        windows.set_epoch(epoch)
        if done and saved_position is not None and windows.resumable:
            windows.start_at(done, from_plain(saved_position))  # O(1): where the stream was
        else:
            windows.skip = done
    return windows


class WindowedStream:
    """Windows of `accumulation` micro-batches from an unsized loader (the last one of a pass may be short).

    Args:
        loader: the micro-batch loader (a `StatefulDataLoader` when `resumable`).
        accumulation: micro-batches per window (`gradient_accumulation_steps`).
        resumable: whether `loader` reports its position (`state_dict()`); else a resume skips by reading.

    Attributes:
        skip: windows to read and drop at the start of the next pass (a resume without a saved position, as HF).
    """

    def __init__(self, loader: Any, accumulation: int, resumable: bool = False) -> None:
        self.loader = loader
        self.accumulation = accumulation
        self.resumable = resumable
        self.skip = 0
        self._windows_done = 0
        self._positions: dict[int, Any] = {}
        self._start: tuple[int, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch as HF's `_run_epoch` does (`windows.set_loader_epoch`); a loader without `set_epoch` (a
        `StatefulDataLoader`) passes it to its dataset (a shuffled `datasets.IterableDataset` reshuffles with
        `seed + epoch`), as accelerate's `DataLoaderShard.set_epoch` does for the HF Trainer at every epoch."""
        set_loader_epoch(self.loader, epoch)
        if not callable(getattr(self.loader, "set_epoch", None)) and hasattr(self.loader.dataset, "set_epoch"):
            self.loader.dataset.set_epoch(epoch)

    @property
    def sampler(self) -> WindowedStream:
        """Lightning's `_set_sampler_epoch` calls `set_epoch` on `<loader>.sampler` only: expose ourselves there.
        Without it every pass over a shuffled iterable dataset repeated the first pass's order."""
        return self

    def start_at(self, windows_done: int, position: Any) -> None:
        """Make the next pass continue after window `windows_done`, from `position` (a `position_after` value)."""
        self._start = (windows_done, position)

    def position_after(self, windows_done: int) -> Any:
        """The loader's position right after window `windows_done` of the current pass, or None if not recorded."""
        return self._positions.get(windows_done)

    def __iter__(self) -> Iterator[list[Any]]:
        self._positions = {}
        self._windows_done = 0
        if self._start is not None:
            self._windows_done, position = self._start
            self._start = None
            self.loader.load_state_dict(position)
        skip, self.skip = self.skip * self.accumulation, 0
        window: list[Any] = []
        for batch in self.loader:
            if skip:
                skip -= 1
                continue
            window.append(batch)
            if len(window) == self.accumulation:
                self._record()
                yield window
                window = []
        if window:
            self._record()
            yield window

    def _record(self) -> None:
        """Keep the loader's position after the window just completed (the last few only)."""
        self._windows_done += 1
        if not self.resumable:
            return
        self._positions[self._windows_done] = self.loader.state_dict()
        self._positions.pop(self._windows_done - _KEPT_POSITIONS, None)
