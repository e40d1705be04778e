"""Where a resumed run starts, and setting Lightning's loop counters to start there.

The loop counters are set before the fit loop starts (`apply_loop_position`): the epoch counter, the global step and,
mid-epoch, the number of windows already done, so `batch_idx`, `is_last_batch` and `trainer.global_step` continue as
in the uninterrupted run, and the data sampler starts at that window. A checkpoint with our `lightning_state.pt` gives
the exact position; an HF checkpoint has none, and its position follows HF's own rule (`resume_position`,
T:1706-1709).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl

from hf_lightning._lightning_compat import set_loop_position

__all__ = ["ResumePosition", "apply_loop_position", "nothing_left_to_train", "resume_position"]


@dataclass(frozen=True)
class ResumePosition:
    """Where a resumed run starts: `windows` updates of epoch `epoch` are already done (0: at the epoch's start)."""

    epoch: int
    windows: int
    global_step: int


def resume_position(global_step: int, updates_per_epoch: int | None, saved: dict[str, Any] | None = None
                    ) -> ResumePosition:
    """The epoch and window to start from.

    With our `lightning_state.pt` the recorded position is used (exact even after an early epoch stop); for an HF
    checkpoint HF's rule: `epochs_trained = global_step // updates_per_epoch`, the remainder are windows to skip.
    An unsized dataset (`updates_per_epoch` None) is one long epoch.
    """
    if saved is not None and saved.get("global_step") == global_step:
        if saved["epoch_finished"]:
            return ResumePosition(saved["epoch"] + 1, 0, global_step)
        return ResumePosition(saved["epoch"], saved["windows_done"], global_step)
    if not updates_per_epoch:
        return ResumePosition(0, global_step, global_step)
    epoch, windows = divmod(global_step, updates_per_epoch)
    return ResumePosition(epoch, windows, global_step)


def nothing_left_to_train(position: ResumePosition, max_steps: int, num_epochs: int | None) -> bool:
    """Whether a run resumed at `position` is already at or past its end: `max_steps` updates done, or (for a
    sized dataset, `num_epochs` not None) `num_epochs` epochs done. Lightning's fit loop then never starts, so its
    `on_train_start` / `on_train_end` would not run (the flow runs HF's begin and end itself)."""
    return position.global_step >= max_steps or (num_epochs is not None and position.epoch >= num_epochs)


def apply_loop_position(trainer: pl.Trainer, position: ResumePosition) -> None:
    """Set Lightning's loop counters (before `fit_loop.run`, e.g. in `on_fit_start`) to continue at `position`.

    - epoch progress = `epoch` finished epochs: `current_epoch` is `epoch` and `on_train_epoch_start` runs for it;
    - optimizer-step progress = `global_step` (that is `trainer.global_step`);
    - mid-epoch, the epoch loop is marked restarting with `windows` batches done: it then keeps that count (so
      `batch_idx` and `is_last_batch` continue) and reuses the loader iterator made in `setup_data` (whose sampler
      starts at that window) instead of making a second one.
    """
    set_loop_position(trainer, position.epoch, position.windows, position.global_step)
