"""Cost of the bad-row pass (`hf_lightning/data/row_checks.py`) that runs before training, on a tokenised dataset.

Builds a `datasets.Dataset` of `--rows` rows with `input_ids` of 16 to `--max-length` tokens, `attention_mask` and an
integer `label` (a classification set as a tokenizer's `map` leaves it, Arrow-backed on disk cache or in memory), then
times `check_dataset` against a BERT classifier's limits (vocabulary, position table, classes): the pass a
`TransformerDataModule` makes in `setup`. Also times the same pass on a shuffled view (an indices mapping: the rows
are gathered first) and, for scale, one read of the same column through `dataset["input_ids"]` (Python lists), which
is roughly what one epoch of collation reads anyway.

Usage: python bench/bench_row_checks.py [--rows 100000] [--max-length 128] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from datasets import Dataset
from transformers import BertConfig, BertForSequenceClassification

from hf_lightning.data.row_checks import RowLimits, check_dataset


def _dataset(rows: int, max_length: int, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, max_length + 1, size=rows)
    ids = [rng.integers(5, 30000, size=n).tolist() for n in lengths]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * n for n in lengths],
                              "label": rng.integers(0, 2, size=rows).tolist()})


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = _dataset(options.rows, options.max_length)
    model = BertForSequenceClassification(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32))
    limits = RowLimits.of(model)
    tokens = sum(len(r) for r in data["input_ids"])
    shuffled = data.shuffle(seed=1)
    plain = _median_seconds(lambda: check_dataset(data, "train", limits), options.repeats)
    mapped = _median_seconds(lambda: check_dataset(shuffled, "train", limits), options.repeats)
    read = _median_seconds(lambda: data[:]["input_ids"], max(1, options.repeats // 2))
    print(f"{options.rows:,} rows, {tokens:,} tokens (16..{options.max_length} per row), limits {limits}")
    print(f"check_dataset: {plain:.3f} s ({plain / options.rows * 1e6:.2f} us/row)")
    print(f"check_dataset on a shuffled view (indices mapping): {mapped:.3f} s")
    print(f"for scale, dataset['input_ids'] as Python lists: {read:.3f} s")


if __name__ == "__main__":
    main()
