"""HF's `torch_empty_cache_steps`: empty the accelerator's memory cache every N updates (T:2093-2099).

HF calls `clear_device_cache()` inside `training_step`, after the forward pass and before the backward pass, whenever
`state.global_step % torch_empty_cache_steps == 0`; `state.global_step` counts the updates done before this one, so
the cache is emptied during the first update and then every N (on every micro-batch of such an update).
`TransformerModule` does the same at the same point.
"""

from __future__ import annotations

import gc

import torch

__all__ = ["should_empty_cache", "empty_device_cache"]


def should_empty_cache(updates_done: int, every: int | None) -> bool:
    """Whether the update after `updates_done` finished updates empties the cache (`every`: the argument)."""
    return every is not None and updates_done % every == 0


def empty_device_cache(collect_garbage: bool = False) -> None:
    """Accelerate's `clear_device_cache`: `empty_cache()` of the accelerator in use (nothing on a CPU-only machine),
    after a `gc.collect()` when asked (the out-of-memory retry of `auto_find_batch_size` does)."""
    if collect_garbage:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.empty_cache()
    elif torch.backends.mps.is_available():
        torch.mps.empty_cache()
        if hasattr(torch.mps, "clear_graph_cache"):  # HF clears MPS graphs too (T:2098-2099)
            torch.mps.clear_graph_cache()
