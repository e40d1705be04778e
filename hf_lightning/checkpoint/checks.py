"""Setup-time checks on checkpoint settings that HF lets through silently."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["output_dir_problem", "unreachable_best_checkpoint"]


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


def unreachable_best_checkpoint(args: Any, eval_steps: float, save_steps: float, max_steps: int) -> str | None:
    """The error when `load_best_model_at_end` can never load the best evaluation's checkpoint, else None.

    HF checks `save_steps % eval_steps` on the *given* values (TA:1748-1774), so ratios such as 0.1 / 0.2 pass; they
    are then rounded up against `max_steps` separately (`ceil(ratio * max_steps)`) and may stop being multiples
    (0.1 / 0.2 of 105 updates: 11 / 21). Evaluations then mostly fall on steps without a checkpoint, so
    `best_model_checkpoint` lags or stays None and the best model is silently not loaded (the rounding is
    `TrainerState.compute_steps`, CB:156-167).
    """
    if not (args.load_best_model_at_end and args.eval_strategy == "steps" and args.save_strategy == "steps"):
        return None
    if eval_steps <= 0 or save_steps <= 0 or int(save_steps) % int(eval_steps) == 0:
        return None
    return (
        f"load_best_model_at_end=True: eval_steps={args.eval_steps} and save_steps={args.save_steps} resolve to "
        f"{int(eval_steps)} and {int(save_steps)} updates for max_steps={max_steps}; {int(save_steps)} is not a "
        f"multiple of {int(eval_steps)}, so evaluations would happen at steps without a checkpoint and the best model "
        "could not be loaded. Use absolute steps, or ratios that resolve to multiples for this max_steps."
    )
