"""Whether the checkpoints already in `output_dir` are the user's own earlier run of the same command.

HF's scripts are re-run into their own `output_dir` (a script without `get_last_checkpoint` then trains from scratch
and HF overwrites its checkpoints as it saves), and resumed from an older checkpoint while newer ones exist (HF
replaces them). hf_lightning refuses to destroy checkpoints of a *different* run (`checkpoint/find.py`), so it tells the
two apart by what the checkpoint records: its `training_args.bin` (written by us or by `transformers.Trainer`). The
run is the same when every argument that shapes the training is equal; the arguments that only say where and how the
run is launched, logged or reported (`EXEMPT`) may differ.

This module only compares values; the pickle is read by `changed_settings.read_recorded_arguments` (allow-listed
classes, `weights_only=True`) and only from a folder that passed `verify.verify_folder` (`find.py`): a checkpoint of
an earlier run is not trusted code.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any

from hf_lightning.args import TrainingArguments
from hf_lightning.args.from_transformers import from_hf_training_arguments

if TYPE_CHECKING:
    from hf_lightning.checkpoint.content import SavedArguments

__all__ = ["EXEMPT", "argument_differences", "plain_values"]

EXEMPT = frozenset({
    "output_dir", "logging_dir", "resume_from_checkpoint", "do_train", "do_eval", "do_predict", "run_name",
    "report_to", "disable_tqdm", "log_level", "log_level_replica", "log_on_each_node", "local_rank",
    "dataloader_num_workers", "dataloader_prefetch_factor", "dataloader_persistent_workers", "dataloader_pin_memory",
    "overwrite_output_dir",
})
"""Arguments that do not change what a run computes: a re-run may change them and still be the same run."""


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()} or None  # HF turns None kwargs into {}
    return value


def plain_values(args: SavedArguments) -> dict[str, Any]:
    """The fields as hf_lightning holds them: a `transformers.TrainingArguments` is converted first, so the values HF
    derives in its `__post_init__` (an `AcceleratorConfig`, `debug=[]`) compare equal to ours."""
    if not isinstance(args, TrainingArguments):
        args = from_hf_training_arguments(args)
    return {f.name: _plain(getattr(args, f.name, None)) for f in dataclasses.fields(args) if f.init}


def argument_differences(before: dict[str, Any], args: TrainingArguments) -> list[str]:
    """`["name: recorded -> now", ...]` for each training-shaping argument that differs between the arguments a
    checkpoint records (`before`, as `plain_values`) and `args`; [] for the same run (pure)."""
    now = plain_values(args)
    return [f"{name}: {before[name]!r} -> {now[name]!r}" for name in sorted(set(before) & set(now))
            if name not in EXEMPT and before[name] != now[name]]
