"""Which folders of `output_dir` are checkpoints, which are hf_lightning's temporary ones, and removing them safely.

- A checkpoint is a folder named exactly `checkpoint-<n>` (digits only). Rotation, the end-of-training cleanup,
  `resume_from_checkpoint=True`, the start-up rule and HF's own `get_last_checkpoint` all see this one set. Nothing
  else in `output_dir` is ever touched: `checkpoint-final`, `checkpoint-5-backup` or a user's notes are the user's.
  (HF's rotation globs `checkpoint-*` and deletes such folders too; README "Differences".)
- A save writes `tmp-checkpoint-<n>-<run>`, where `<run>` is the id of the run holding the output-directory lock
  (`run_lock.py`), so two runs never share a temporary folder; only the final rename makes it `checkpoint-<n>`.
- A deletion is a rename first: `checkpoint-<n>` becomes `deleting-checkpoint-<n>-<run>` (one atomic rename, after
  which no reader takes it for a checkpoint, then the parent directory is flushed), and only then are its files
  removed. A kill at any instant leaves the folder either complete under its name or out of the checkpoint set.
- Re-saving an existing step moves the old folder to `replaced-checkpoint-<n>-<run>`, renames the new one in, then
  removes the old one.
- `clean_leftovers`, at the start of a run (with the lock held, so no other run is writing), removes what killed
  runs left behind and puts back a replaced folder whose replacement never arrived.

Durability: `fsync_tree` flushes every file and folder of a finished temporary folder before its rename, and
`fsync_dir` the parent after it, so a power cut never leaves a `checkpoint-<n>` whose files are empty.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hf_lightning.checkpoint.rotate import CheckpointInfo

__all__ = [
    "CHECKPOINT_PREFIX", "TMP_PREFIX", "checkpoint_folders", "clean_leftovers", "fsync_dir", "fsync_file", "fsync_tree",
    "list_checkpoints", "remove_checkpoint", "replace_checkpoint", "restorable_checkpoints", "tmp_folder",
]

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint"
TMP_PREFIX = "tmp-checkpoint"
_DELETING = "deleting-checkpoint"
_REPLACED = "replaced-checkpoint"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# `<run>` is optional: hf_lightning before the run lock wrote `tmp-checkpoint-<n>` and `tmp-checkpoint-<n>-old`
_LEFTOVER = re.compile(r"^(tmp|deleting|replaced)-checkpoint-(\d+)(?:-([0-9a-f]+))?(-old)?$")


def checkpoint_folders(output_dir: str | Path) -> dict[int, Path]:
    """`{step: path}` of the folders named exactly `checkpoint-<n>` in `output_dir` (empty if it does not exist)."""
    root = Path(output_dir)
    if not root.is_dir():
        return {}
    return {int(m.group(1)): p for p in root.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()}


def list_checkpoints(output_dir: str | Path) -> list[CheckpointInfo]:
    """The checkpoint folders with their step and modification time, for the rotation rule."""
    return [CheckpointInfo(str(path), step, path.stat().st_mtime)
            for step, path in sorted(checkpoint_folders(output_dir).items())]


def tmp_folder(output_dir: str | Path, step: int, run: str) -> Path:
    """Where run `run` writes the checkpoint of `step` before renaming it."""
    return Path(output_dir) / f"{TMP_PREFIX}-{step}-{run}"


def fsync_file(path: str | Path) -> None:
    """Flush a file's data, or a directory's entries (a rename or a new file in it), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_dir = fsync_file


def fsync_tree(folder: str | Path, during: Callable[[], None] | None = None) -> None:
    """Flush every file of `folder` (recursively), then every directory, bottom-up.

    The files are flushed from a few threads at once (`fsync` releases the GIL): the device then writes them in
    parallel, which measured faster than one after the other (bench/README.md). `during` runs in this thread while
    they are flushed (the checkpoint's checksums: CPU work that then costs no time of its own while the device
    writes); the files it creates in `folder` are flushed after it."""
    walked = list(os.walk(folder, topdown=False))
    files = [os.path.join(root, name) for root, _, names in walked for name in names]
    with ThreadPoolExecutor(max_workers=min(8, max(len(files), 1))) as pool:
        flushed = pool.map(fsync_file, files)  # every flush is submitted now
        if during is not None:
            during()
        list(flushed)
    if during is not None:
        known = set(files)
        for root, _, names in os.walk(folder):
            for name in names:
                if os.path.join(root, name) not in known:
                    fsync_file(os.path.join(root, name))
    for root, _, _ in walked:
        fsync_dir(root)


def remove_checkpoint(path: str | Path, run: str) -> None:
    """Delete checkpoint folder `path`: rename it out of the checkpoint set, flush the rename, then remove it.

    A kill during the removal leaves `deleting-checkpoint-<n>-<run>`, which `clean_leftovers` removes at the next
    start; the name never matches `checkpoint-<n>`, so nothing resumes from, loads or rotates a half-deleted folder.
    """
    path = Path(path)
    doomed = path.parent / f"{_DELETING}-{path.name.rpartition('-')[2]}-{run}"
    os.replace(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def replace_checkpoint(tmp: Path, final: Path, run: str) -> None:
    """Rename the complete `tmp` to `final`; an existing `final` is moved aside first and removed afterwards."""
    if not final.exists():
        os.replace(tmp, final)
        fsync_dir(final.parent)
        return
    old = final.parent / f"{_REPLACED}-{final.name.rpartition('-')[2]}-{run}"
    os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def _leftovers(root: Path) -> list[tuple[Path, Path, bool]]:
    """`(leftover, its checkpoint-<n>, whether it is an old folder moved aside by a re-save)` of `root`."""
    found = []
    for path in sorted(root.iterdir()):
        match = _LEFTOVER.match(path.name)
        if match is not None and path.is_dir():
            kind, step, _, legacy_old = match.groups()
            found.append((path, root / f"{CHECKPOINT_PREFIX}-{step}", kind == "replaced" or bool(legacy_old)))
    return found


def restorable_checkpoints(output_dir: str | Path) -> dict[int, Path]:
    """`{step: checkpoint-<n> path}` of the folders `clean_leftovers` will put back (read-only)."""
    root = Path(output_dir)
    if not root.is_dir():
        return {}
    return {int(final.name.rpartition("-")[2]): final for _, final, old in _leftovers(root)
            if old and not final.exists()}


def clean_leftovers(output_dir: str | Path) -> list[str]:
    """Remove the temporary folders killed runs left in `output_dir`; restore a replaced checkpoint whose
    replacement was never renamed in. Call it only while holding the output-directory lock. Returns what it did,
    one phrase per folder (for the log)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    done = []
    for path, final, old in _leftovers(root):
        if old and not final.exists():
            os.replace(path, final)  # the old folder was complete when moved aside; its replacement never arrived
            done.append(f"restored {final.name} from {path.name}")
            continue
        shutil.rmtree(path, ignore_errors=True)
        done.append(f"removed {path.name}")
    if done:
        fsync_dir(root)
        log.info("Cleaned up after an interrupted run in %s: %s.", root, "; ".join(done))
    return done
