"""Resuming on another number of processes, per-device batch or accumulation (an *elastic* resume).

A checkpoint's `lightning_state.pt` records, besides Lightning's window count, where the epoch's order stands:
`sample_position` = the order (`num_samples`, `seed`, `shuffle`: hf_lightning's own `seed + epoch` permutation) and
`samples_done`, the samples of it trained by all processes. A run resumed in another geometry continues that order
after `samples_done`, in its own windows (`data/sampling.py` `shard_rest`), so every row is trained exactly once per
epoch whatever changed; the later epochs follow the new geometry. Lightning's window count is placed so that the
resumed epoch ends where this run's epochs end (`ElasticResume.windows_done`), and an epoch-based run's `max_steps`
counts the updates this run really does (`elastic_max_steps`), so its learning-rate schedule ends with it.

`transformers.Trainer` places a resumed run by counting updates (`global_step // updates_per_epoch` epochs, the
rest as batches of the new loader to skip), which skips or repeats rows when the geometry changed (transformers#40245);
checkpoints without a sample position (HF's, or written before it was recorded) keep that rule, with a warning
naming the rows (`hf_rule_rows`).

`resume_keep_global_batch`: the gradient accumulation that keeps the checkpoint's global batch
(`keep_global_batch_accumulation`), so the resumed run's updates are the uninterrupted run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_pt_utils import safe_globals

from hf_lightning.data.sampling import shard_batches
from hf_lightning.data.windows import window_sizes

__all__ = ["ELASTIC_KEYS", "ElasticResume", "elastic_line", "elastic_max_steps", "elastic_resume", "global_batch",
           "hf_rule_rows", "keep_global_batch_accumulation", "read_lightning_state", "updates_per_epoch"]

ELASTIC_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size")
"""The geometry an elastic resume may change (the dataset's length and `dataloader_drop_last` may not)."""


def read_lightning_state(folder: str | Path) -> dict[str, Any] | None:
    """A checkpoint's `lightning_state.pt` (loaded `weights_only`), or None when it has none or it cannot be read
    (the restorer reads it again and names a damaged file)."""
    path = Path(folder) / "lightning_state.pt"
    if not path.is_file():
        return None
    try:
        with safe_globals():
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - the restorer names the damaged file
        return None


def global_batch(geometry: dict[str, Any]) -> int:
    """Samples per update over all processes: per-device batch x accumulation x world size."""
    return int(geometry["per_device_train_batch_size"]) * int(geometry["gradient_accumulation_steps"]) * int(
        geometry["world_size"])


def updates_per_epoch(geometry: dict[str, Any]) -> int:
    """Updates of one epoch of `geometry` (hf_lightning's order, accelerate's sharding)."""
    micro = len(shard_batches(list(range(int(geometry["train_samples"]))), int(geometry["per_device_train_batch_size"]),
                              int(geometry["world_size"]), 0, bool(geometry.get("dataloader_drop_last"))))
    return len(window_sizes(micro, int(geometry["gradient_accumulation_steps"])))


@dataclass(frozen=True)
class ElasticResume:
    """Where a resumed run continues an epoch by its sample position.

    Attributes:
        epoch: the resumed epoch.
        start_sample: samples of its order already trained (0 with `windows_done` 0: the epoch's start).
        rest_windows: this run's windows left in it.
        windows_done: Lightning's window count to start from (`updates_per_epoch - rest_windows`), so the epoch
            ends where this run's epochs end.
    """

    epoch: int
    start_sample: int
    rest_windows: int
    windows_done: int


def elastic_resume(saved: dict[str, Any], current: dict[str, Any], order: dict[str, Any] | None,
                   new_updates_per_epoch: int, rest_windows: int | None) -> ElasticResume | None:
    """The elastic position of a resume (pure), or None when the checkpoint's own window position applies (same
    geometry) or its sample position cannot be used (then HF's rule places the run).

    Args:
        saved: the checkpoint's `lightning_state.pt`.
        current: this run's `epoch_geometry`.
        order: this run's train order (`num_samples`, `seed`, `shuffle`), None when it is not hf_lightning's own.
        new_updates_per_epoch: this run's updates per epoch.
        rest_windows: this run's windows left after the saved sample position (`TransformerDataModule.rest_windows`).
    """
    position, before = saved.get("sample_position"), saved.get("geometry") or {}
    if position is None or order is None or rest_windows is None:
        return None
    if any(position[k] != order.get(k) for k in ("num_samples", "seed", "shuffle")):
        return None  # another order: the sample position means other rows
    if any(before.get(k) != current.get(k) for k in ("train_samples", "dataloader_drop_last")):
        return None
    changed = any(before.get(k) != current.get(k) for k in ELASTIC_KEYS)
    if saved["epoch_finished"]:
        return ElasticResume(saved["epoch"] + 1, 0, new_updates_per_epoch, 0) if changed else None
    done = int(position["samples_done"])
    if not changed and all(k in before for k in ELASTIC_KEYS) and done == saved["windows_done"] * global_batch(before):
        return None  # the same geometry from a plain window position: the exact resume of the same run
    return ElasticResume(saved["epoch"], done, rest_windows, max(new_updates_per_epoch - rest_windows, 0))


def elastic_max_steps(max_steps: int, updates_per_epoch_now: int, global_step: int, resume: ElasticResume) -> int:
    """An epoch-based run's `max_steps` after an elastic resume (pure): the updates done, the resumed epoch's rest,
    and this run's updates for the epochs after it (`max_steps` counted `epoch + 1` epochs of this geometry)."""
    return max_steps - (resume.epoch + 1) * updates_per_epoch_now + global_step + resume.rest_windows


def keep_global_batch_accumulation(saved_geometry: dict[str, Any] | None, per_device: int, world_size: int,
                                   checkpoint: str) -> int:
    """`resume_keep_global_batch`: the accumulation with per-device batch x accumulation x world size equal to the
    checkpoint's global batch (pure).

    Raises:
        ValueError: the checkpoint records no geometry (not written by hf_lightning), or its global batch is not a
            multiple of per-device batch x world size (the numbers, and what would divide).
    """
    if not saved_geometry or not all(k in saved_geometry for k in ELASTIC_KEYS):
        raise ValueError(f"resume_keep_global_batch=True: {checkpoint} does not record its global batch (its "
                         "lightning_state.pt is missing or older; transformers.Trainer does not write one). Set "
                         "per_device_train_batch_size and gradient_accumulation_steps yourself, or drop "
                         "resume_keep_global_batch.")
    target = global_batch(saved_geometry)
    per_update = per_device * world_size
    accumulation, rest = divmod(target, per_update)
    if rest or accumulation == 0:
        raise ValueError(
            f"resume_keep_global_batch=True: the checkpoint's global batch is {target} "
            f"({saved_geometry['per_device_train_batch_size']} per device x "
            f"{saved_geometry['gradient_accumulation_steps']} accumulation x {saved_geometry['world_size']} "
            f"process(es)), which per_device_train_batch_size={per_device} x {world_size} process(es) = {per_update} "
            f"does not divide. Choose a per-device batch and a number of processes whose product divides {target}, "
            "or drop resume_keep_global_batch.")
    return accumulation


def elastic_line(checkpoint: str, before: dict[str, Any], now: dict[str, Any], resume: ElasticResume,
                 old_upe: int, new_upe: int, global_step: int, old_max: int | None, new_max: int,
                 user_max_steps: int, num_epochs: float) -> str:
    """The one line an elastic resume logs (pure): old -> new geometry, where the resumed epoch continues, the
    updates per epoch and what happens to the run's end and its learning-rate schedule."""
    geometry = ", ".join(
        f"{label} {before.get(key)} -> {now.get(key)}" for label, key in (
            ("world size", "world_size"), ("per-device batch", "per_device_train_batch_size"),
            ("accumulation", "gradient_accumulation_steps")))
    rows = int(now.get("train_samples") or 0)
    if resume.start_sample:
        where = (f"epoch {resume.epoch} continues its order after sample {resume.start_sample} of {rows} (the "
                 f"{rows - resume.start_sample} rows left, in {resume.rest_windows} update(s))")
    else:
        where = f"epoch {resume.epoch} starts from its first sample"
    if user_max_steps > 0:
        end = (f"max_steps={user_max_steps} still ends the run at update {user_max_steps}: its "
               f"{max(user_max_steps - global_step, 0)} update(s) left train {global_batch(now)} samples each instead "
               f"of {global_batch(before)}, so the run ends at another sample; the learning-rate schedule continues "
               f"from step {global_step}")
    else:
        was = f" (was {old_max})" if old_max is not None else ""
        end = (f"num_train_epochs={num_epochs:g} still ends the run at the end of its last epoch, now after {new_max} "
               f"updates{was}; the learning-rate schedule is built for {new_max} updates and continues from step "
               f"{global_step}")
    return (f"resume_from_checkpoint={checkpoint!r}: resumed in another geometry: {geometry}, global batch "
            f"{global_batch(before)} -> {global_batch(now)}. By its sample position {where}, so every row is trained "
            f"exactly once per epoch; updates per epoch {old_upe} -> {new_upe}; {end}.")


def hf_rule_rows(saved: dict[str, Any] | None, before: dict[str, Any], now: dict[str, Any], epoch: int,
                 windows: int) -> str:
    """What HF's rule does to the rows, for a resume without a usable sample position (pure): how many rows of the
    order (counted over epochs) are never trained or trained twice, when the saved position is known."""
    if saved is None or not all(k in before for k in (*ELASTIC_KEYS, "train_samples")) or not before["train_samples"]:
        return "rows may be skipped or repeated (the checkpoint does not record which it trained)"
    rows = int(before["train_samples"])
    if now.get("train_samples") != rows:
        return (f"the dataset's length changed ({rows} -> {now.get('train_samples')} rows), so which rows are left "
                "of the checkpoint's epoch is unknown")
    done = (saved["epoch"] + 1) * rows if saved["epoch_finished"] else saved["epoch"] * rows + min(
        saved["windows_done"] * global_batch(before), rows)
    placed = epoch * int(now.get("train_samples") or rows) + windows * global_batch(now)
    if placed > done:
        return (f"{placed - done} row(s) of the order (samples {done}..{placed - 1}, counted over epochs) are never "
                "trained")
    if placed < done:
        return (f"{done - placed} row(s) of the order (samples {placed}..{done - 1}, counted over epochs) are "
                "trained twice")
    return "no row is skipped or repeated"

