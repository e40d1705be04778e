"""What one process writes into a checkpoint folder, captured at the save step, and writing it.

A synchronous save captures references (`copy=False`) and writes them at once. A background save
(`save_async=True`) captures copies in CPU memory (`copy=True`): the weights (tensors that share storage stay shared,
so tied weights are saved as `save_pretrained` would save them), the optimizer and scheduler states, the RNG states,
the Lightning loop state, the stream position and the `TrainerState`, so that training can change the live objects
while another thread writes. Both write the same files with the same functions (`write_content`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import TrainerState

from hf_lightning.checkpoint.io import (
    LIGHTNING_STATE_NAME,
    TRAINER_STATE_NAME,
    rng_file_name,
    save_model_files,
    torch_save,
    write_file,
)
from hf_lightning.checkpoint.layout import fsync_file
from hf_lightning.checkpoint.stream_position import stream_position_name, write_stream_position

if TYPE_CHECKING:
    from typing import TypeAlias

    import transformers

    from hf_lightning.args import TrainingArguments

    SavedArguments: TypeAlias = "TrainingArguments | transformers.TrainingArguments"
    """What `training_args.bin` holds: the arguments object the user passed (ours, or HF's with
    `use_as_transformers_trainer`)."""

__all__ = ["CheckpointContent", "StreamPosition", "cpu_copy", "write_content", "write_rng_file"]


@dataclass(frozen=True)
class StreamPosition:
    """This process's position in an unsized train stream after `windows_done` updates of pass `epoch`."""

    position: Any
    epoch: int
    windows_done: int


@dataclass
class CheckpointContent:
    """The files of one process's share of `checkpoint-<step>` (rank 0's fields are None on the other ranks).

    Attributes:
        world_size: processes writing the folder.
        rank: this process.
        model: rank 0: the model (its `save_pretrained` writes the config and weights), else None (also on rank 0
            when an overridden `Trainer.save_model` wrote the model files and `training_args.bin`).
        model_state: rank 0: the weights to write (a CPU copy, or the FSDP2-gathered state), None for the model's own.
        processing_class: rank 0: the tokenizer / processor, or None.
        args: rank 0: the training arguments (`training_args.bin`, written with the model files).
        optimizer: rank 0: the optimizer's `state_dict()` (None: no `optimizer.pt`).
        scheduler: rank 0: the scheduler's `state_dict()`.
        scaler: rank 0: the grad scaler's `state_dict()` (fp16).
        lightning_state: rank 0: `lightning_state.pt`'s content.
        trainer_state: rank 0: the `TrainerState` to write as `trainer_state.json`.
        rng: this process's RNG states (None with `save_only_model`).
        stream: this process's stream position, or None.
    """

    world_size: int
    rank: int
    model: nn.Module | None = None
    model_state: dict[str, torch.Tensor] | None = None
    processing_class: Any = None
    args: SavedArguments | None = None
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    scaler: dict[str, Any] | None = None
    lightning_state: dict[str, Any] | None = None
    trainer_state: TrainerState | None = None
    rng: dict[str, Any] | None = None
    stream: StreamPosition | None = None

    @property
    def is_zero(self) -> bool:
        return self.rank == 0


def cpu_copy(value: Any, memo: dict[int, torch.UntypedStorage] | None = None) -> Any:
    """`value` with every tensor copied to CPU memory (nested dicts, lists and tuples rebuilt, anything else deep
    copied). Each storage is copied once and tensors keep their views into it, so tensors that share memory (tied
    weights) still share it in the copy (`memo`: storage address -> its copy)."""
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address not in memo:
            memo[address] = storage.cpu() if tensor.device.type != "cpu" else storage.clone()
        return torch.empty(0, dtype=tensor.dtype).set_(memo[address], tensor.storage_offset(), tensor.size(),
                                                       tensor.stride())
    if isinstance(value, dict):
        return type(value)((k, cpu_copy(v, memo)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(v, memo) for v in value)
    return copy.deepcopy(value)


def write_rng_file(folder: Path, states: dict[str, Any] | None, world_size: int, rank: int) -> None:
    """This process's RNG file (`rng_state.pth`, or `rng_state_<rank>.pth` under several processes)."""
    torch_save(states, folder / rng_file_name(world_size, rank))


def write_content(content: CheckpointContent, folder: Path, save_only_model: bool, durable: bool) -> None:
    """Write this process's files of the checkpoint into `folder` (which exists).

    Rank 0: the model files, `training_args.bin`, the optimizer / scheduler / scaler / Lightning state files and
    `trainer_state.json` last; every rank: its RNG file and stream position. With `durable`, the files of the other
    ranks are flushed here (rank 0 flushes the whole folder before the rename, `io.finalize_checkpoint`).
    """
    world, rank = content.world_size, content.rank
    if content.model is not None:  # rank 0, unless an overridden `save_model` wrote the model files
        save_model_files(content.model, folder, content.processing_class, state_dict=content.model_state)
        torch_save(content.args, folder / "training_args.bin")
    if not save_only_model:
        if content.is_zero:
            for name, state in (("optimizer.pt", content.optimizer), ("scheduler.pt", content.scheduler),
                                ("scaler.pt", content.scaler), (LIGHTNING_STATE_NAME, content.lightning_state)):
                if state is not None:
                    torch_save(state, folder / name)
        write_rng_file(folder, content.rng, world, rank)
        written = [rng_file_name(world, rank)]
        if content.stream is not None:
            stream = content.stream
            write_stream_position(folder, stream.position, stream.epoch, stream.windows_done, world, rank)
            written.append(stream_position_name(world, rank))
        if not content.is_zero and durable:
            for name in written:
                fsync_file(folder / name)
    trainer_state = content.trainer_state
    if content.is_zero and trainer_state is not None:
        write_file(folder / TRAINER_STATE_NAME, lambda path: trainer_state.save_to_json(str(path)))
