"""An exactly resumable shuffle buffer for `datasets.IterableDataset` (`ds.shuffle(seed=..., buffer_size=...)`).

`datasets` 5.x saves the position of a shuffled stream without the buffer's content (its `state_dict` docstring:
"examples from shuffle buffers are lost when resuming"), so a resumed run reads other examples than the uninterrupted
one. This module replaces each buffer node of a dataset's pipeline by `ResumableBufferShuffle`, which draws the same
permutations from the same generator (so the order is the one `datasets` gives) and keeps in its state what a resume
needs: the buffer of the current round (by reference, see `stream_state.Held`), the permutation, how much of it was
yielded, and the generator's state. A resume reads at most one buffer's worth of the stream again (the Arrow path,
where `datasets` re-reads the table a batch was cut from), never the examples trained before it.

`resumable_stream(dataset)` returns a copy of the dataset with the nodes replaced (the caller's object is not touched:
`datasets.IterableDataset.load_state_dict` is sticky on the object). Private `datasets` names used here:
`IterableDataset._prepare_ex_iterable_for_iteration`, `_ex_iterable`, `_state_dict`, `_starting_state_dict`, the
examples-iterable protocol (`_init_state_dict`, `iter_arrow`, `ex_iterable` / `ex_iterables`) and
`BufferShuffledExamplesIterable`; tests/test_stream_resume.py checks the order against `datasets`' own.
"""

from __future__ import annotations

from collections.abc import Iterator
from copy import copy, deepcopy
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import torch.utils.data
from datasets.iterable_dataset import (
    BufferShuffledExamplesIterable,
    _maybe_add_torch_iterable_dataset_parent_class,
    _maybe_share_with_torch_persistent_workers,
)

from hf_lightning.data.stream_state import Held

__all__ = ["ResumableBufferShuffle", "ResumableStream", "buffered_rows", "resumable_stream"]


class ResumableBufferShuffle(BufferShuffledExamplesIterable):
    """`datasets`' buffer shuffle (same draws, same order) whose state holds the buffer, so a resume is exact.

    Both iteration paths are kept: Python examples (`__iter__`) and Arrow tables (`_iter_arrow`, used for
    `to_iterable_dataset()` / file streams and tensor formats). The buffer fills to `buffer_size`, is permuted, the
    first `buffer_size - buffer_size // 2` rows are yielded and the rest stays for the next round.
    """

    def _like(self, node: BufferShuffledExamplesIterable) -> ResumableBufferShuffle:
        return ResumableBufferShuffle(node.ex_iterable, node.buffer_size, node.generator)

    # `datasets` builds a new `BufferShuffledExamplesIterable` in each of these: keep ours instead
    def shift_rngs(self, value: int) -> ResumableBufferShuffle:
        return self._like(super().shift_rngs(value))

    def shuffle_data_sources(self, generator: Any) -> ResumableBufferShuffle:
        return self._like(super().shuffle_data_sources(generator))

    def shard_data_sources(self, num_shards: int, index: int, contiguous: bool = True) -> ResumableBufferShuffle:
        return self._like(super().shard_data_sources(num_shards, index, contiguous=contiguous))

    def reshard_data_sources(self) -> ResumableBufferShuffle:
        return self._like(super().reshard_data_sources())

    def _init_state_dict(self) -> dict:
        self._state_dict = {
            "examples_iterable": self.ex_iterable._init_state_dict(),
            "buffer": None,
            "type": type(self).__name__,
        }
        return self._state_dict

    def load_state_dict(self, state_dict: dict) -> dict:
        if self._state_dict is None:
            self._init_state_dict()
        self.ex_iterable.load_state_dict(state_dict["examples_iterable"])
        self._state_dict["buffer"] = state_dict["buffer"]
        return self._state_dict

    def _held(self) -> Any:
        held = self._state_dict["buffer"] if self._state_dict else None
        return held.value if held is not None else None

    def _record(self, kind: str, value: tuple) -> None:
        if self._state_dict is not None:
            self._state_dict["buffer"] = Held(kind, value)

    def __iter__(self) -> Iterator[Any]:
        rng = deepcopy(self.generator)
        keep = self.buffer_size // 2
        buffer: list[Any] = []
        held = self._held()
        if held is not None:  # resumed inside a round: finish it, then go on reading the source
            rows, order, done, rng_state, last = held
            rng.bit_generator.state = rng_state
            yield from self._round(rows, order, done, rng_state, last)
            if last:
                return
            buffer = [rows[i] for i in order[len(rows) - keep:]]
        for example in self.ex_iterable:
            buffer.append(example)
            if len(buffer) >= self.buffer_size:
                order = rng.permutation(len(buffer))
                yield from self._round(buffer, order, 0, rng.bit_generator.state, False)
                buffer = [buffer[i] for i in order[len(buffer) - keep:]]
        if buffer:
            order = rng.permutation(len(buffer))
            yield from self._round(buffer, order, 0, rng.bit_generator.state, True)

    def _round(self, rows: list, order: Any, done: int, rng_state: dict, last: bool) -> Iterator[Any]:
        """Yield `rows` in `order` from position `done`; the last round yields every row, the others all but half."""
        stop = len(rows) if last else len(rows) - self.buffer_size // 2
        for position in range(done, stop):
            self._record("rows", (rows, order, position + 1, rng_state, last))
            yield rows[order[position]]

    def _iter_arrow(self) -> Iterator[Any]:
        rng = deepcopy(self.generator)
        keep = self.buffer_size // 2
        tables: list[Any] = []
        length, last_key = 0, None
        held = self._held()
        if held is not None:  # the state after a yielded round: its kept rows and the generator after its draw
            kept, rng_state, last_key, finished = held
            if finished:
                return
            rng.bit_generator.state = rng_state
            tables, length = [kept], len(kept)
        for key, table in self.ex_iterable.iter_arrow():
            last_key = key
            tables.append(table)
            length += len(table)
            if length >= self.buffer_size:
                shuffled = pc.take(pa.concat_tables(tables), rng.permutation(length))
                kept = shuffled.slice(length - keep)
                self._record("arrow", (kept, rng.bit_generator.state, key, False))
                yield key, shuffled.slice(0, length - keep)
                tables, length = [kept], keep
        if length > 0:
            shuffled = pc.take(pa.concat_tables(tables), rng.permutation(length))
            self._record("arrow", (None, rng.bit_generator.state, last_key, True))
            yield last_key, shuffled


def _replace_buffers(node: Any) -> Any:
    """A copy of the pipeline with every `BufferShuffledExamplesIterable` replaced by a `ResumableBufferShuffle`.

    Every node is copied: `datasets` nodes keep their iteration state on themselves (`_state_dict`), and the caller's
    dataset must not see ours.
    """
    if isinstance(node, BufferShuffledExamplesIterable) and not isinstance(node, ResumableBufferShuffle):
        return ResumableBufferShuffle(_replace_buffers(node.ex_iterable), node.buffer_size, node.generator)
    node = copy(node)
    if getattr(node, "ex_iterable", None) is not None:
        node.ex_iterable = _replace_buffers(node.ex_iterable)
    if getattr(node, "ex_iterables", None) is not None:
        node.ex_iterables = [_replace_buffers(c) for c in node.ex_iterables]
    return node


class ResumableStream(datasets.IterableDataset):
    """A `datasets.IterableDataset` whose shuffle buffers resume exactly (see the module docstring)."""

    _starting_state_dict: dict[str, Any] | None  # set by `datasets.IterableDataset.load_state_dict`

    def _prepare_ex_iterable_for_iteration(self, batch_size: int = 1, drop_last_batch: bool = False) -> Any:
        starting: dict[str, Any] | None = self._starting_state_dict
        self._starting_state_dict = None  # loaded below, once the buffers are ours
        try:
            ex_iterable = super()._prepare_ex_iterable_for_iteration(batch_size, drop_last_batch)
        finally:
            self._starting_state_dict = starting
        ex_iterable = _replace_buffers(ex_iterable)
        self._state_dict = {"examples_iterable": ex_iterable._init_state_dict(), "epoch": self.epoch}
        # In a DataLoader worker `datasets` loads the state again after taking the worker's shards (`_iter_pytorch`);
        # loading a worker's state into the whole pipeline here fails (`datasets` does it and raises IndexError)
        in_worker = torch.utils.data.get_worker_info() is not None
        if starting and self.epoch == starting["epoch"] and not in_worker:
            ex_iterable.load_state_dict(starting["examples_iterable"])
            self._state_dict["examples_iterable"] = ex_iterable._state_dict
        return ex_iterable


def resumable_stream(dataset: datasets.IterableDataset) -> ResumableStream:
    """A copy of `dataset` that iterates identically and whose `state_dict()` resumes exactly, shuffle buffers
    included; the caller's object is not modified."""
    # not `copy(dataset)`: `datasets.IterableDataset.__getstate__` returns its own `__dict__`, which a copy would share
    stream = ResumableStream.__new__(ResumableStream)
    stream.__dict__ = dict(dataset.__dict__)
    _maybe_add_torch_iterable_dataset_parent_class(ResumableStream)
    stream._ex_iterable = _replace_buffers(dataset._ex_iterable)
    stream._starting_state_dict = None
    # its own epoch counter (shared memory under torch, so persistent workers see `set_epoch`): not the caller's
    stream._epoch = _maybe_share_with_torch_persistent_workers(int(dataset.epoch))
    stream._prepare_ex_iterable_for_iteration()  # a fresh state, as `IterableDataset.__init__` makes one
    return stream


def buffered_rows(dataset: datasets.IterableDataset) -> int:
    """How many rows the shuffle buffers of `dataset`'s pipeline hold together (0 without a buffer)."""

    def walk(node: Any) -> int:
        own = node.buffer_size if isinstance(node, BufferShuffledExamplesIterable) else 0
        children = list(getattr(node, "ex_iterables", None) or [])
        if getattr(node, "ex_iterable", None) is not None:
            children.append(node.ex_iterable)
        return own + sum(walk(child) for child in children)

    return walk(dataset._ex_iterable)
