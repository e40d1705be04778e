"""Whether the files of a checkpoint folder are whole, and the error that names a damaged one.

The checks read no tensor: a JSON file must parse; a safetensors file must hold its header and exactly the bytes the
header describes; a `torch.save` file (a zip archive) must have its central directory, which sits at the end of the
file, so any truncation is caught. They run before a resume loads anything, so a damaged file is named before the
model is half restored; a load that still fails is reported the same way (`damaged_file_error`).
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

from hf_lightning.checkpoint.layout import checkpoint_folders
from hf_lightning.checkpoint.weight_files import adapter_subfolders

__all__ = ["DamagedCheckpointError", "damaged_file_error", "file_problem", "folder_problems",
           "previous_complete_checkpoint", "step_problem"]

_CHECKED_SUFFIXES = (".json", ".safetensors", ".pt", ".pth", ".bin")


class DamagedCheckpointError(ValueError):
    """A checkpoint file is truncated or corrupted (the message names it and the checkpoint to use instead)."""


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a safetensors header"
        (length,) = struct.unpack("<Q", head)
        if 8 + length > size:
            return f"the header announces {length} bytes but the file has {size}"
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "the header is not valid JSON"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        return f"{size} bytes where the header describes {expected}"
    return None


def _torch_file_problem(path: Path) -> str | None:
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic != b"PK":  # not a zip: the legacy pickle format (torch < 1.6) has no cheap check
        return None if magic[:1] == b"\x80" else "neither a torch zip archive nor a legacy pickle"
    try:
        with zipfile.ZipFile(path) as archive:
            size = path.stat().st_size
            if any(info.header_offset + info.compress_size > size for info in archive.infolist()):
                return "an entry extends past the end of the file"
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        return f"the zip archive is incomplete ({err})"
    return None


def file_problem(path: str | Path) -> str | None:
    """Why `path` is not a whole checkpoint file (truncated, corrupted), else None. Unknown kinds pass."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return "the file is empty"
        if path.suffix == ".json":
            json.loads(path.read_text())
            return None
        if path.suffix == ".safetensors":
            return _safetensors_problem(path)
        if path.suffix in (".pt", ".pth", ".bin"):
            return _torch_file_problem(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return f"not valid JSON ({err})"
    except OSError as err:
        return f"cannot be read ({err})"
    return None


def folder_problems(folder: str | Path) -> dict[str, str]:
    """`{file name: problem}` for every damaged file directly in `folder` or in a PEFT adapter's sub-folder (a named
    adapter is saved in `<folder>/<adapter name>/`, `weight_files.py`; named `<adapter name>/<file>`)."""
    folder = Path(folder)
    problems = {}
    for directory in (folder, *adapter_subfolders(folder)):
        for path in sorted(directory.iterdir()):
            if path.is_file() and path.suffix in _CHECKED_SUFFIXES:
                problem = file_problem(path)
                if problem is not None:
                    problems[str(path.relative_to(folder))] = problem
    return problems


def step_problem(folder: str | Path) -> str | None:
    """Why `trainer_state.json`'s `global_step` is not the step of the folder's name `checkpoint-<n>`, else None.

    A resume continues from `global_step` on the folder's weights: a state from another step would silently skip
    (or repeat) updates. Folders not named `checkpoint-<n>`, and a missing or unreadable state file (reported by the
    other checks), pass here.
    """
    folder = Path(folder)
    prefix, _, suffix = folder.name.rpartition("-")
    if prefix != "checkpoint" or not suffix.isdigit():
        return None
    try:
        step = json.loads((folder / "trainer_state.json").read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    if step != int(suffix):
        return (f"its global_step is {step!r}, but the folder is {folder.name} (a state file from another step, or "
                "an edited one)")
    return None


def previous_complete_checkpoint(folder: str | Path, is_good: Callable[[Path], bool] | None = None) -> Path | None:
    """The newest `checkpoint-<m>` beside `folder` with m below its step whose files are all whole (`is_good`, when
    given, decides instead), or None."""
    folder = Path(folder)
    step = folder.name.rpartition("-")[2]
    if not step.isdigit():
        return None
    for other_step, other in sorted(checkpoint_folders(folder.parent).items(), reverse=True):
        if other_step >= int(step):
            continue
        if is_good(other) if is_good is not None else (
                not folder_problems(other) and (other / "trainer_state.json").is_file()):
            return other
    return None


def damaged_file_error(folder: str | Path, problems: dict[str, str], what: str = "resume_from_checkpoint",
                       is_good: Callable[[Path], bool] | None = None) -> DamagedCheckpointError:
    """The error for the damaged files (`{name: problem}`) of checkpoint `folder`, suggesting the previous
    complete checkpoint (`is_good`: what counts as complete, see `previous_complete_checkpoint`)."""
    folder = Path(folder)
    previous = previous_complete_checkpoint(folder, is_good)
    if previous is not None:
        advice = (f"The previous complete checkpoint is {str(previous)!r}: move {folder.name} out of "
                  f"{str(folder.parent)!r} and resume with resume_from_checkpoint=True (or pass that folder).")
    else:
        advice = f"No earlier complete checkpoint-<n> exists in {str(folder.parent)!r}; start a fresh run."
    damaged = "; ".join(f"{name} is damaged ({problem})" for name, problem in problems.items())
    return DamagedCheckpointError(
        f"{what}={str(folder)!r}: {damaged}. A file cut short by a crash or a full disk, or altered after saving, "
        f"cannot be resumed from. {advice}"
    )
