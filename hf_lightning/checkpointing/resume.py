"""Finding the checkpoint to resume from (`resume_from_checkpoint=True` or a path), with HF's rules and errors."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["last_checkpoint", "resolve_checkpoint"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(folder: str | Path) -> str | None:
    """HF `get_last_checkpoint` (TU:270-279): the `checkpoint-<n>` folder with the largest n, or None."""
    root = Path(folder)
    if not root.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return str(max(steps)[1]) if steps else None


def resolve_checkpoint(output_dir: str, resume_from_checkpoint: str | bool) -> str:
    """The checkpoint folder to resume from.

    Raises:
        ValueError: `True` with no checkpoint in `output_dir`.
        FileNotFoundError: a path that does not exist.
    """
    if resume_from_checkpoint is True:
        found = last_checkpoint(output_dir)
        if found is None:
            raise ValueError(f"No valid checkpoint found in output directory ({output_dir})")
        resume_from_checkpoint = found
    path = Path(str(resume_from_checkpoint))
    if not path.is_dir():
        raise FileNotFoundError(f"resume_from_checkpoint={str(path)!r}: no such checkpoint folder.")
    raise NotImplementedError(
        f"resume_from_checkpoint={str(path)!r}: resuming from an HF-layout checkpoint is not implemented yet."
    )
