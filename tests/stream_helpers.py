"""Streaming train datasets that count what they read (a line per example in a file, so DataLoader workers and other
processes count too), for the O(1) streaming-resume tests."""

from __future__ import annotations

import random
from pathlib import Path

from datasets import IterableDataset
from torch.utils.data import IterableDataset as TorchIterable

MAX_LENGTH = 16


def lm_row(shard: int, index: int) -> dict:
    """A causal-LM row (right-padded, labels -100 on padding), a pure function of its place in the stream."""
    rng = random.Random(shard * 100_003 + index)
    length = rng.randrange(4, MAX_LENGTH + 1)
    ids = [rng.randrange(3, 64) for _ in range(length)]
    pad = MAX_LENGTH - length
    return {"input_ids": ids + [0] * pad, "attention_mask": [1] * length + [0] * pad, "labels": ids + [-100] * pad}


def _generate(shards: list[int], per_shard: int):
    for shard in shards:
        for index in range(per_shard):
            yield lm_row(shard, index)


def _log_row(row: dict, log: str) -> dict:
    with open(log, "a") as f:
        f.write("row\n")
    return row


def counted_stream(log: Path, shards: int = 4, per_shard: int = 40, buffer_size: int | None = 8, seed: int = 3
                   ) -> IterableDataset:
    """A `datasets.IterableDataset` of `shards * per_shard` rows, shuffled with a buffer (unless `buffer_size` is
    None), then mapped by a function that appends a line to `log` for every row it processes (the place where a real
    pipeline tokenises).

    `datasets` itself resumes a generator source inside its current shard by generating and dropping rows (a Python
    generator cannot seek); those rows never reach the map, so `log` counts what the pipeline processes."""
    stream = IterableDataset.from_generator(
        _generate, gen_kwargs={"shards": list(range(shards)), "per_shard": per_shard})
    if buffer_size:
        stream = stream.shuffle(seed=seed, buffer_size=buffer_size)
    return stream.map(_log_row, fn_kwargs={"log": str(log)})


def reads(log: Path) -> int:
    """How many rows were read so far."""
    return len(log.read_text().splitlines()) if log.exists() else 0


class PlainTorchStream(TorchIterable):
    """A torch `IterableDataset` of `n` rows that logs every read and cannot say where it is."""

    def __init__(self, log: Path, n: int = 160) -> None:
        self.log, self.n = str(log), n
        self.next_index = 0
        self._start = 0

    def __iter__(self):
        start, self._start = self._start, 0
        for index in range(start, self.n):
            with open(self.log, "a") as f:
                f.write(f"0,{index}\n")
            self.next_index = index + 1
            yield lm_row(0, index)


class StatefulTorchStream(PlainTorchStream):
    """The same rows, with `state_dict()` (the position of the iteration in progress) and `load_state_dict()` (where
    the next iteration starts)."""

    def state_dict(self) -> dict:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict) -> None:
        self._start = state["next_index"]
