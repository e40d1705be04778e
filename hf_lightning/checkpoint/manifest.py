"""The manifest of a checkpoint folder: the size and checksum of every file, written before the folder is renamed into
place, and checking a folder against it.

`checkpoint_manifest.json` lists every file of the folder (sub-folders too: a sharded optimizer, a named adapter,
DeepSpeed's engine state) with its size in bytes and its `xxh3_128` checksum, and the step the folder was saved at.
It is written last, by the process that finalises the folder (rank 0, once every rank's files exist), just before
the flush and the rename (`io.finalize_checkpoint`), so every `checkpoint-<n>` hf_lightning writes carries one, and
any byte changed afterwards (a flipped bit on the disk, an edited `trainer_state.json`, an incomplete copy) no longer
matches it.

The checksum is xxHash's XXH3 (128 bits; the `xxhash` package, which `datasets` already depends on): it detects
corruption, it is not a signature against a deliberate forger. The files are hashed from a memory map of the page
cache the save has just filled, so hashing costs about one memory read of the checkpoint (bench/README.md).

Folders without a manifest (written by `transformers.Trainer`, or by hf_lightning before this file existed) are
checked by the structural checks of `integrity.py` only. Files added to a folder after the save are not listed and
not checked.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import xxhash

__all__ = ["ALGORITHM", "MANIFEST_NAME", "build_manifest", "file_checksum", "manifest_problems", "read_manifest",
           "write_manifest"]

MANIFEST_NAME = "checkpoint_manifest.json"
ALGORITHM = "xxh3_128"
_FORMAT = "hf_lightning checkpoint manifest"
_VERSION = 1
_CHUNK = 64 * 2**20  # bytes hashed per piece when a file cannot be memory-mapped


def file_checksum(path: str | Path) -> str:
    """The `xxh3_128` hex digest of a file's bytes."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return digest.hexdigest()
        try:  # zero-copy from the page cache: the file was just written
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                digest.update(mapped)
                return digest.hexdigest()
        except (OSError, ValueError):  # a file system without mmap: read it in pieces
            f.seek(0)
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _listed(folder: Path) -> list[str]:
    """The files of `folder`, recursively, as sorted POSIX paths relative to it (the manifest and the background
    save's `.rank-<r>-*` markers excluded)."""
    names = []
    for root, _, files in os.walk(folder):
        for name in files:
            relative = Path(root, name).relative_to(folder).as_posix()
            if relative != MANIFEST_NAME and not name.startswith(".rank-"):
                names.append(relative)
    return sorted(names)


def build_manifest(folder: str | Path, step: int) -> dict:
    """The manifest of `folder` (its files as they are now) for a checkpoint of `step`."""
    folder = Path(folder)
    files = {}
    for name in _listed(folder):
        path = folder / name
        files[name] = {"size": path.stat().st_size, ALGORITHM: file_checksum(path)}
    return {"format": _FORMAT, "version": _VERSION, "algorithm": ALGORITHM, "step": step, "files": files}


def write_manifest(folder: str | Path, step: int) -> Path:
    """Write `checkpoint_manifest.json` into `folder` (every file must already be there); return its path."""
    path = Path(folder) / MANIFEST_NAME
    path.write_text(json.dumps(build_manifest(folder, step), indent=1, sort_keys=True) + "\n")
    return path


def read_manifest(folder: str | Path) -> dict | None:
    """The parsed manifest of `folder`, or None when it has none.

    Raises:
        ValueError: the manifest exists but is not one (invalid JSON, wrong format, unknown algorithm).
    """
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as err:
        raise ValueError(f"{MANIFEST_NAME} cannot be read ({type(err).__name__}: {err})") from err
    if (not isinstance(manifest, dict) or manifest.get("format") != _FORMAT or not isinstance(manifest.get("files"),
                                                                                                 dict)):
        raise ValueError(f"{MANIFEST_NAME} is not an hf_lightning checkpoint manifest")
    if manifest.get("algorithm") != ALGORITHM:
        raise ValueError(f"{MANIFEST_NAME} uses the checksum {manifest.get('algorithm')!r}, which this version of "
                         f"hf_lightning does not know (it knows {ALGORITHM!r})")
    return manifest


def manifest_problems(folder: str | Path) -> dict[str, str] | None:
    """`{file name: problem}` for each file of `folder` that differs from its manifest ({}: all match); None when
    the folder has no manifest (not written by hf_lightning, or before manifests existed).

    The step the manifest records must also be the folder's (`checkpoint-<n>`): a folder renamed to another step is
    reported under the manifest's name.
    """
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except ValueError as err:
        return {MANIFEST_NAME: str(err)}
    if manifest is None:
        return None
    problems: dict[str, str] = {}
    suffix = folder.name.rpartition("-")[2]
    if folder.name.startswith("checkpoint-") and suffix.isdigit() and manifest.get("step") != int(suffix):
        problems[MANIFEST_NAME] = (f"it records step {manifest.get('step')}, but the folder is named for step "
                                   f"{suffix} (renamed or copied over another checkpoint)")
    for name, entry in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            problems[name] = "missing (the manifest lists it)"
            continue
        size = path.stat().st_size
        if size != entry.get("size"):
            problems[name] = f"{size} bytes where the manifest records {entry.get('size')}"
        elif file_checksum(path) != entry.get(ALGORITHM):
            problems[name] = "its checksum differs from the one recorded at the save (altered or corrupted since)"
    return problems
