"""Writing HF-layout checkpoint folders (`<output_dir>/checkpoint-<step>/`), atomically and durably.

A checkpoint is written under `tmp-checkpoint-<step>-<run>` (unique to the run holding the output-directory lock) and
renamed when complete, so a crash never leaves a folder that resume or rotation would take for a good one (both only
look at `checkpoint-<n>` names, see `folders.py`). Before the rename the folder is checked (its files are there, the
lock still names this run) and flushed to disk. The file set is HF's (T:3363-3430): `save_pretrained` files
(safetensors), tokenizer / processor files, `training_args.bin`, and unless `save_only_model`: `optimizer.pt`,
`scheduler.pt`, `scaler.pt` (fp16), `rng_state.pth` (per rank under DDP: `rng_state_<rank>.pth`), then
`trainer_state.json`. hf_lightning adds `lightning_state.pt` (Lightning loop position and Lightning callback states,
a few KB; never the weights), `checkpoint_manifest.json` (every file's size and checksum, `manifest.py`) and, under
FSDP2, `optimizer_sharded/` (a `torch.distributed.checkpoint` folder)
instead of `optimizer.pt`.

A write that fails for lack of space raises `CheckpointWriteError` naming the file and the free space; the
unfinished folder is removed by the caller and the earlier checkpoints are untouched.

The writer is split into steps so that several processes can share one folder: rank 0 prepares and finalises, each
rank writes its own RNG file in between (see `checkpoint/write.py`).
"""

from __future__ import annotations

import errno
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers.utils import logging as hf_logging

from hf_lightning.checkpoint.layout import (
    CHECKPOINT_PREFIX,
    TMP_PREFIX,
    fsync_tree,
    replace_checkpoint,
    tmp_folder,
)
from hf_lightning.checkpoint.manifest import write_manifest
from hf_lightning.checkpoint.permissions import apply_umask
from hf_lightning.checkpoint.weight_files import weights_file

__all__ = [
    "CHECKPOINT_PREFIX", "TMP_PREFIX", "LIGHTNING_STATE_NAME", "SHARDED_OPTIMIZER_DIR", "TRAINER_STATE_NAME",
    "CHECKPOINT_ADVICE", "CheckpointWriteError", "finalize_checkpoint", "prepare_tmp_folder", "quiet_save_progress",
    "rng_file_name",
    "rng_state", "torch_save", "save_model_files", "write_file",
]

TRAINER_STATE_NAME = "trainer_state.json"
LIGHTNING_STATE_NAME = "lightning_state.pt"
SHARDED_OPTIMIZER_DIR = "optimizer_sharded"
_LOW_SPACE = 16 * 2**20  # bytes: below this a failed write is reported as a full disk


class CheckpointWriteError(OSError):
    """Writing a checkpoint file failed (the message names the file and the cause, e.g. a full disk)."""


def _disk_full(error: BaseException, path: Path) -> bool:
    """Whether `error` while writing `path` comes from a full disk. `torch.save` reports ENOSPC as a bare
    `RuntimeError("... unexpected pos 64 vs 0")`, so the free space is checked as well."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if "No space left on device" in str(error) or "os error 28" in str(error):
        return True
    try:
        return shutil.disk_usage(path.parent).free < _LOW_SPACE
    except OSError:
        return False


CHECKPOINT_ADVICE = ("The unfinished folder is removed and earlier checkpoints are intact; free some space (or lower "
                     "save_total_limit, or use save_only_model=True) and resume with resume_from_checkpoint=True.")
"""What to do after a checkpoint save failed for lack of space (the unfinished folder is removed by the saver)."""


def write_file(path: str | Path, writer: Callable[[Path], Any], what: str | None = None,
               advice: str = CHECKPOINT_ADVICE) -> None:
    """Run `writer(path)`; an I/O failure becomes `CheckpointWriteError` naming the file and, for a full disk, saying
    so (other exceptions pass unchanged).

    `what` describes several files written by one call (e.g. `save_pretrained`); the failing file is named when the
    error carries it. `advice`: what is true afterwards and what to do, for a full disk (a checkpoint's by default).

    Raises:
        CheckpointWriteError: the write failed (`errno` ENOSPC for a full disk).
    """
    path = Path(path)
    try:
        writer(path)
    except Exception as error:
        failing = getattr(error, "filename", None)
        what = f"the checkpoint file {failing}" if failing else (what or f"the checkpoint file {path}")
        if not _disk_full(error, path):
            if not isinstance(error, OSError):
                raise  # not an I/O failure (e.g. an object that cannot be pickled): unchanged
            raise CheckpointWriteError(f"Writing {what} failed: {type(error).__name__}: {error}") from error
        try:
            free = f"{shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free"
        except OSError:
            free = "free space unknown"
        raise CheckpointWriteError(
            errno.ENOSPC,
            f"No space left on device while writing {what} ({free} on that filesystem; "
            f"{type(error).__name__}: {error}). {advice}",
        ) from error


def torch_save(obj: Any, path: Path, advice: str = CHECKPOINT_ADVICE) -> None:
    """`torch.save(obj, path)`; a failure names the file (`write_file`, with `advice` for a full disk)."""

    def save(target: Path) -> None:
        # our own file object: closed even when `torch.save` fails, so a failed file's space is freed once it is
        # removed (a path would leave the descriptor open in torch's writer, referenced by the traceback)
        with open(target, "wb") as f:
            torch.save(obj, f)

    write_file(path, save, advice=advice)


def save_model_files(model: nn.Module, directory: str | Path, processing_class: Any = None,
                     state_dict: dict[str, Any] | None = None, advice: str = CHECKPOINT_ADVICE) -> None:
    """HF `Trainer._save`: `save_pretrained` for a `PreTrainedModel`, bare safetensors for any other module."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_pretrained = getattr(model, "save_pretrained", None)  # a PreTrainedModel's (or a PEFT model's)
    if callable(save_pretrained):
        # save_pretrained empties a state_dict it is given (transformers 5.23): pass a copy. Its "Writing model
        # shards" bar would break into the training bar at every save.
        copy = dict(state_dict) if state_dict is not None else None
        with quiet_save_progress():
            write_file(directory / "model.safetensors", lambda _: save_pretrained(directory, state_dict=copy),
                       what=f"the model files (save_pretrained) of {directory}", advice=advice)
    else:
        from safetensors.torch import save_file

        tensors = state_dict if state_dict is not None else model.state_dict()
        write_file(directory / "model.safetensors",
                   lambda path: save_file({k: v.contiguous() for k, v in tensors.items()}, path,
                                          metadata={"format": "pt"}), advice=advice)
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        write_file(directory, lambda _: processing_class.save_pretrained(directory),
                   what=f"the tokenizer / processor files of {directory}", advice=advice)
    apply_umask(directory)  # safetensors writes 0600 whatever the umask (checkpoint/permissions.py)


@contextmanager
def quiet_save_progress() -> Iterator[None]:
    """Switch transformers' progress bars off while model files are written (restored afterwards; `console.py`)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def rng_state(distributed: bool = False) -> dict[str, Any]:
    """The RNG states HF stores in `rng_state.pth` (python, numpy, cpu, cuda), in HF's format (T:3470-3506)."""
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


def prepare_tmp_folder(output_dir: str | Path, step: int, run: str) -> Path:
    """Create an empty `tmp-checkpoint-<step>-<run>` (this run's own earlier failed attempt is removed)."""
    tmp = tmp_folder(output_dir, step, run)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def finalize_checkpoint(output_dir: str | Path, step: int, run: str, check_held: Callable[[], None] | None = None,
                        durable: bool = True, manifest: bool = True) -> Path:
    """Check, list, flush and rename the complete `tmp-checkpoint-<step>-<run>` to `checkpoint-<step>`; return the
    path.

    The manifest (`manifest.py`: every file's size and checksum) is written after every file exists and before the
    flush, so a `checkpoint-<n>` without a valid one was not written by this function.

    `check_held` raises when this run no longer holds the output-directory lock (the rename would put a folder
    among another run's). An existing folder of the same step (a resumed run saving again) is replaced
    (`folders.replace_checkpoint`). `durable=False` skips the flushes, `manifest=False` the manifest (measuring
    their cost only: bench/bench_checkpoint_save.py).

    Raises:
        FileNotFoundError: the temporary folder is missing or lacks its weights (the model's or a PEFT adapter's)
            or `trainer_state.json`.
    """
    output_dir = Path(output_dir)
    tmp = tmp_folder(output_dir, step, run)
    missing = [name for name in (TRAINER_STATE_NAME,) if not (tmp / name).is_file()]
    if weights_file(tmp) is None:  # a PEFT model's checkpoint holds its adapter instead (weight_files.py)
        missing.append("model.safetensors")
    if not tmp.is_dir() or missing:
        raise FileNotFoundError(f"The checkpoint folder {tmp} is {'missing' if not tmp.is_dir() else 'incomplete'}"
                                f"{f' (no {missing})' if tmp.is_dir() else ''}; it is not renamed to "
                                f"{CHECKPOINT_PREFIX}-{step}.")
    if check_held is not None:
        check_held()
    def list_files() -> None:
        write_manifest(tmp, step)

    if durable:  # the checksums are computed while the device stores the files (`fsync_tree`)
        fsync_tree(tmp, during=list_files if manifest else None)
    elif manifest:
        list_files()
    final = output_dir / f"{CHECKPOINT_PREFIX}-{step}"
    replace_checkpoint(tmp, final, run)
    return final


