"""HF's `auto_find_batch_size`: on an out-of-memory error, train again from the start with a smaller batch.

HF wraps its training loop in accelerate's `find_executable_batch_size` (transformers `trainer_utils.py`, accelerate
`utils/memory.py`): when the loop raises an error that `should_reduce_batch_size` recognises (a `RuntimeError` whose
message is one of the out-of-memory ones; `torch.OutOfMemoryError` is such an error), the device cache is cleared and
the loop starts again with `int(batch_size * 0.9)` (accelerate >= 1.x; earlier versions halved it), until a run
finishes or the size reaches 0 (`RuntimeError: No executable batch size found, reached zero.`). The new run starts
from scratch: a fresh `TrainerState`, data loader, optimizer and scheduler; the model keeps its weights. A resumed
run starts from the batch size recorded in the checkpoint's `trainer_state.json` (T:1566-1568).

Pure Python: the caller supplies the run and what to do between attempts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

__all__ = ["OUT_OF_MEMORY_MESSAGES", "should_reduce_batch_size", "reduced_batch_size", "run_with_batch_search"]

log = logging.getLogger(__name__)

T = TypeVar("T")

OUT_OF_MEMORY_MESSAGES = (
    " out of memory.",  # CUDA, HIP, XPU
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)
"""accelerate's `should_reduce_batch_size` statements."""


def should_reduce_batch_size(error: BaseException) -> bool:
    """Accelerate's rule: a `RuntimeError` with one argument that contains an out-of-memory statement."""
    return isinstance(error, RuntimeError) and len(error.args) == 1 and isinstance(error.args[0], str) \
        and any(message in error.args[0] for message in OUT_OF_MEMORY_MESSAGES)


def reduced_batch_size(batch_size: int) -> int:
    """Accelerate's default reduction: 90 % of the size, rounded down."""
    return int(batch_size * 0.9)


def run_with_batch_search(run: Callable[[int], T], starting_batch_size: int, between: Callable[[], None]) -> T:
    """`run(batch_size)` from `starting_batch_size`, smaller after each out-of-memory error (module docstring).

    Args:
        run: one whole training run with that per-device batch size.
        starting_batch_size: the first size tried.
        between: called before the first attempt and after each out-of-memory error (empties the device cache).

    Raises:
        RuntimeError: the size reached 0 (accelerate's message); any error that is not an out-of-memory one.
    """
    batch_size = starting_batch_size
    between()
    while True:
        if batch_size == 0:
            raise RuntimeError("No executable batch size found, reached zero.")
        try:
            return run(batch_size)
        except RuntimeError as error:
            if not should_reduce_batch_size(error):
                raise
            between()
            smaller = reduced_batch_size(batch_size)
            log.warning("auto_find_batch_size: out of memory with per_device_train_batch_size=%d, training again "
                        "from the start with %d.", batch_size, smaller)
            batch_size = smaller
