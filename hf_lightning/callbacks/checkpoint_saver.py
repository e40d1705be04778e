"""`CheckpointSaver`: what happens at an HF save and at training end (best-metric tracking: `best_model.py`).

- `save` is `Trainer._save_checkpoint` (T:3355-3422): point `best_model_checkpoint` at
  `checkpoint-<best_global_step>` if that folder exists, write `tmp-checkpoint-<step>` (rank 0 the shared files,
  every rank its RNG file, all ranks the FSDP2 collectives), rename it on rank 0 once all ranks are done, then
  rotate with HF's rule on rank 0 after a barrier.
- `finish` applies the `save_total_limit == 1` cleanup.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from hf_lightning._lightning_compat import grad_scaler
from hf_lightning.args import TrainingArguments
from hf_lightning.checkpointing import distributed as dist_state
from hf_lightning.checkpointing.io import (
    CHECKPOINT_PREFIX,
    SHARDED_OPTIMIZER_DIR,
    TMP_PREFIX,
    TRAINER_STATE_NAME,
    finalize_checkpoint,
    prepare_tmp_folder,
    save_model_files,
    write_rng_state,
    write_training_files,
)
from hf_lightning.checkpointing.lightning_state import capture_lightning_state
from hf_lightning.checkpointing.rotation import CheckpointInfo, final_cleanup, parse_step, select_for_deletion
from hf_lightning.contracts import flow_model
from hf_lightning.parallel.checkpoint import gather_full_weights, optimizer_shard_owner, save_engine_state

__all__ = ["CheckpointSaver", "export_callback_states", "list_checkpoints"]


def list_checkpoints(output_dir: str | Path) -> list[CheckpointInfo]:
    """The `checkpoint-*` folders of `output_dir` (temporary, incomplete folders never match)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    return [
        CheckpointInfo(str(p), parse_step(p.name), p.stat().st_mtime)
        for p in root.glob(f"{CHECKPOINT_PREFIX}-*")
        if p.is_dir()
    ]


def export_callback_states(state: Any, exportable: Sequence[Any]) -> None:
    """Store each `ExportableState`'s `state()` in `state.stateful_callbacks` (T:3399-3407), before writing JSON."""
    from transformers.trainer_callback import ExportableState

    for callback in exportable:
        if not isinstance(callback, ExportableState):
            continue
        name = type(callback).__name__
        if isinstance(state.stateful_callbacks.get(name), list):
            state.stateful_callbacks[name].append(callback.state())
        else:
            state.stateful_callbacks[name] = callback.state()


class CheckpointSaver:
    """Checkpoint writing and rotation for `HFTrainerFlow`.

    Args:
        args: the training arguments.
        processing_class: tokenizer / processor saved in every checkpoint.
    """

    def __init__(self, args: TrainingArguments, processing_class: Any = None) -> None:
        self.args = args
        self.processing_class = processing_class

    @property
    def output_dir(self) -> str:
        return self.args.resolved_output_dir

    def save(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: Any, exportable: Sequence[Any] = (),
        epoch_ending: bool = False, skip_callbacks: Sequence[Any] = (),
    ) -> None:
        """`_save_checkpoint`: write `checkpoint-<global_step>` on rank 0, move the best pointer, rotate.

        `exportable`: HF callbacks (and the `TrainerControl`) whose `ExportableState` goes into `trainer_state.json`.
        `epoch_ending`: the epoch ends after this update although batches remain (`should_epoch_stop`).
        `skip_callbacks`: Lightning callbacks whose state is not stored in `lightning_state.pt` (the flow's own state
        is `trainer_state.json`).
        """
        step = state.global_step
        if self.args.save_strategy in ("steps", "epoch", "best") and state.best_global_step:
            best = os.path.join(self.output_dir, f"{CHECKPOINT_PREFIX}-{state.best_global_step}")
            if os.path.exists(best) or state.best_global_step == step:
                state.best_model_checkpoint = best
        export_callback_states(state, exportable)
        self._write(trainer, pl_module, state, step, epoch_ending, skip_callbacks)
        trainer.strategy.barrier("hf_lightning_save")
        if trainer.is_global_zero:
            doomed = select_for_deletion(list_checkpoints(self.output_dir), self.args.save_total_limit,
                                         state.best_model_checkpoint)
            for path in doomed:
                shutil.rmtree(path, ignore_errors=True)
        trainer.strategy.barrier("hf_lightning_rotate")

    def _write(self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: Any, step: int,
               epoch_ending: bool = False, skip_callbacks: Sequence[Any] = ()) -> None:
        """Write `tmp-checkpoint-<step>` from every rank, then rename it on rank 0 once all ranks are done.

        Rank 0 writes the shared files, every rank its own RNG file; under FSDP the full weights are gathered and
        the optimizer shards written by all ranks, under DeepSpeed the engine's checkpoint (collectives,
        `parallel/checkpoint.py`). Only the rename makes the folder a checkpoint.
        """
        import torch

        model = flow_model(pl_module)
        world, rank, zero = trainer.world_size, trainer.global_rank, trainer.is_global_zero
        strategy = trainer.strategy
        tmp = Path(self.output_dir) / f"{TMP_PREFIX}-{step}"
        if zero:
            prepare_tmp_folder(self.output_dir, step)
        strategy.barrier("hf_lightning_save_begin")
        full_state = gather_full_weights(strategy, model)  # collective under FSDP / ZeRO-3, None otherwise
        if zero:
            save_model_files(model, tmp, self.processing_class, state_dict=full_state)
            torch.save(self.args, tmp / "training_args.bin")
        if not self.args.save_only_model:
            optimizer = trainer.optimizers[0] if trainer.optimizers else None
            optimizer = getattr(optimizer, "optimizer", optimizer)
            owner = optimizer_shard_owner(strategy, model)
            if owner is not None and optimizer is not None:
                dist_state.save_sharded_optimizer(owner, optimizer, tmp / SHARDED_OPTIMIZER_DIR)
            engine = save_engine_state(strategy, tmp, step)  # DeepSpeed: optimizer and master weights
            if zero:
                scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
                write_training_files(
                    tmp, optimizer=None if owner is not None or engine else optimizer, scheduler=scheduler,
                    scaler=grad_scaler(trainer),
                    lightning_state=capture_lightning_state(trainer, epoch_ending, skip_callbacks),
                )
            write_rng_state(tmp, world, rank)
        if zero:
            state.save_to_json(str(tmp / TRAINER_STATE_NAME))
        strategy.barrier("hf_lightning_save_written")
        if zero:
            finalize_checkpoint(self.output_dir, step)

    def finish(self, trainer: pl.Trainer, state: Any) -> None:
        """At the end of training: HF's `save_total_limit == 1` cleanup (T:2004-2011), on rank 0."""
        best = state.best_model_checkpoint
        if trainer.is_global_zero and self.args.save_strategy != "no":
            for path in final_cleanup(list_checkpoints(self.output_dir), best, self.args.save_total_limit):
                shutil.rmtree(path, ignore_errors=True)
        trainer.strategy.barrier("hf_lightning_finish")
