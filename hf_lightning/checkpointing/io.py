"""Writing HF-layout checkpoint folders (`<output_dir>/checkpoint-<step>/`), atomically.

A checkpoint is written under `tmp-checkpoint-<step>` and renamed when complete, so a crash never leaves a folder
that resume or rotation would take for a good one. The file set is HF's (T:3355-3422): `save_pretrained` files
(safetensors), tokenizer / processor files, `training_args.bin`, and unless `save_only_model`: `optimizer.pt`,
`scheduler.pt`, `rng_state.pth` (per rank: `rng_state_<rank>.pth`), then `trainer_state.json`.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["CHECKPOINT_PREFIX", "TMP_PREFIX", "rng_state", "save_model_files", "write_checkpoint"]

CHECKPOINT_PREFIX = "checkpoint"
TMP_PREFIX = "tmp-checkpoint"


def save_model_files(model: nn.Module, directory: str | Path, processing_class: Any = None,
                     state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """HF `Trainer._save`: `save_pretrained` for a `PreTrainedModel`, bare safetensors for any other module."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        # save_pretrained empties a state_dict it is given (transformers 5.23): pass a copy.
        model.save_pretrained(directory, state_dict=dict(state_dict) if state_dict is not None else None)
    else:
        from safetensors.torch import save_file

        tensors = state_dict if state_dict is not None else model.state_dict()
        save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors",
                  metadata={"format": "pt"})
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(directory)


def rng_state() -> dict[str, Any]:
    """The RNG states HF stores in `rng_state.pth` (python, numpy, cpu, cuda)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def write_checkpoint(
    output_dir: str | Path,
    step: int,
    model: nn.Module,
    *,
    state: Any,
    args: Any,
    processing_class: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    world_size: int = 1,
    rank: int = 0,
) -> Path:
    """Write `checkpoint-<step>` atomically on one process and return its path (single-process writer).

    An existing folder of the same step (a resumed run saving again) is replaced only once the new one is complete.
    """
    output_dir = Path(output_dir)
    final = output_dir / f"{CHECKPOINT_PREFIX}-{step}"
    tmp = output_dir / f"{TMP_PREFIX}-{step}"
    if tmp.exists():
        shutil.rmtree(tmp)  # leftover of a crashed save: never a valid checkpoint
    save_model_files(model, tmp, processing_class)
    torch.save(args, tmp / "training_args.bin")
    if not getattr(args, "save_only_model", False):
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        name = "rng_state.pth" if world_size <= 1 else f"rng_state_{rank}.pth"
        torch.save(rng_state(), tmp / name)
    state.save_to_json(str(tmp / "trainer_state.json"))
    if final.exists():
        old = output_dir / f"{TMP_PREFIX}-{step}-old"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    return final
