"""`CheckpointSaver`: the run's hold on `output_dir`, what happens at an HF save and at training end (best-metric
tracking: `best_model.py`).

- `begin_run` / `end_run` bracket a `fit`: rank 0 takes the output-directory lock (`checkpointing/run_lock.py`),
  removes what killed runs left behind (`checkpointing/folders.py`), and every rank learns the run id that names
  this run's temporary folders.
- `save` is `Trainer._save_checkpoint` (T:3355-3422): point `best_model_checkpoint` at
  `checkpoint-<best_global_step>` if that folder exists, write `tmp-checkpoint-<step>-<run>` (rank 0 the shared
  files, every rank its RNG file, all ranks the FSDP2 collectives), check, flush and rename it on rank 0 once all
  ranks are done, then rotate with HF's rule on rank 0 after a barrier. Rotation deletes by renaming first.
- `finish` applies the `save_total_limit == 1` cleanup.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from hf_lightning._lightning_compat import grad_scaler
from hf_lightning.args import TrainingArguments
from hf_lightning.checkpointing import distributed as dist_state
from hf_lightning.checkpointing.checks import output_dir_problem
from hf_lightning.checkpointing.folders import (
    clean_leftovers,
    fsync_file,
    list_checkpoints,
    remove_checkpoint,
    tmp_folder,
)
from hf_lightning.checkpointing.io import (
    CHECKPOINT_PREFIX,
    SHARDED_OPTIMIZER_DIR,
    TRAINER_STATE_NAME,
    CheckpointWriteError,
    finalize_checkpoint,
    prepare_tmp_folder,
    rng_file_name,
    save_model_files,
    torch_save,
    write_file,
    write_rng_state,
    write_training_files,
)
from hf_lightning.checkpointing.lightning_state import capture_lightning_state, epoch_geometry
from hf_lightning.checkpointing.rotation import final_cleanup, select_for_deletion
from hf_lightning.checkpointing.run_lock import RunLock
from hf_lightning.contracts import flow_model
from hf_lightning.hf_messages import logger as log
from hf_lightning.parallel.checkpoint import gather_full_weights, optimizer_shard_owner, save_engine_state

__all__ = ["CheckpointSaver", "export_callback_states", "list_checkpoints"]


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
        self.saved_args: Any = None
        """What `training_args.bin` holds: the arguments object the user passed (a `transformers.TrainingArguments`
        stays one); None: `args`."""
        self.lock: RunLock | None = None
        self.run: str | None = None
        """This run's id (every rank): names its temporary folders; None outside `begin_run` / `end_run`."""
        self.durable = True
        """Flush files and folders before renaming a checkpoint into place (False only to measure the cost)."""
        self.save_model: Callable[[str], None] | None = None
        """Writes a checkpoint's model files into the folder it is given, on every process (an overridden
        `Trainer.save_model`, called with `_internal_call=True`, as HF's `_save_checkpoint` does); None: built in."""

    @property
    def output_dir(self) -> str:
        return self.args.resolved_output_dir

    def begin_run(self, trainer: pl.Trainer) -> None:
        """Take the output-directory lock and clean leftovers on rank 0; share the run id with every rank.

        Raises:
            ValueError: nothing can be written to `output_dir` (`checks.output_dir_problem`), on every rank.
            OutputDirLocked: another run uses `output_dir` (raised on every rank, naming it).
        """
        outcome: tuple[str | None, type[Exception] | None, str] = (None, None, "")
        failure: Exception | None = None
        if trainer.is_global_zero:
            try:
                problem = output_dir_problem(self.output_dir)
                if problem is not None:
                    raise ValueError(problem)
                self.lock = RunLock.acquire(self.output_dir)
                clean_leftovers(self.output_dir)
                outcome = (self.lock.run, None, "")
            except Exception as err:  # every rank must leave the broadcast below, then fail the same way
                failure, outcome = err, (None, type(err), str(err))
        run, error, message = trainer.strategy.broadcast(outcome, src=0)
        if failure is not None:
            raise failure
        if error is not None:
            raise error(message)
        self.run = run

    def end_run(self, trainer: pl.Trainer | None = None) -> None:
        """Give the lock back (rank 0; idempotent, also after an exception)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        self.run = None

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
                remove_checkpoint(path, self._run_id())
        trainer.strategy.barrier("hf_lightning_rotate")

    def _run_id(self) -> str:
        if self.run is None:
            raise RuntimeError("CheckpointSaver: saving outside a run; call begin_run(trainer) first (HFTrainerFlow "
                               "does it when fit starts).")
        return self.run

    def _write(self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: Any, step: int,
               epoch_ending: bool = False, skip_callbacks: Sequence[Any] = ()) -> None:
        """Write `tmp-checkpoint-<step>-<run>` from every rank, then rename it on rank 0 once all ranks are done.

        Rank 0 writes the shared files, every rank its own RNG file; under FSDP the full weights are gathered and
        the optimizer shards written by all ranks, under DeepSpeed the engine's checkpoint (collectives,
        `parallel/checkpoint.py`). Only the rename makes the folder a checkpoint. A failed write (e.g. a full disk)
        removes the unfinished folder and raises `CheckpointWriteError`.
        """
        run = self._run_id()
        tmp = tmp_folder(self.output_dir, step, run)
        try:
            self._write_files(trainer, pl_module, state, step, tmp, epoch_ending, skip_callbacks)
        except CheckpointWriteError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if trainer.is_global_zero:
            finalize_checkpoint(self.output_dir, step, run, self.lock.check_held if self.lock else None,
                                durable=self.durable)

    def _write_files(self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: Any, step: int, tmp: Path,
                     epoch_ending: bool, skip_callbacks: Sequence[Any]) -> None:
        model = flow_model(pl_module)
        world, rank, zero = trainer.world_size, trainer.global_rank, trainer.is_global_zero
        strategy = trainer.strategy
        if zero:
            prepare_tmp_folder(self.output_dir, state.global_step, self._run_id())
        strategy.barrier("hf_lightning_save_begin")
        if zero:
            step = state.global_step
            log.info(f"Saving model checkpoint to {self.output_dir}/{CHECKPOINT_PREFIX}-{step}")  # HF's message
        if self.save_model is not None:
            self.save_model(str(tmp))  # every rank, as HF's `_save_checkpoint` calls `save_model`
        else:
            full_state = gather_full_weights(strategy, model)  # collective under FSDP / ZeRO-3, None otherwise
            if zero:
                save_model_files(model, tmp, self.processing_class, state_dict=full_state)
                torch_save(self.saved_args if self.saved_args is not None else self.args, tmp / "training_args.bin")
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
                    lightning_state=capture_lightning_state(trainer, epoch_ending, skip_callbacks,
                                                            geometry=epoch_geometry(trainer, self.args)),
                )
            write_rng_state(tmp, world, rank)
            if not zero and self.durable:  # rank 0 flushes the whole folder; on a multi-node file system each
                fsync_file(tmp / rng_file_name(world, rank))  # rank flushes the file it wrote itself
        if zero:
            write_file(tmp / TRAINER_STATE_NAME, lambda path: state.save_to_json(str(path)))
        strategy.barrier("hf_lightning_save_written")

    def finish(self, trainer: pl.Trainer, state: Any) -> None:
        """At the end of training: HF's `save_total_limit == 1` cleanup (T:2004-2011), on rank 0."""
        best = state.best_model_checkpoint
        if trainer.is_global_zero and self.args.save_strategy != "no":
            for path in final_cleanup(list_checkpoints(self.output_dir), best, self.args.save_total_limit):
                log.info(f"Deleting older checkpoint [{path}] due to args.save_total_limit")  # HF's message
                remove_checkpoint(path, self._run_id())
        trainer.strategy.barrier("hf_lightning_finish")
