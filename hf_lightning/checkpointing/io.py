"""Writing HF-layout checkpoint folders (`<output_dir>/checkpoint-<step>/`), atomically.

A checkpoint is written under `tmp-checkpoint-<step>` and renamed when complete, so a crash never leaves a folder
that resume or rotation would take for a good one (both only look at `checkpoint-<n>` names). The file set is HF's
(T:3355-3422): `save_pretrained` files (safetensors), tokenizer / processor files, `training_args.bin`, and unless
`save_only_model`: `optimizer.pt`, `scheduler.pt`, `scaler.pt` (fp16), `rng_state.pth` (per rank under DDP:
`rng_state_<rank>.pth`), then `trainer_state.json`. hf_lightning adds `lightning_state.pt` (Lightning loop position
and Lightning callback states, a few KB; never the weights) and, under FSDP2, `optimizer_sharded/` (a
`torch.distributed.checkpoint` folder) instead of `optimizer.pt`.

The writer is split into steps so that several processes can share one folder: rank 0 prepares and finalises, each
rank writes its own RNG file in between (see `callbacks/checkpoint_saver.py`). `write_checkpoint` runs all steps in one process.
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

__all__ = [
    "CHECKPOINT_PREFIX", "TMP_PREFIX", "LIGHTNING_STATE_NAME", "SHARDED_OPTIMIZER_DIR", "TRAINER_STATE_NAME",
    "finalize_checkpoint", "prepare_tmp_folder", "recover_interrupted_replacements", "rng_file_name", "rng_state",
    "save_model_files", "write_checkpoint", "write_rng_state", "write_training_files",
]

CHECKPOINT_PREFIX = "checkpoint"
TMP_PREFIX = "tmp-checkpoint"
TRAINER_STATE_NAME = "trainer_state.json"
LIGHTNING_STATE_NAME = "lightning_state.pt"
SHARDED_OPTIMIZER_DIR = "optimizer_sharded"
_OLD_SUFFIX = "-old"


def save_model_files(model: nn.Module, directory: str | Path, processing_class: Any = None,
                     state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """HF `Trainer._save`: `save_pretrained` for a `PreTrainedModel`, bare safetensors for any other module."""
    from hf_lightning.console import quiet_save_progress

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):
        # save_pretrained empties a state_dict it is given (transformers 5.23): pass a copy. Its "Writing model
        # shards" bar would break into the training bar at every save.
        with quiet_save_progress():
            model.save_pretrained(directory, state_dict=dict(state_dict) if state_dict is not None else None)
    else:
        from safetensors.torch import save_file

        tensors = state_dict if state_dict is not None else model.state_dict()
        save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors",
                  metadata={"format": "pt"})
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(directory)
    from hf_lightning.checkpointing.permissions import apply_umask

    apply_umask(directory)  # safetensors writes 0600 whatever the umask (checkpointing/permissions.py)


def rng_state(distributed: bool = False) -> dict[str, Any]:
    """The RNG states HF stores in `rng_state.pth` (python, numpy, cpu, cuda), in HF's format (T:3462-3498)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.random.get_rng_state_all() if distributed else torch.cuda.random.get_rng_state()
    return state


def rng_file_name(world_size: int, rank: int) -> str:
    """HF's name: `rng_state.pth` for one process, `rng_state_<rank>.pth` under distributed training."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{rank}.pth"


def prepare_tmp_folder(output_dir: str | Path, step: int) -> Path:
    """Create an empty `tmp-checkpoint-<step>` (a leftover of a crashed save is removed: it was never valid)."""
    tmp = Path(output_dir) / f"{TMP_PREFIX}-{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def write_rng_state(folder: str | Path, world_size: int = 1, rank: int = 0) -> None:
    """This process's RNG file."""
    torch.save(rng_state(world_size > 1), Path(folder) / rng_file_name(world_size, rank))


def write_training_files(folder: str | Path, *, optimizer: Any = None, scheduler: Any = None, scaler: Any = None,
                         lightning_state: dict[str, Any] | None = None) -> None:
    """The shared resume files (rank 0): `optimizer.pt`, `scheduler.pt`, `scaler.pt`, `lightning_state.pt`."""
    folder = Path(folder)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    if scheduler is not None:
        torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    if scaler is not None:
        torch.save(scaler.state_dict(), folder / "scaler.pt")
    if lightning_state is not None:
        torch.save(lightning_state, folder / LIGHTNING_STATE_NAME)


def finalize_checkpoint(output_dir: str | Path, step: int) -> Path:
    """Rename the complete `tmp-checkpoint-<step>` to `checkpoint-<step>` and return the final path.

    An existing folder of the same step (a resumed run saving again) is moved aside first and deleted only once the
    new one is in place; `recover_interrupted_replacements` puts it back if the process dies in between.
    """
    output_dir = Path(output_dir)
    final = output_dir / f"{CHECKPOINT_PREFIX}-{step}"
    tmp = output_dir / f"{TMP_PREFIX}-{step}"
    if final.exists():
        old = output_dir / f"{TMP_PREFIX}-{step}{_OLD_SUFFIX}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    return final


def recover_interrupted_replacements(output_dir: str | Path) -> list[Path]:
    """Undo a replacement cut short between its two renames: `tmp-checkpoint-<n>-old` becomes `checkpoint-<n>` again
    when no `checkpoint-<n>` exists. Returns the folders recovered."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    recovered = []
    for old in root.glob(f"{TMP_PREFIX}-*{_OLD_SUFFIX}"):
        step = old.name[len(TMP_PREFIX) + 1 : -len(_OLD_SUFFIX)]
        final = root / f"{CHECKPOINT_PREFIX}-{step}"
        if step.isdigit() and old.is_dir() and not final.exists():
            try:
                os.replace(old, final)
            except FileNotFoundError:  # another process of the same run recovered it first
                continue
            recovered.append(final)
    return recovered


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
    scaler: Any = None,
    lightning_state: dict[str, Any] | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write `checkpoint-<step>` atomically from one process and return its path."""
    tmp = prepare_tmp_folder(output_dir, step)
    save_model_files(model, tmp, processing_class, state_dict=state_dict)
    torch.save(args, tmp / "training_args.bin")
    if not getattr(args, "save_only_model", False):
        write_training_files(tmp, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                             lightning_state=lightning_state)
        write_rng_state(tmp)
    state.save_to_json(str(tmp / TRAINER_STATE_NAME))
    return finalize_checkpoint(output_dir, step)
