"""`hf-lightning fit|validate|predict --help`, kept on disk after its first rendering.

Rendering the help needs the parser, and the parser needs the signatures of `lightning.Trainer` and the HF arguments:
importing torch, Lightning and transformers takes several seconds of CPU, for a text that only changes when the
installed code does. So the text is saved under a key made of everything it depends on (the command line, the
terminal width, the Python version, the versions of hf_lightning, Lightning, jsonargparse, transformers and torch, and
the size and modification time of every hf_lightning source file), and printed from there the next time, before
anything heavy is imported. Only a bare `<subcommand> --help` is kept (a `--config` changes the defaults shown).

The folder is `$HF_LIGHTNING_CACHE`, else `$XDG_CACHE_HOME/hf_lightning`, else `~/.cache/hf_lightning`; delete it to
start over. A folder that cannot be written only means the help is rendered every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

__all__ = ["cache_key", "cached_help", "help_cache_dir", "store_help"]

_PACKAGES = ("hf-lightning", "lightning", "jsonargparse", "transformers", "torch")
_SUBCOMMANDS = ("fit", "validate", "predict")


def help_cache_dir() -> Path:
    """Where rendered help texts are kept (see the module docstring)."""
    if os.environ.get("HF_LIGHTNING_CACHE"):
        return Path(os.environ["HF_LIGHTNING_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hf_lightning"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def cache_key(argv: list[str]) -> str | None:
    """The key of `argv`'s help text, or None when `argv` is not a bare `<subcommand> --help`."""
    if len(argv) != 2 or argv[0] not in _SUBCOMMANDS or argv[1] not in ("-h", "--help"):
        return None
    package = Path(__file__).resolve().parents[1]
    sources = sorted((str(p.relative_to(package)), p.stat().st_size, p.stat().st_mtime_ns)
                     for p in package.rglob("*.py"))
    parts = [argv[0], shutil.get_terminal_size().columns, sys.version, [_version(p) for p in _PACKAGES], sources]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def cached_help(argv: list[str]) -> str | None:
    """The saved help text for `argv`, or None."""
    key = cache_key(argv)
    if key is None:
        return None
    try:
        return (help_cache_dir() / f"help-{key}.txt").read_text()
    except OSError:
        return None


def store_help(argv: list[str], text: str) -> None:
    """Save `argv`'s help text (atomically; nothing happens when the folder cannot be written)."""
    key = cache_key(argv)
    if key is None or not text:
        return
    folder = help_cache_dir()
    temporary = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as f:
            temporary = f.name
            f.write(text)
        os.replace(temporary, folder / f"help-{key}.txt")
    except OSError:
        if temporary is not None and os.path.exists(temporary):
            os.unlink(temporary)
