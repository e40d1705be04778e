"""The Lightning side of a checkpoint: the loop position and Lightning callback states (`lightning_state.pt`).

Weights, optimizer and scheduler live in the HF files of the folder; this small file only adds what Lightning needs
to continue exactly where it stopped. Resuming does not go through `fit(ckpt_path=...)`: Lightning's restart
machinery re-runs `on_train_epoch_start` differently per restart stage and its loaders are not resumable (findings
Q3). Instead the loop counters are set before the fit loop starts (`apply_loop_position`): the epoch counter, the
global step and, mid-epoch, the number of windows already done, so `batch_idx`, `is_last_batch` and
`trainer.global_step` continue as in the uninterrupted run, and the data sampler starts at that window.

An HF checkpoint has no such file: its position follows HF's own rule (`resume_position`, T:1706-1709).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl

__all__ = ["ResumePosition", "apply_loop_position", "capture_lightning_state", "restore_callback_states",
           "resume_position"]

FORMAT = 1


@dataclass(frozen=True)
class ResumePosition:
    """Where a resumed run starts: `windows` updates of epoch `epoch` are already done (0: at the epoch's start)."""

    epoch: int
    windows: int
    global_step: int


def _stateful_callbacks(trainer: pl.Trainer) -> list[Any]:
    # HFTrainerFlow's own state is `trainer_state.json`; every other Lightning callback is stored by its state_key.
    return [cb for cb in trainer.callbacks if type(cb).__name__ != "HFTrainerFlow"]


def capture_lightning_state(trainer: pl.Trainer, epoch_ending: bool = False) -> dict[str, Any]:
    """What `lightning_state.pt` holds, taken in `on_train_batch_end` of the update being saved.

    `epoch_ending`: the epoch ends after this update although batches remain (an HF `should_epoch_stop`), so a
    resumed run starts the next epoch, as the uninterrupted one does.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    callbacks = {}
    for callback in _stateful_callbacks(trainer):
        state = callback.state_dict()
        if state:
            callbacks[callback.state_key] = state
    datamodule = trainer.datamodule
    return {
        "format": FORMAT,
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "windows_done": int(epoch_loop.batch_progress.current.ready),
        "epoch_finished": bool(epoch_loop.batch_progress.is_last_batch) or epoch_ending,
        "world_size": trainer.world_size,
        "callbacks": callbacks,
        "datamodule": datamodule.state_dict() if datamodule is not None else {},
    }


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


def apply_loop_position(trainer: pl.Trainer, position: ResumePosition) -> None:
    """Set Lightning's loop counters (before `fit_loop.run`, e.g. in `on_fit_start`) to continue at `position`.

    - epoch progress = `epoch` finished epochs: `current_epoch` is `epoch` and `on_train_epoch_start` runs for it;
    - optimizer-step progress = `global_step` (that is `trainer.global_step`);
    - mid-epoch, the epoch loop is marked restarting with `windows` batches done: it then keeps that count (so
      `batch_idx` and `is_last_batch` continue) and reuses the loader iterator made in `setup_data` (whose sampler
      starts at that window) instead of making a second one.
    """
    fit_loop = trainer.fit_loop
    for tracker in (fit_loop.epoch_progress.total, fit_loop.epoch_progress.current):
        tracker.ready = tracker.started = tracker.processed = tracker.completed = position.epoch
    epoch_loop = fit_loop.epoch_loop
    steps = epoch_loop.manual_optimization.optim_step_progress.total
    steps.ready = steps.completed = position.global_step
    auto = epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
    auto.ready = auto.completed = position.global_step
    epoch_loop._batches_that_stepped = position.global_step
    if position.windows > 0:
        import warnings

        # Lightning warns that a plain DataLoader cannot resume mid-epoch; ours starts at the window (sampler skip).
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
        for tracker in (epoch_loop.batch_progress.total, epoch_loop.batch_progress.current):
            tracker.ready = tracker.started = tracker.processed = tracker.completed = position.windows
        epoch_loop._restarting = True  # only this loop: the fit loop starts the epoch normally


def restore_callback_states(trainer: pl.Trainer, saved: dict[str, Any]) -> None:
    """`load_state_dict` on each Lightning callback (and the datamodule) whose state was saved."""
    states = saved.get("callbacks", {})
    for callback in _stateful_callbacks(trainer):
        if callback.state_key in states:
            callback.load_state_dict(states[callback.state_key])
    if trainer.datamodule is not None and saved.get("datamodule"):
        trainer.datamodule.load_state_dict(saved["datamodule"])
