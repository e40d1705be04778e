"""Which file of a checkpoint folder holds its weights: the full model's, or a PEFT adapter's (HF reads both,
T:3612-3664).

One rule for every reader and writer: the save (`io.finalize_checkpoint` renames a folder only when it holds one),
the resume check (`checkpoint/find.py`), the integrity check (`integrity.py`, which also reads named adapters'
sub-folders), `load_best_model_at_end` and the CLI's `ckpt_path`. A `PeftModel`'s `save_pretrained` writes
`adapter_model.safetensors` (plus `adapter_config.json`) instead of `model.safetensors`: the adapter named "default"
at the top of the folder, any other adapter in a sub-folder of its name.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ADAPTER_WEIGHT_FILES", "WEIGHT_FILES", "adapter_file", "adapter_subfolders", "adapter_weights_file",
           "is_adapter_file", "weights_file"]

WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)
"""The full model's weight files, in HF's order of preference."""

ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
"""The adapter weight files of a PEFT `save_pretrained` (HF's `ADAPTER_SAFE_WEIGHTS_NAME`, `ADAPTER_WEIGHTS_NAME`)."""


def adapter_file(folder: Path) -> Path | None:
    """The adapter weights file directly in `folder`, or None."""
    return next((folder / name for name in ADAPTER_WEIGHT_FILES if (folder / name).is_file()), None)


def adapter_subfolders(folder: str | Path) -> list[Path]:
    """Sub-folders holding an adapter (the adapters not named "default"), sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and adapter_file(p) is not None)


def adapter_weights_file(folder: str | Path) -> Path | None:
    """The adapter weights of a checkpoint folder: the top-level file, else the first adapter sub-folder's, or None."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    top = adapter_file(folder)
    if top is not None:
        return top
    subfolders = adapter_subfolders(folder)
    return adapter_file(subfolders[0]) if subfolders else None


def is_adapter_file(path: str | Path) -> bool:
    """Whether `path` is an adapter weights file (then the checkpoint holds a PEFT adapter, not full weights)."""
    return Path(path).name in ADAPTER_WEIGHT_FILES


def weights_file(folder: str | Path) -> Path | None:
    """The weights of a checkpoint folder: full weights (`WEIGHT_FILES`), else a PEFT adapter's; None when there are
    none (the folder is not a complete checkpoint)."""
    folder = Path(folder)
    full = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    return full if full is not None else adapter_weights_file(folder)
