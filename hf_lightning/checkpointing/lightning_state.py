"""The Lightning side of a checkpoint: the loop position and Lightning callback states (`lightning_state.pt`).

Weights, optimizer and scheduler live in the HF files of the folder; this small file only adds what Lightning needs
to continue exactly where it stopped. Resuming does not go through `fit(ckpt_path=...)`: Lightning's restart
machinery re-runs `on_train_epoch_start` differently per restart stage and a plain DataLoader restarts its epoch
(lightning 2.6 `loops/training_epoch_loop.py`, `_TrainingEpochLoop.reset` and `on_run_start`). Instead the loop
counters are set before the fit loop starts from what this file records (`resume/position.py`).
An HF checkpoint has no such file: its position follows HF's own rule there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl

from hf_lightning._lightning_compat import callbacks_of, datamodule_of, position_in_epoch

__all__ = ["capture_lightning_state", "restore_callback_states"]

FORMAT = 1


def capture_lightning_state(trainer: pl.Trainer, epoch_ending: bool = False, skip_callbacks: Sequence[Any] = ()
                            ) -> dict[str, Any]:
    """What `lightning_state.pt` holds, taken in `on_train_batch_end` of the update being saved.

    `epoch_ending`: the epoch ends after this update although batches remain (an HF `should_epoch_stop`), so a
    resumed run starts the next epoch, as the uninterrupted one does. `skip_callbacks`: callbacks whose state is
    stored elsewhere (`HFTrainerFlow`'s is `trainer_state.json`); every other one is stored by its `state_key`.
    """
    windows_done, is_last_batch = position_in_epoch(trainer)
    callbacks = {}
    for callback in callbacks_of(trainer):
        if any(callback is skipped for skipped in skip_callbacks):
            continue
        state = callback.state_dict()
        if state:
            callbacks[callback.state_key] = state
    datamodule = datamodule_of(trainer)
    return {
        "format": FORMAT,
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "windows_done": windows_done,
        "epoch_finished": is_last_batch or epoch_ending,
        "world_size": trainer.world_size,
        "callbacks": callbacks,
        "datamodule": datamodule.state_dict() if datamodule is not None else {},
    }


def restore_callback_states(trainer: pl.Trainer, saved: dict[str, Any]) -> None:
    """`load_state_dict` on each Lightning callback (and the datamodule) whose state was saved."""
    states = saved.get("callbacks", {})
    for callback in callbacks_of(trainer):
        key = callback.state_key
        if key not in states:  # e.g. saved with other settings in the key: the one state of the same class
            same_class = [k for k in states if k.partition("{")[0] == type(callback).__qualname__]
            key = same_class[0] if len(same_class) == 1 else key
        if key in states:
            callback.load_state_dict(states[key])
    datamodule = datamodule_of(trainer)
    if datamodule is not None and saved.get("datamodule"):
        datamodule.load_state_dict(saved["datamodule"])
