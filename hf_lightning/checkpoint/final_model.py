"""The final model save: HF's `Trainer.save_model`, shared by `hf_lightning.Trainer.save_model` and the CLI's `fit`.

Under FSDP2 the parameters are shards: every process takes part in gathering the full weights (a collective), and
the global-zero process writes them with `save_pretrained`, with the tokenizer / processor and `training_args.bin`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hf_lightning.checkpoint.distributed import full_model_state_dict

if TYPE_CHECKING:
    from hf_lightning.checkpoint.content import SavedArguments
from hf_lightning.checkpoint.io import save_model_files, write_file

__all__ = ["TRAINING_ARGS_NAME", "final_save_advice", "save_final_model"]

TRAINING_ARGS_NAME = "training_args.bin"


def final_save_advice(output_dir: str | Path) -> str:
    """What is true after the final save failed for lack of space, and what to do (no folder was removed: the final
    model is written in place, the `checkpoint-<n>` folders are not touched)."""
    return (f"The final model in {str(output_dir)!r} is incomplete; the checkpoint-<n> folders are untouched. Free "
            "some space and save it again (trainer.save_model(), or the same command with --ckpt_path naming the last "
            "checkpoint: nothing is trained again).")


def save_final_model(
    model: nn.Module, output_dir: str | Path, processing_class: Any = None, args: SavedArguments | None = None,
    is_global_zero: bool = True, gather: Callable[[nn.Module], dict[str, Any] | None] | None = None,
) -> Path:
    """Write `model` (and `processing_class`, `args`) to `output_dir`; call it on every process.

    Args:
        model: the trained model, plain or FSDP2-sharded.
        output_dir: the folder (created if needed).
        processing_class: the tokenizer / processor to save next to the weights, or None.
        args: the training arguments, saved as `training_args.bin` (HF's file), or None.
        is_global_zero: whether this process writes (the others only join the gather).
        gather: the collective that returns the full weights (or None: the model's own `state_dict`) for the run's
            strategy (`parallel.checkpoint.gather_full_weights`: FSDP1 and ZeRO-3 need the strategy); default: the
            FSDP2 / plain-model gather.

    Returns:
        The folder.

    Raises:
        CheckpointWriteError: a write failed (for a full disk, saying what is left and what to do).
    """
    folder = Path(output_dir)
    # FSDP / ZeRO-3: a collective on every rank; None for a plain model
    full_state = (gather or full_model_state_dict)(model)
    if is_global_zero:
        advice = final_save_advice(folder)
        save_model_files(model, folder, processing_class, state_dict=full_state, advice=advice)
        if args is not None:
            write_file(folder / TRAINING_ARGS_NAME, lambda path: torch.save(args, path), advice=advice)
    return folder
