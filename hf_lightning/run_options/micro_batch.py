"""`auto_micro_batch`: the pure parts of micro-batching that keeps the global batch.

A loader micro-batch (`per_device_train_batch_size` rows) is cut into `split` pieces along its first dimension
(`split_micro_batch`); an update runs `split x` its window's micro-batches, each piece a micro-batch of its own, so
the accumulation in effect is `gradient_accumulation_steps x split` and the global batch is unchanged. After an
out-of-memory error (`is_out_of_memory`) the split doubles (`next_split`); the size in effect is
`ceil(per_device / split)` (`piece_size`). What a checkpoint keeps is `MicroBatchSplit.state_dict`; a resume with
another per-device batch starts at the split whose pieces are no larger than the size found (`split_for_size`).

The caller (`module/micro_batching.py`) runs the retry and restores the RNG (`RngSnapshot`) so that the retried
update draws dropout from where its first try started.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hf_lightning.run_options.batch_search import should_reduce_batch_size

__all__ = ["MicroBatchSplit", "RngSnapshot", "is_out_of_memory", "next_split", "piece_size", "rows_of",
           "split_for_size", "split_micro_batch"]


def is_out_of_memory(error: BaseException) -> bool:
    """A `torch.OutOfMemoryError` (any accelerator), or an error accelerate's rule reads as one (the CPU allocator's
    and MPS's messages, `batch_search.should_reduce_batch_size`)."""
    return isinstance(error, torch.OutOfMemoryError) or should_reduce_batch_size(error)


def rows_of(batch: Mapping[str, Any]) -> int | None:
    """The rows of a collated batch: the first dimension of its first tensor with one (None: no tensor)."""
    for value in batch.values():
        if torch.is_tensor(value) and value.dim() > 0:
            return int(value.shape[0])
    return None


def split_micro_batch(batch: Mapping[str, Any], pieces: int) -> list[dict[str, Any]]:
    """`batch` cut into at most `pieces` consecutive row ranges of sizes as equal as `torch.tensor_split` makes them
    (the first ones one row larger); empty ranges are left out, so a short last micro-batch gives fewer pieces.

    Tensors and lists as long as the batch are cut; every other value (a scalar, a tensor without the batch's first
    dimension) is shared by every piece. One piece is the batch itself, uncopied.
    """
    if not isinstance(batch, Mapping):
        # TRL's GRPO / RLOO hand their rows over uncollated: nothing here knows how to cut them
        raise ValueError(f"auto_micro_batch=True cuts collated dict micro-batches, but this trainer's micro-batch is a "
                         f"{type(batch).__name__}; drop auto_micro_batch for this trainer.")
    rows = rows_of(batch)
    if pieces <= 1 or rows is None or rows <= 1:
        return [dict(batch)]
    bounds = [len(r) for r in torch.arange(rows).tensor_split(min(pieces, rows))]
    starts = [sum(bounds[:i]) for i in range(len(bounds))]
    out: list[dict[str, Any]] = []
    for start, size in zip(starts, bounds):
        piece: dict[str, Any] = {}
        for key, value in batch.items():
            if (torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == rows) or (
                    isinstance(value, Sequence) and not isinstance(value, str) and len(value) == rows):
                piece[key] = value[start:start + size]
            else:
                piece[key] = value
        out.append(piece)
    return out


def piece_size(per_device: int, split: int) -> int:
    """The largest micro-batch in effect: `ceil(per_device / split)` rows."""
    return max(math.ceil(per_device / split), 1)


def next_split(per_device: int, split: int) -> int | None:
    """The split after an out-of-memory error (twice as many pieces), or None when pieces are already one row."""
    if piece_size(per_device, split) <= 1:
        return None
    return split * 2


def split_for_size(per_device: int, size_found: int) -> int:
    """The smallest power-of-two split whose pieces of a `per_device` micro-batch are at most `size_found` rows (a
    resume with another per-device batch than the checkpoint's)."""
    split = 1
    while piece_size(per_device, split) > max(size_found, 1):
        split *= 2
    return split


@dataclass
class MicroBatchSplit:
    """The splits in effect: how many pieces each training / evaluation micro-batch is cut into.

    Attributes:
        train: pieces per training micro-batch (1: as the loader made it).
        eval: pieces per evaluation / prediction batch.
        per_device_train: the per-device training batch the train split applies to (for the checkpoint).
        per_device_eval: the per-device evaluation batch the eval split applies to.
    """

    train: int = 1
    eval: int = 1
    per_device_train: int = 1
    per_device_eval: int = 1

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps: the sizes found (rows per micro-batch) and the batches they came from."""
        return {"train_micro_batch_size": piece_size(self.per_device_train, self.train),
                "per_device_train_batch_size": self.per_device_train,
                "eval_micro_batch_size": piece_size(self.per_device_eval, self.eval),
                "per_device_eval_batch_size": self.per_device_eval}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the sizes a checkpoint found (`split_for_size`, for this run's per-device batches)."""
        if "train_micro_batch_size" in state:
            self.train = split_for_size(self.per_device_train, int(state["train_micro_batch_size"]))
        if "eval_micro_batch_size" in state:
            self.eval = split_for_size(self.per_device_eval, int(state["eval_micro_batch_size"]))


class RngSnapshot:
    """The global torch RNG (CPU, and the current CUDA device's when CUDA is initialised), taken at the start of an
    update so that a retry draws dropout from the same state as the first try.

    Not restored: Python's `random` and NumPy's (the update's forwards do not draw from them in transformers' models;
    a custom model that does draws differently in a retry), and other CUDA devices than the current one.
    """

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda)
