"""`CheckpointSaver`: the run's hold on `output_dir`, what happens at an HF save and at training end (driven by
`lifecycle.Checkpoints`; best-metric tracking: `best.py`; whether and what to save: `plan.SavePolicy`).

- `begin_run` / `end_run` bracket a `fit`: rank 0 takes the output-directory lock (`checkpoint/run_lock.py`),
  removes what killed runs left behind (`checkpoint/layout.py`), and every rank learns the run id that names
  this run's temporary folders.
- `save` is `Trainer._save_checkpoint` (T:3363-3430), after one difference: weights holding a NaN or inf stop the run
  with `NonFiniteWeightsError` and no checkpoint (`checkpoint/finite.py`; `save_nonfinite_checkpoints=True`
  saves them, as HF does). The model files are written by `save_model` (a `ModelFilesWriter`) when a facade supplies
  one, else built in (`content.py`). Then: point `best_model_checkpoint` at
  `checkpoint-<best_global_step>` if that folder exists, write `tmp-checkpoint-<step>-<run>` (rank 0 the shared
  files, every rank its RNG file, all ranks the FSDP and DeepSpeed collectives), check, flush and rename it on
  rank 0 once all ranks are done, then rotate with HF's rule on rank 0 after a barrier. Rotation deletes by
  renaming first.
- With `save_async=True` the save step only captures the state in CPU memory (`checkpoint/content.py`) and a
  background thread writes, renames and rotates (`checkpoint/background.py`); the next save, the end of
  training and `end_run` wait for it first, so one save is in flight at most and its error surfaces here.
- `finish` applies the `save_total_limit == 1` cleanup.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from transformers import TrainerState

from hf_lightning._lightning_compat import datamodule_of, grad_scaler, position_in_epoch
from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint import distributed as dist_state
from hf_lightning.checkpoint.background import BackgroundWriter, mark_failed, mark_written, wait_for_ranks
from hf_lightning.checkpoint.checks import output_dir_problem
from hf_lightning.checkpoint.content import CheckpointContent, StreamPosition, cpu_copy, write_content

if TYPE_CHECKING:
    from hf_lightning.checkpoint.content import SavedArguments
from hf_lightning.checkpoint.finite import NonFiniteWeightsError, first_nonfinite
from hf_lightning.checkpoint.io import (
    CHECKPOINT_PREFIX,
    SHARDED_OPTIMIZER_DIR,
    CheckpointWriteError,
    finalize_checkpoint,
    prepare_tmp_folder,
    rng_state,
)
from hf_lightning.checkpoint.layout import (
    checkpoint_folders,
    clean_leftovers,
    list_checkpoints,
    remove_checkpoint,
    tmp_folder,
)
from hf_lightning.checkpoint.lightning_state import capture_lightning_state, epoch_geometry
from hf_lightning.checkpoint.rotate import final_cleanup, select_for_deletion
from hf_lightning.checkpoint.run_lock import RunLock
from hf_lightning.checkpoint.sharded import (
    gather_full_weights,
    is_deepspeed,
    optimizer_shard_owner,
    save_engine_state,
)
from hf_lightning.contracts import ResumableTrainStream, flow_model
from hf_lightning.flow.messages import logger as log
from hf_lightning.plan import SavePolicy

__all__ = ["CheckpointSaver", "ModelFilesWriter", "export_callback_states", "list_checkpoints"]

ModelFilesWriter = Callable[[str], None]
"""Writes a checkpoint's model files into the folder it is given, on every process: the seam where a facade's own
model saving (an overridden `Trainer.save_model`, HF's private `_save`) replaces the built-in one."""


def export_callback_states(state: TrainerState, exportable: Sequence[object]) -> None:
    """Store each `ExportableState`'s `state()` in `state.stateful_callbacks` (T:3407-3415), before writing JSON."""
    from transformers.trainer_callback import ExportableState

    # HF annotates `stateful_callbacks` as the callbacks given to a fresh state; it holds their exported states
    stored: dict[str, Any] = state.stateful_callbacks  # type: ignore[assignment]  # see above
    for callback in exportable:
        if not isinstance(callback, ExportableState):
            continue
        name = type(callback).__name__
        if isinstance(stored.get(name), list):
            stored[name].append(callback.state())
        else:
            stored[name] = callback.state()


def _stream_position(trainer: pl.Trainer) -> StreamPosition | None:
    """This process's position in an unsized train stream, when the data module reports one (a plain copy)."""
    datamodule = datamodule_of(trainer)
    if not isinstance(datamodule, ResumableTrainStream):
        return None
    windows_done, _ = position_in_epoch(trainer)
    position = datamodule.train_stream_position(windows_done)
    return None if position is None else StreamPosition(position, trainer.current_epoch, windows_done)


_RANKS_TIMEOUT_S = 1800.0
"""How long rank 0's background save waits for the other ranks' parts (HF's default `ddp_timeout`)."""


class CheckpointSaver:
    """Checkpoint writing and rotation for `HFTrainerFlow`.

    Args:
        args: the training arguments (the output directory, and what `training_args.bin` holds).
        policy: whether and how the run writes checkpoints (`plan.save_policy`).
        processing_class: tokenizer / processor saved in every checkpoint.
    """

    def __init__(self, args: TrainingArguments, policy: SavePolicy, processing_class: Any = None) -> None:
        self.args = args
        self.policy = policy
        self.processing_class = processing_class
        self.saved_args: SavedArguments | None = None
        """What `training_args.bin` holds: the arguments object the user passed (a `transformers.TrainingArguments`
        stays one); None: `args`."""
        self.lock: RunLock | None = None
        self.run: str | None = None
        """This run's id (every rank): names its temporary folders; None outside `begin_run` / `end_run`."""
        self.durable = True
        """Flush files and folders before renaming a checkpoint into place (False only to measure the cost)."""
        self.manifest = True
        """Write each checkpoint's manifest of checksums (False only to measure the cost)."""
        self.background = BackgroundWriter()
        """The save in flight with `save_async=True`."""
        self.save_model: ModelFilesWriter | None = None
        """Writes a checkpoint's model files into the folder it is given, on every process (an overridden
        `Trainer.save_model`, called with `_internal_call=True`, as HF's `_save_checkpoint` does); None: built in.
        The one seam for a facade's own model saving (`_write_files` calls it, `_capture` then skips the model)."""
        self.last_saved_step: int | None = None
        """The step of this run's latest `save` (None: none yet): a pre-emption does not write that step again."""
        self.saved_steps: list[int] = []
        """The steps this run saved, in order (what the stop line and the end-of-fit summary call this run's)."""

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
        self.last_saved_step = None
        self.saved_steps = []
        strategy = trainer.strategy
        if self.policy.asynchronous and (optimizer_shard_owner(strategy, flow_model(trainer.lightning_module))
                                     is not None or is_deepspeed(strategy)):
            raise ValueError("save_async=True is not supported for a sharded model (FSDP2, FSDP or DeepSpeed): its "
                             "weights are gathered and its optimizer written by collectives, which cannot run beside "
                             "training. Use save_async=False.")

    def end_run(self, trainer: pl.Trainer | None = None) -> None:
        """Wait for a save in flight (its error is not raised here: `wait` did, or an exception is on its way), then
        give the lock back (rank 0; idempotent, also after an exception)."""
        self.background.wait(raise_errors=False)
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        self.run = None

    def save(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: TrainerState,
        exportable: Sequence[object] = (), epoch_ending: bool = False, skip_callbacks: Sequence[pl.Callback] = (),
    ) -> None:
        """`_save_checkpoint`: write `checkpoint-<global_step>` on rank 0, move the best pointer, rotate.

        `exportable`: HF callbacks (and the `TrainerControl`) whose `ExportableState` goes into `trainer_state.json`.
        `epoch_ending`: the epoch ends after this update although batches remain (`should_epoch_stop`).
        `skip_callbacks`: Lightning callbacks whose state is not stored in `lightning_state.pt` (the flow's own state
        is `trainer_state.json`).
        """
        if self.policy.asynchronous:
            self.background.wait()  # the previous save of this process is complete (at most one in flight)
        step = state.global_step
        if not self.policy.nonfinite_allowed:
            self._refuse_nonfinite(trainer, pl_module, step)
        self.last_saved_step = step
        self.saved_steps.append(step)
        if self.policy.tracks_best_step and state.best_global_step:
            best = os.path.join(self.output_dir, f"{CHECKPOINT_PREFIX}-{state.best_global_step}")
            if os.path.exists(best) or state.best_global_step == step:
                state.best_model_checkpoint = best
        export_callback_states(state, exportable)
        if self.policy.asynchronous:
            self._save_in_background(trainer, pl_module, state, epoch_ending, skip_callbacks)
            return
        self._write(trainer, pl_module, state, step, epoch_ending, skip_callbacks)
        trainer.strategy.barrier("hf_lightning_save")
        if trainer.is_global_zero:
            self._rotate(state.best_model_checkpoint)
        trainer.strategy.barrier("hf_lightning_rotate")

    def _refuse_nonfinite(self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int) -> None:
        """Stop before writing `checkpoint-<step>` when a weight is NaN or inf (every process, the same decision).

        Raises:
            NonFiniteWeightsError: naming the step, the first non-finite tensor and the checkpoint that is kept.
        """
        strategy = trainer.strategy

        def total(flags: torch.Tensor) -> torch.Tensor:
            return strategy.reduce(flags.to(strategy.root_device), reduce_op="sum")

        found = first_nonfinite(flow_model(pl_module), total if trainer.world_size > 1 else None)
        if found is None:
            return
        name, kind = found
        earlier = {n: path for n, path in checkpoint_folders(self.output_dir).items() if n < step}
        kept = (f"The newest checkpoint, {str(earlier[max(earlier)])!r}, is kept (nothing rotates it away); resume "
                "from it (resume_from_checkpoint=True) once the cause is fixed." if earlier
                else "No checkpoint was saved before it.")
        raise NonFiniteWeightsError(
            f"Saving at step {step}: the model's weights are not finite ({name!r} holds {kind}), so no "
            f"{CHECKPOINT_PREFIX}-{step} is written and training stops. {kept} A NaN or inf weight usually comes from "
            "the data (a NaN or inf label or feature), a learning_rate too high, or an fp16 overflow; the logged loss "
            "shows when it started. To save such weights anyway, as transformers.Trainer does, pass "
            "save_nonfinite_checkpoints=True."
        )

    def wait(self, trainer: pl.Trainer) -> None:
        """Block until the background save (if any) is complete on every process; re-raise its error."""
        if self.policy.asynchronous:
            self.background.wait()
            trainer.strategy.barrier("hf_lightning_save_async_done")

    def _rotate(self, best: str | None) -> None:
        """HF's `save_total_limit` rotation (rank 0), deleting by renaming first."""
        for path in select_for_deletion(list_checkpoints(self.output_dir), self.policy.total_limit, best):
            remove_checkpoint(path, self._run_id())

    def _run_id(self) -> str:
        if self.run is None:
            raise RuntimeError("CheckpointSaver: saving outside a run; call begin_run(trainer) first (HFTrainerFlow "
                               "does it when fit starts).")
        return self.run

    def _write(self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: TrainerState, step: int,
               epoch_ending: bool = False, skip_callbacks: Sequence[pl.Callback] = ()) -> None:
        """Write `tmp-checkpoint-<step>-<run>` from every rank, then rename it on rank 0 once all ranks are done.

        Rank 0 writes the shared files, every rank its own RNG file; under FSDP the full weights are gathered and
        the optimizer shards written by all ranks, under DeepSpeed the engine's checkpoint (collectives,
        `checkpoint/sharded.py`). Only the rename makes the folder a checkpoint. A failed write (e.g. a full disk)
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
                                durable=self.durable, manifest=self.manifest)

    def _write_files(self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: TrainerState, step: int,
                     tmp: Path, epoch_ending: bool, skip_callbacks: Sequence[pl.Callback]) -> None:
        strategy = trainer.strategy
        if trainer.is_global_zero:
            prepare_tmp_folder(self.output_dir, state.global_step, self._run_id())
        strategy.barrier("hf_lightning_save_begin")
        self._say_saving(trainer, state.global_step)
        if self.save_model is not None:
            self.save_model(str(tmp))  # every rank, as HF's `_save_checkpoint` calls `save_model`
        content = self._capture(trainer, pl_module, state, epoch_ending, skip_callbacks, copy_state=False)
        if not self.policy.only_model:
            model, optimizer, strategy = flow_model(pl_module), self._optimizer(trainer), trainer.strategy
            owner = optimizer_shard_owner(strategy, model)
            if owner is not None and optimizer is not None:
                dist_state.save_sharded_optimizer(owner, optimizer, tmp / SHARDED_OPTIMIZER_DIR)  # a collective
            save_engine_state(strategy, tmp, step)  # DeepSpeed: optimizer and master weights (every rank)
        write_content(content, tmp, self.policy.only_model, self.durable)
        strategy.barrier("hf_lightning_save_written")

    def _say_saving(self, trainer: pl.Trainer, step: int) -> None:
        if trainer.is_global_zero:
            log.info(f"Saving model checkpoint to {self.output_dir}/{CHECKPOINT_PREFIX}-{step}")  # HF's message

    @staticmethod
    def _optimizer(trainer: pl.Trainer) -> torch.optim.Optimizer | None:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        return getattr(optimizer, "optimizer", optimizer)

    def _capture(self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: TrainerState, epoch_ending: bool,
                 skip_callbacks: Sequence[pl.Callback], copy_state: bool) -> CheckpointContent:
        """This process's share of the checkpoint: references (`copy_state=False`, written at once) or copies in CPU
        memory that training can no longer change (`copy_state=True`, written in the background)."""
        model = flow_model(pl_module)
        own_model_files = self.save_model is None  # else the overridden `save_model` wrote them (`_write_files`)
        # collective under FSDP / ZeRO-3, None otherwise
        full_state = gather_full_weights(trainer.strategy, model) if own_model_files else None
        content = CheckpointContent(trainer.world_size, trainer.global_rank)
        keep = cpu_copy if copy_state else (lambda value: value)
        if trainer.is_global_zero:
            if own_model_files:
                content.model, content.processing_class = model, self.processing_class
                content.args = self.saved_args if self.saved_args is not None else self.args
                content.model_state = full_state if full_state is not None or not copy_state else cpu_copy(
                    model.state_dict())
            content.trainer_state = copy.deepcopy(state) if copy_state else state
        if self.policy.only_model:
            return content
        optimizer = self._optimizer(trainer)
        if trainer.is_global_zero:
            scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
            scaler = grad_scaler(trainer)
            whole = optimizer_shard_owner(trainer.strategy, model) is None and not is_deepspeed(trainer.strategy)
            if optimizer is not None and whole:  # else sharded (`optimizer_sharded/`) or the engine's
                content.optimizer = keep(optimizer.state_dict())
            content.scheduler = keep(scheduler.state_dict()) if scheduler is not None else None
            content.scaler = keep(scaler.state_dict()) if scaler is not None else None
            content.lightning_state = keep(capture_lightning_state(trainer, epoch_ending, skip_callbacks,
                                                                   geometry=epoch_geometry(trainer, self.args)))
        content.rng = rng_state(trainer.world_size > 1)
        content.stream = _stream_position(trainer)
        return content

    def _save_in_background(self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: TrainerState,
                            epoch_ending: bool, skip_callbacks: Sequence[pl.Callback]) -> None:
        """Capture this process's share in CPU memory now; write, rename and rotate in the background."""
        step, run = state.global_step, self._run_id()
        if trainer.is_global_zero:
            prepare_tmp_folder(self.output_dir, step, run)
        trainer.strategy.barrier("hf_lightning_save_begin")
        self._say_saving(trainer, step)
        content = self._capture(trainer, pl_module, state, epoch_ending, skip_callbacks, copy_state=True)
        job = functools.partial(self._write_in_background, content, tmp_folder(self.output_dir, step, run), step,
                                state.best_model_checkpoint)
        self.background.start(job, name=f"hf_lightning-save-{step}")

    def _write_in_background(self, content: CheckpointContent, tmp: Path, step: int, best: str | None) -> None:
        """The background job: this process's files; then on rank 0, once every rank's are there, the checks,
        flush and rename of `finalize_checkpoint`, then the rotation (only after the new checkpoint is in place)."""
        try:
            write_content(content, tmp, self.policy.only_model, self.durable)
        except BaseException as error:
            if content.is_zero:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                mark_failed(tmp, content.rank, error)
            raise
        if not content.is_zero:
            mark_written(tmp, content.rank)
            return
        try:
            wait_for_ranks(tmp, content.world_size, _RANKS_TIMEOUT_S)
        except RuntimeError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finalize_checkpoint(self.output_dir, step, self._run_id(), self.lock.check_held if self.lock else None,
                            durable=self.durable, manifest=self.manifest)
        self._rotate(best)

    def finish(self, trainer: pl.Trainer, state: TrainerState) -> None:
        """At the end of training: HF's `save_total_limit == 1` cleanup (T:2012-2019), on rank 0."""
        best = state.best_model_checkpoint
        if trainer.is_global_zero and self.policy.saves:
            for path in final_cleanup(list_checkpoints(self.output_dir), best, self.policy.total_limit):
                log.info(f"Deleting older checkpoint [{path}] due to args.save_total_limit")  # HF's message
                remove_checkpoint(path, self._run_id())
        trainer.strategy.barrier("hf_lightning_finish")
