"""Verifying a checkpoint folder before anything trusts it: the whole-file checks, the manifest, the step.

One rule for every reader: a resume (`checkpoint/find.py`), `load_best_model_at_end` (`checkpoint/best.py`) and the
`hf-lightning verify` command. A folder is good when

- every file is whole (`integrity.folder_problems`: JSON parses, safetensors and zip archives are complete);
- its manifest, when it has one (every folder hf_lightning writes does: `manifest.py`), matches every file's size
  and checksum and names the folder's step; a folder holding a file only hf_lightning writes (`OWN_MARKERS`:
  `lightning_state.pt`, `stream_position*.pt`) but no manifest is damaged, not foreign: deleting the manifest must not
  turn an altered checkpoint of ours into an unchecked "transformers.Trainer" one;
- `trainer_state.json`'s `global_step` is the step of the folder's name (`integrity.step_problem`), also for a
  folder written by `transformers.Trainer`, which has no manifest.

A bad folder is reported with each file and the newest earlier good checkpoint beside it.

A folder found good is remembered for this process with the size and modification time of each of its files: a
resume verifies its checkpoint when the run is set up and again when it is loaded, and the second check then only
looks at the files' metadata instead of reading every byte again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hf_lightning.checkpoint.integrity import (
    DamagedCheckpointError,
    damaged_file_error,
    folder_problems,
    previous_complete_checkpoint,
    step_problem,
)
from hf_lightning.checkpoint.layout import checkpoint_folders
from hf_lightning.checkpoint.manifest import MANIFEST_NAME, manifest_problems

__all__ = ["OWN_MARKERS", "Verdict", "checkpoint_error", "checkpoint_problems", "is_good_checkpoint", "own_marker",
           "previous_good_checkpoint", "require_verified", "verify_folder", "verify_path"]


OWN_MARKERS = ("lightning_state.pt", "stream_position.pt", "stream_position_*.pt")
"""Files (glob patterns) that only hf_lightning writes into a checkpoint, never `transformers.Trainer`."""


def own_marker(folder: str | Path) -> str | None:
    """The name of a file in `folder` that only hf_lightning writes (`OWN_MARKERS`), else None."""
    for pattern in OWN_MARKERS:
        found = sorted(Path(folder).glob(pattern))
        if found:
            return found[0].name
    return None


@dataclass(frozen=True)
class Verdict:
    """What `verify_folder` found in one checkpoint folder.

    Attributes:
        folder: the folder.
        problems: `{file name: problem}`; empty when the folder is good.
        has_manifest: whether the folder carries a manifest (hf_lightning wrote it).
        files: how many files the manifest lists (0 without one).
    """

    folder: Path
    problems: dict[str, str] = field(default_factory=dict)
    has_manifest: bool = False
    files: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


_VERIFIED: dict[Path, tuple[tuple[tuple[str, int, int], ...], Verdict]] = {}
"""Folders found good in this process: their files' `(name, size, mtime_ns)` then."""


def _signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    entries = []
    for root, _, names in os.walk(folder):
        for name in names:
            stat = os.stat(os.path.join(root, name))
            entries.append((os.path.join(root, name), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))


def verify_folder(folder: str | Path) -> Verdict:
    """Check one checkpoint folder (see the module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        return Verdict(folder, {str(folder): "no such folder"})
    key = folder.resolve()
    signature = _signature(folder)
    known = _VERIFIED.get(key)
    if known is not None and known[0] == signature:
        return known[1]
    verdict = _check(folder)
    if verdict.ok:
        _VERIFIED[key] = (signature, verdict)
    else:
        _VERIFIED.pop(key, None)
    return verdict


def _check(folder: Path) -> Verdict:
    problems = dict(folder_problems(folder))
    if not (folder / "trainer_state.json").is_file():
        problems["trainer_state.json"] = "missing"
    listed = manifest_problems(folder)
    marker = own_marker(folder) if listed is None else None
    if marker is not None:
        problems[MANIFEST_NAME] = (f"missing, but {marker} is there, which only hf_lightning writes: the folder was "
                                   "written by hf_lightning and its manifest was deleted, so its files cannot be "
                                   "trusted")
    if listed:
        problems.update({name: problem for name, problem in listed.items() if name not in problems})
    step = step_problem(folder)
    if step is not None:
        problems.setdefault("trainer_state.json", step)
    files = 0
    if listed is not None and MANIFEST_NAME not in (listed or {}):
        files = len(json.loads((folder / MANIFEST_NAME).read_text())["files"])
    return Verdict(folder, problems, has_manifest=listed is not None, files=files)


def checkpoint_problems(folder: str | Path) -> dict[str, str]:
    """`{file name: problem}` of a checkpoint folder ({}: good)."""
    return verify_folder(folder).problems


def is_good_checkpoint(folder: str | Path) -> bool:
    """Whether `folder` passes every check."""
    return verify_folder(folder).ok


def previous_good_checkpoint(folder: str | Path) -> Path | None:
    """The newest `checkpoint-<m>` beside `folder` with m below its step that passes every check, or None."""
    return previous_complete_checkpoint(folder, is_good_checkpoint)


def checkpoint_error(folder: str | Path, problems: dict[str, str], what: str = "resume_from_checkpoint"
                     ) -> DamagedCheckpointError:
    """The error naming each bad file of `folder` and the previous good checkpoint."""
    return damaged_file_error(folder, problems, what, is_good=is_good_checkpoint)


def verify_path(path: str | Path) -> list[Verdict]:
    """Verify `path`: one checkpoint folder, or every `checkpoint-<n>` of an output directory (by step); [] when
    `path` is neither."""
    path = Path(path)
    folders = checkpoint_folders(path)
    if folders:
        return [verify_folder(folder) for _, folder in sorted(folders.items())]
    if path.is_dir() and ((path / "trainer_state.json").exists() or (path / MANIFEST_NAME).exists()):
        return [verify_folder(path)]
    return []


def require_verified(folder: str | Path, what: str) -> None:
    """Refuse to load model files from `folder` unless they verify: a checkpoint (`trainer_state.json`, a manifest or
    a file only hf_lightning writes) by every check of `verify_folder`, a saved model folder (`save_pretrained`,
    `transformers.Trainer`'s final save) by the whole-file checks. A name that is not a local folder (a hub id)
    passes.

    Args:
        folder: the folder about to be loaded.
        what: the option that named it (`ckpt_path`, `model.model_name_or_path`), for the message.

    Raises:
        DamagedCheckpointError: naming each bad file and the previous good checkpoint.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return
    is_checkpoint = ((folder / "trainer_state.json").is_file() or (folder / MANIFEST_NAME).is_file()
                     or own_marker(folder) is not None)
    problems = verify_folder(folder).problems if is_checkpoint else folder_problems(folder)
    if problems:
        raise checkpoint_error(folder, problems, what)
