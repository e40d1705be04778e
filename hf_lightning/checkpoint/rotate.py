"""`save_total_limit` rotation with HF 5's exact rule, as pure functions over checkpoint folders.

Mirrors `transformers.trainer_utils.sort_checkpoints` / `rotate_checkpoints` (TU:282-386): folders are ordered by
modification time unless all mtimes lie within one second (then by step number); the newest folder and the best one
are protected; `num_to_keep = max(limit, len(protected))`; the oldest unprotected folders go first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["CheckpointInfo", "order_checkpoints", "select_for_deletion", "final_cleanup"]


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint folder: its path, the step parsed from its name (None if none), and its mtime."""

    path: str
    step: int | None
    mtime: float


def order_checkpoints(checkpoints: list[CheckpointInfo], use_mtime: bool = True) -> list[CheckpointInfo]:
    """Oldest first: by mtime, or by step when mtimes span under 1 s (names without a step are then dropped).

    Ties are broken by path, as HF sorts `(key, path)` tuples.
    """
    if use_mtime:
        by_time = sorted(checkpoints, key=lambda c: (c.mtime, c.path))
        if len(by_time) <= 1 or by_time[-1].mtime - by_time[0].mtime >= 1.0:
            return by_time
    numbered = [c for c in checkpoints if c.step is not None]
    return sorted(numbered, key=lambda c: (c.step, c.path))


def select_for_deletion(
    checkpoints: list[CheckpointInfo], limit: int | None, best: str | None, use_mtime: bool = True
) -> list[str]:
    """The folders HF's `rotate_checkpoints` deletes after a save, oldest first."""
    if limit is None or limit <= 0:
        return []
    ordered = order_checkpoints(checkpoints, use_mtime)
    if len(ordered) <= limit:  # HF counts after ordering (the numeric fallback drops names without a step)
        return []
    protected = {ordered[-1].path}
    if best is not None:
        protected.add(str(Path(best)))
    num_to_keep = max(limit, len(protected))
    remaining = len(ordered)
    doomed: list[str] = []
    for ckpt in ordered:
        if remaining <= num_to_keep:
            break
        if ckpt.path in protected:
            continue
        doomed.append(ckpt.path)
        remaining -= 1
    return doomed


def final_cleanup(checkpoints: list[CheckpointInfo], best: str | None, limit: int | None) -> list[str]:
    """End of training with `save_total_limit == 1`: every checkpoint but the best is deleted (T:2027-2036)."""
    if limit != 1 or best is None:
        return []
    best_path = str(Path(best))
    return [c.path for c in order_checkpoints(checkpoints, use_mtime=False) if c.path != best_path]

