"""The position of an unsized train stream in a checkpoint: `stream_position.pt` (`stream_position_<rank>.pt` under
several processes), one file per process like HF's RNG files, since each process reads its own part of the stream.

The file holds `{"format", "epoch", "windows_done", "world_size", "position"}`: the `StatefulDataLoader` position after
`windows_done` updates of pass `epoch`, in plain containers (`data/stream_state.to_plain`), loaded with
`weights_only=True`. `transformers.Trainer` ignores the file (it resumes such a stream by reading).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hf_lightning.checkpoint.io import torch_save

__all__ = ["read_stream_position", "stream_position_name", "write_stream_position"]

FORMAT = 1


def stream_position_name(world_size: int, rank: int) -> str:
    """`stream_position.pt` for one process, `stream_position_<rank>.pt` under several (as HF names RNG files)."""
    return "stream_position.pt" if world_size <= 1 else f"stream_position_{rank}.pt"


def write_stream_position(folder: str | Path, position: Any, epoch: int, windows_done: int, world_size: int = 1,
                          rank: int = 0) -> None:
    """This process's stream position after `windows_done` updates of pass `epoch` (plain containers only)."""
    record = {"format": FORMAT, "epoch": epoch, "windows_done": windows_done, "world_size": world_size,
              "position": position}
    torch_save(record, Path(folder) / stream_position_name(world_size, rank))


def read_stream_position(folder: str | Path, epoch: int, windows_done: int, world_size: int = 1, rank: int = 0
                         ) -> Any:
    """The saved position of this process for the resumed point, or None when the checkpoint has none for it (written
    by `transformers.Trainer`, for a stream without a state, by another number of processes, or at another point).

    Raises:
        ValueError: the file exists but cannot be loaded safely (it names the file and the reason).
    """
    path = Path(folder) / stream_position_name(world_size, rank)
    if not path.is_file():
        return None
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # the unpickler's errors have no common type
        raise ValueError(
            f"{path}: the saved position of the training stream cannot be loaded with weights_only=True ({error}). "
            "A dataset's state_dict() must return plain Python containers, numbers, strings, bytes and tensors."
        ) from error
    if (record.get("epoch"), record.get("windows_done"), record.get("world_size")) != (epoch, windows_done, world_size):
        return None
    return record["position"]
