"""Setup-time checks on the output directory that HF lets through silently (the best-model checks: `plan.py`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["output_dir_problem"]


def output_dir_problem(output_dir: str) -> str | None:
    """Why nothing could be written to `output_dir` (a file on the path, a read-only or full folder), else None.

    The folder need not exist yet: the nearest existing ancestor must be a folder in which a file can be created
    (a real write, removed at once, because permission bits say nothing for root or a read-only mount). HF finds
    out at the first save, after training for `save_steps` updates.
    """
    path = Path(output_dir)
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is below {str(existing)!r}, which is a file"
        return f"output_dir={output_dir!r} {where}, not a folder; choose a folder for checkpoints and logs."
    try:
        fd, probe = tempfile.mkstemp(prefix=".hf_lightning-write-test-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return (f"output_dir={output_dir!r} is not writable ({err.strerror} in {str(existing)!r}); checkpoints and "
                "logs could not be saved. Choose a writable folder.")
    return None
