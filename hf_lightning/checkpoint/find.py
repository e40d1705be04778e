"""Finding and checking the checkpoint to resume from, and the output-directory rule.

- `resolve_checkpoint` / `resolve_resume` (checked) and `resume_folder` (checked later, by the restorer):
  `resume_from_checkpoint=True` (the latest complete `checkpoint-<n>` of `output_dir`, HF's
  `get_last_checkpoint`) or a path; errors for a missing folder and for an incomplete one (naming the missing file).
- `replaced_checkpoints_notice`: as in HF, a run replaces the `checkpoint-<n>` folders already in `output_dir` as it
  saves: a fresh run trained again into the same `output_dir` replaces all of them, a run resumed from an older
  checkpoint the newer ones (each atomically, `folders.replace_checkpoint`; `save_total_limit` rotation then counts
  them as HF's `_sorted_checkpoints` does). One warning line names them, and says whether they were written with
  the same training arguments (`same_run.py`). A concurrent run into the same `output_dir` is still refused by the
  output-directory lock (`checkpoint/run_lock.py`).

Only folders named exactly `checkpoint-<n>` count (`checkpoint/layout.py`): temporary folders of a save that did not
finish, half-deleted folders and the user's own `checkpoint-final` are neither resumed from nor in the way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint.changed_settings import read_recorded_arguments
from hf_lightning.checkpoint.integrity import folder_problems
from hf_lightning.checkpoint.io import (
    LIGHTNING_STATE_NAME,
    SHARDED_OPTIMIZER_DIR,
    TRAINER_STATE_NAME,
    rng_file_name,
)
from hf_lightning.checkpoint.layout import checkpoint_folders, restorable_checkpoints
from hf_lightning.checkpoint.same_run import argument_differences
from hf_lightning.checkpoint.verify import checkpoint_error, checkpoint_problems, is_good_checkpoint
from hf_lightning.checkpoint.weight_files import ADAPTER_WEIGHT_FILES, WEIGHT_FILES, weights_file

__all__ = ["CheckpointFiles", "CheckpointNotFoundError", "check_checkpoint", "last_checkpoint",
           "list_checkpoint_steps", "replaced_checkpoints_notice", "resolve_checkpoint", "resolve_resume",
           "resume_folder", "trained_epoch"]


def list_checkpoint_steps(folder: str | Path) -> dict[int, Path]:
    """`{step: path}` of the `checkpoint-<n>` folders of `folder` (exact names only, as HF's resume lookup)."""
    return checkpoint_folders(folder)


def last_checkpoint(folder: str | Path) -> str | None:
    """HF `get_last_checkpoint` (TU:270-279): the `checkpoint-<n>` folder with the largest n, or None."""
    steps = list_checkpoint_steps(folder)
    return str(steps[max(steps)]) if steps else None



class CheckpointNotFoundError(ValueError, FileNotFoundError):
    """A `resume_from_checkpoint` folder that does not exist or holds no model weights: HF's `ValueError` ("Can't
    find a valid checkpoint at ..."), also a `FileNotFoundError` for code written against earlier releases."""


@dataclass(frozen=True)
class CheckpointFiles:
    """What a checkpoint folder offers for resuming."""

    path: Path
    weights: Path
    optimizer: Path | None
    sharded_optimizer: Path | None
    scheduler: Path | None
    scaler: Path | None
    rng: Path | None
    lightning_state: Path | None
    engine_state: Path | None = None
    """DeepSpeed's own checkpoint (`global_step<N>/` and `latest`, written under DeepSpeed, as HF's): the folder."""


def check_checkpoint(path: str | Path, world_size: int = 1, rank: int = 0, verify: bool = True) -> CheckpointFiles:
    """The files of checkpoint folder `path`, verified (`checkpoint/verify.py`: whole files, the manifest's
    checksums, the step of `trainer_state.json`); `verify=False` checks only that the files are there and whole.

    Raises:
        CheckpointNotFoundError: the folder does not exist or holds no weights file (HF's `ValueError` and text).
        FileNotFoundError: no `trainer_state.json`; one of
            `optimizer.pt` / `scheduler.pt` without the other, or RNG / Lightning state without either (a
            half-copied checkpoint).
        DamagedCheckpointError: a truncated, corrupted or altered file, or a `trainer_state.json` of another step
            (each one named, the previous good checkpoint suggested).
    """
    folder = Path(path)
    where = f"resume_from_checkpoint={str(folder)!r}"
    hf_words = f"Can't find a valid checkpoint at {path}"  # HF's ValueError, then what is wrong
    if not folder.is_dir():
        raise CheckpointNotFoundError(f"{hf_words} ({where}: no such checkpoint folder).")
    weights = weights_file(folder)
    if weights is None:
        raise CheckpointNotFoundError(
            f"{hf_words} ({where}: incomplete checkpoint, the model weights file is missing, expected one of "
            f"{list(WEIGHT_FILES + ADAPTER_WEIGHT_FILES)})."
        )
    if not (folder / TRAINER_STATE_NAME).is_file():
        raise FileNotFoundError(f"{where}: incomplete checkpoint, {TRAINER_STATE_NAME} is missing.")

    def optional(name: str) -> Path | None:
        return folder / name if (folder / name).exists() else None

    optimizer, scheduler = optional("optimizer.pt"), optional("scheduler.pt")
    sharded = optional(SHARDED_OPTIMIZER_DIR)
    engine = folder if (folder / "latest").is_file() else None  # DeepSpeed's marker file
    if (optimizer or sharded) and scheduler is None:
        raise FileNotFoundError(f"{where}: incomplete checkpoint, scheduler.pt is missing (optimizer state exists).")
    if scheduler and not (optimizer or sharded or engine):
        raise FileNotFoundError(f"{where}: incomplete checkpoint, optimizer.pt is missing (scheduler.pt exists).")
    training_state = [p.name for p in sorted(folder.glob("rng_state*.pth"))] + (
        [LIGHTNING_STATE_NAME] if (folder / LIGHTNING_STATE_NAME).exists() else [])
    if training_state and not (optimizer or sharded or scheduler):
        # a `save_only_model` folder has no RNG or loop state either: this one lost its optimizer files
        raise FileNotFoundError(f"{where}: incomplete checkpoint, optimizer.pt and scheduler.pt are missing "
                                f"({', '.join(training_state)} exist, so it was not saved with save_only_model).")
    problems = checkpoint_problems(folder) if verify else folder_problems(folder)
    if problems:
        raise checkpoint_error(folder, problems)
    return CheckpointFiles(
        path=folder, weights=weights, optimizer=optimizer, sharded_optimizer=sharded, scheduler=scheduler,
        scaler=optional("scaler.pt"), rng=optional(rng_file_name(world_size, rank)),
        lightning_state=optional(LIGHTNING_STATE_NAME), engine_state=engine,
    )


def resolve_checkpoint(output_dir: str, resume_from_checkpoint: str | bool, world_size: int = 1, rank: int = 0
                       ) -> str:
    """The checkpoint folder to resume from, checked for completeness and verified (`check_checkpoint`).

    Raises:
        ValueError: `True` with no checkpoint in `output_dir` (HF's message).
        FileNotFoundError: a path that does not exist, or an incomplete checkpoint (see `check_checkpoint`).
    """
    if resume_from_checkpoint is True:
        latest = _latest(output_dir)
        if not latest.exists():  # moved aside by a re-save cut short: put back when the run starts (folders.py)
            return str(latest)
        resume_from_checkpoint = str(latest)
    return str(check_checkpoint(str(resume_from_checkpoint), world_size, rank).path)


def _latest(output_dir: str) -> Path:
    """The newest `checkpoint-<n>` of `output_dir` (or one moved aside by a re-save cut short).

    Raises:
        ValueError: there is none (HF's message).
    """
    steps = {**checkpoint_folders(output_dir), **restorable_checkpoints(output_dir)}
    if not steps:
        raise ValueError(f"No valid checkpoint found in output directory ({output_dir})")
    return steps[max(steps)]


def _touched(output_dir: str | Path, resume_step: int | None, saving: bool) -> list[int]:
    """The steps of the checkpoints this run would overwrite or rotate away: all of them for a fresh run, the newer
    ones for a resumed run, none when it saves nothing."""
    if not saving:
        return []
    steps = sorted(list_checkpoint_steps(output_dir))
    return steps if resume_step is None else [s for s in steps if s > resume_step]


def _differences(output_dir: str | Path, steps: list[int], args: TrainingArguments) -> list[str] | None:
    """What differs between the run that wrote the newest of `steps` and `args` ([]: the same run; None: unknown).

    The earlier run's `training_args.bin` is a pickle in a folder this run did not write: it is read only once the
    folder verifies (manifest, whole files), and then with the allow-list of `changed_settings` (no code runs).
    """
    if args is None or not steps:
        return None
    folder = Path(output_dir) / f"checkpoint-{steps[-1]}"
    if not is_good_checkpoint(folder):
        return None
    before = read_recorded_arguments(folder)
    if before is None:
        return None
    try:
        return argument_differences(before, args)
    except Exception:  # noqa: BLE001 - arguments of another version: nothing is known, nothing is claimed
        return None


def replaced_checkpoints_notice(output_dir: str | Path, resume_step: int | None, saving: bool, args: TrainingArguments
                                ) -> str | None:
    """The one line to print when this run will replace checkpoints already in `output_dir` (as HF does), else None.

    Args:
        output_dir: where this run writes checkpoints.
        resume_step: the global step resumed from, None for a fresh run.
        saving: whether this run writes checkpoints at all (`save_strategy != "no"`).
        args: this run's training arguments, compared with the newest replaced checkpoint's `training_args.bin`.
    """
    touched = _touched(output_dir, resume_step, saving)
    if not touched:
        return None
    differences = _differences(output_dir, touched, args)
    if differences == []:
        origin = "an earlier run with the same arguments"
    elif differences:
        origin = f"an earlier run with other arguments ({'; '.join(differences[:4])})"
    else:
        origin = "an earlier run"
    start = "starts from scratch" if resume_step is None else f"resumes from step {resume_step}"
    return (f"output_dir={str(output_dir)!r} holds checkpoints of {origin}; this run {start} and replaces "
            f"{_names(touched)} as it saves (as HF does; nothing else in output_dir is touched).")


def _names(steps: list[int]) -> str:
    names = [f"checkpoint-{s}" for s in steps]
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def resolve_resume(args: TrainingArguments, resume_from_checkpoint: str | bool | None) -> str | None:
    """The checkpoint to resume from: the explicit value, else `args.resume_from_checkpoint`, else None.

    Raises:
        ValueError / FileNotFoundError: see `resolve_checkpoint`.
    """
    if resume_from_checkpoint in (None, False):
        resume_from_checkpoint = args.resume_from_checkpoint
    if not resume_from_checkpoint:
        return None
    return resolve_checkpoint(args.resolved_output_dir, resume_from_checkpoint)


def resume_folder(args: TrainingArguments, resume_from_checkpoint: str | bool | None) -> str | None:
    """The folder a starting fit resumes from, by `resolve_resume`'s rule, not checked yet: the restorer checks and
    verifies it once, on every process (`check_checkpoint`), so a fit reads its files once more, not twice.

    Raises:
        ValueError: `True` with no checkpoint in `output_dir` (HF's message).
    """
    if resume_from_checkpoint in (None, False):
        resume_from_checkpoint = args.resume_from_checkpoint
    if not resume_from_checkpoint:
        return None
    if resume_from_checkpoint is True:
        return str(_latest(args.resolved_output_dir))
    return str(Path(resume_from_checkpoint))


def trained_epoch(folder: str | None) -> float | None:
    """The epoch a checkpoint or model folder was saved at (its `trainer_state.json`), else None."""
    state = Path(folder) / TRAINER_STATE_NAME if folder else None
    if state is None or not state.is_file():
        return None
    epoch = json.loads(state.read_text()).get("epoch")
    return float(epoch) if epoch is not None else None
