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
from hf_lightning.checkpoint.io import save_model_files

__all__ = ["TRAINING_ARGS_NAME", "save_final_model"]

TRAINING_ARGS_NAME = "training_args.bin"


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
    """
    folder = Path(output_dir)
    # FSDP / ZeRO-3: a collective on every rank; None for a plain model
    full_state = (gather or full_model_state_dict)(model)
    if is_global_zero:
        save_model_files(model, folder, processing_class, state_dict=full_state)
        if args is not None:
            torch.save(args, folder / TRAINING_ARGS_NAME)
    return folder
