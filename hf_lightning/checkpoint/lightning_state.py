"""The Lightning side of a checkpoint: the loop position and Lightning callback states (`lightning_state.pt`).

Weights, optimizer and scheduler live in the HF files of the folder; this small file only adds what Lightning needs
to continue exactly where it stopped. Resuming does not go through `fit(ckpt_path=...)`: Lightning's restart
machinery re-runs `on_train_epoch_start` differently per restart stage and a plain DataLoader restarts its epoch
(lightning 2.6 `loops/training_epoch_loop.py`, `_TrainingEpochLoop.reset` and `on_run_start`). Instead the loop
counters are set before the fit loop starts from what this file records (`checkpoint/position.py`).
An HF checkpoint has no such file: its position follows HF's own rule there. The file also records the epoch's
geometry (batch size, accumulation, world size, training samples) and the epoch's sample position (the order and
the samples of it trained): a resumed run whose geometry differs cannot use the recorded window position; it
continues at the sample position (`checkpoint/elastic.py`), or follows HF's rule when there is none
(`geometry_changes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl

from hf_lightning._lightning_compat import callbacks_of, datamodule_of, position_in_epoch
from hf_lightning.args import TrainingArguments
from hf_lightning.args.accelerator_config import total_train_batch
from hf_lightning.contracts import ElasticTrainOrder, FlowDataModule

__all__ = ["capture_lightning_state", "epoch_geometry", "geometry_changes", "restore_callback_states"]

FORMAT = 3  # 2 added "geometry", 3 "sample_position" (checkpoint/elastic.py)


def epoch_geometry(trainer: pl.Trainer, args: TrainingArguments) -> dict[str, Any]:
    """What decides how many updates an epoch has: batch size, accumulation, processes, training samples."""
    datamodule: FlowDataModule | None = datamodule_of(trainer)  # checked by the flow's setup
    dataset = datamodule.train_dataset if datamodule is not None else None
    try:
        samples = len(dataset) if dataset is not None else None
    except TypeError:  # an iterable dataset
        samples = None
    return {
        # the batch one process reads (under `split_batches` the per-device size is that of all processes together)
        "per_device_train_batch_size": total_train_batch(args, trainer.world_size) // (
            args.gradient_accumulation_steps * trainer.world_size),
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "world_size": trainer.world_size,
        "train_samples": samples,
        "dataloader_drop_last": args.dataloader_drop_last,
    }


def geometry_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`"name: checkpoint value -> this run's value"` for each geometry entry that differs (pure)."""
    names = {"train_samples": "training samples (len(train_dataset))", "world_size": "world size (processes)"}
    return [f"{names.get(key, key)}: {saved[key]} in the checkpoint -> {current.get(key)} now"
            for key in saved if key in current and saved[key] != current[key]]


def capture_lightning_state(trainer: pl.Trainer, epoch_ending: bool = False, skip_callbacks: Sequence[pl.Callback] = (),
                            geometry: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `lightning_state.pt` holds, taken in `on_train_batch_end` of the update being saved.

    `epoch_ending`: the epoch ends after this update although batches remain (an HF `should_epoch_stop`), so a
    resumed run starts the next epoch, as the uninterrupted one does. `skip_callbacks`: callbacks whose state is
    stored elsewhere (`HFTrainerFlow`'s is `trainer_state.json`); every other one is stored by its `state_key`.
    `geometry`: `epoch_geometry` of this run.
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
        "geometry": geometry or {"world_size": trainer.world_size},
        "callbacks": callbacks,
        "datamodule": datamodule.state_dict() if datamodule is not None else {},
        # where the epoch's order stands, whatever geometry trained it: a resume in another one continues there
        "sample_position": datamodule.sample_position(windows_done) if isinstance(datamodule, ElasticTrainOrder)
        else None,
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
