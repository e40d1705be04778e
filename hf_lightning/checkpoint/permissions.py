"""Weight files get the permissions of the user's umask, like every other file of a checkpoint.

safetensors >= 0.8 writes its files through a private temporary file, so `model.safetensors` comes out as 0600
(owner only) whatever the umask, while `config.json`, `optimizer.pt`... follow the umask (0644 under the usual
0022). On a shared cluster, teammates and serving processes then cannot read the weights. `transformers.Trainer`
5.23 writes 0600 too; hf_lightning gives the weights the mode a plain `open()` would have given them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["current_umask", "file_mode", "apply_umask"]

WEIGHT_SUFFIXES = (".safetensors",)


def current_umask() -> int:
    """The process's umask, read without changing it where Linux reports it (`/proc/self/status`)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore at once (the only portable way to read it)
    os.umask(mask)
    return mask


def file_mode(umask: int) -> int:
    """The permission bits `open(path, "w")` gives a new file under `umask`."""
    return 0o666 & ~umask


def apply_umask(directory: str | Path) -> list[Path]:
    """Give the weight files directly in `directory` the umask's mode; returns the files changed."""
    mode = file_mode(current_umask())
    changed = []
    for path in Path(directory).iterdir():
        if path.name.endswith(WEIGHT_SUFFIXES) and path.is_file() and (path.stat().st_mode & 0o777) != mode:
            os.chmod(path, mode)
            changed.append(path)
    return changed
