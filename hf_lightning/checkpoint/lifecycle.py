"""`Checkpoints`: the one object through which a run meets its checkpoints, in the order it meets them.

- `begin_run` (`on_fit_start`): the output-directory lock and the leftovers of killed runs (`write.py`), then the
  folder to resume from found and verified (`find.py`) and restored into the starting Lightning run (`restore.py`);
  without one, the checkpoints this run will replace are named once.
- `restore` (`on_train_start`): the resumed run's `TrainerState`, plan (the checkpoint's intervals) and HF callback
  states.
- `save`: one `checkpoint-<global_step>` (`write.py`): HF's `_save_checkpoint`, best pointer and rotation included.
- `update_best` / `step_plateau_scheduler`: HF's best metric after a training-time evaluation (`best.py`).
- `finish` (`on_train_end`): the save in flight completed, the best model loaded (`load_best_model_at_end`), HF's
  end-of-training cleanup; `end_run` (`teardown`, or after an exception): the lock given back.

Every "when" and "which" comes from the plan (`plan.SavePolicy`, `plan.BestRule`), none from the arguments.
`write_model_files` is the seam where a facade writes a checkpoint's model files itself (an overridden
`Trainer.save_model`, or HF's private `_save`): given a folder, it writes the model files into it on every process;
`saved_args` is what `training_args.bin` holds (the arguments object the user passed); `load_model_files` /
`load_best_model` are where a facade loads a resumed or the best checkpoint's model files itself (HF's private
`_load_from_checkpoint` / `_load_best_model`, overridden by sentence-transformers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from torch import nn
from transformers import TrainerControl, TrainerState

from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint.best import BestModelTracker
from hf_lightning.checkpoint.find import resume_folder
from hf_lightning.checkpoint.position import nothing_left_to_train
from hf_lightning.checkpoint.restore import (
    CallbackList,
    CheckpointRestorer,
    ModelFilesLoader,
    RestoredState,
    say_nothing_left,
    say_replaced,
)
from hf_lightning.checkpoint.write import CheckpointSaver, ModelFilesWriter
from hf_lightning.plan import TrainingPlan, best_rule, save_policy

if TYPE_CHECKING:
    from hf_lightning.checkpoint.content import SavedArguments

__all__ = ["Checkpoints"]


class Checkpoints:
    """The checkpoint lifecycle of one flow: `begin_run`, `restore`, `save`, `finish`, `end_run`.

    Args:
        args: the training arguments (output directory, resume, and the save / best settings the plan reads).
        processing_class: tokenizer / processor saved in every checkpoint.

    Attributes:
        policy: whether and how this run writes checkpoints (`plan.save_policy`).
        saver: the writer of `checkpoint-<n>` folders and holder of the output-directory lock.
        best: the best-metric bookkeeping.
        restorer: the checkpoint the running fit resumed from (None: a fresh run, or no fit yet).
    """

    def __init__(self, args: TrainingArguments, processing_class: Any = None) -> None:
        self.args = args
        self.policy = save_policy(args)
        self.saver = CheckpointSaver(args, self.policy, processing_class)
        self.best = BestModelTracker(best_rule(args), self.policy)
        self.restorer: CheckpointRestorer | None = None
        self.load_model_files: ModelFilesLoader | None = None
        """Loads a resumed checkpoint's model files (a facade's overridden `_load_from_checkpoint`); None: built in."""
        self.load_best_model: Callable[[], None] | None = None
        """Loads the best checkpoint at the end (a facade's overridden `_load_best_model`); None: built in."""
        self.after_restore: Callable[[str | None], None] | None = None
        """Called once per fit after the optimizer and scheduler are restored, with the resumed folder (None: a fresh
        run): a facade's overridden `_load_optimizer_and_scheduler` (TRL's GRPO reads its own file there)."""

    @property
    def write_model_files(self) -> ModelFilesWriter | None:
        """Writes a checkpoint's model files into the folder it is given, on every process (None: built in)."""
        return self.saver.save_model

    @write_model_files.setter
    def write_model_files(self, writer: ModelFilesWriter | None) -> None:
        self.saver.save_model = writer

    @property
    def saved_args(self) -> SavedArguments | None:
        """What each checkpoint's `training_args.bin` holds: the arguments object the user passed (HF's stays HF's);
        None: `args`."""
        return self.saver.saved_args

    @saved_args.setter
    def saved_args(self, args: SavedArguments | None) -> None:
        self.saver.saved_args = args

    @property
    def last_saved_step(self) -> int | None:
        """The step of this run's latest `save` (None: none yet)."""
        return self.saver.last_saved_step

    def this_runs_checkpoint(self) -> str | None:
        """The newest checkpoint folder this run wrote (complete: in place under its final name), else the one it
        resumed from (verified when it was loaded), else None. A fresh run into an `output_dir` that holds another
        run's checkpoints never names them as its own (the highest step in the folder may be theirs)."""
        step = self.last_saved_step
        if step is not None:
            folder = Path(self.args.resolved_output_dir) / f"checkpoint-{step}"
            if folder.is_dir():
                return str(folder)
        saved_earlier = [s for s in self.saver.saved_steps if s != step]
        for earlier in reversed(saved_earlier):  # the latest save is still in flight: the one before it
            folder = Path(self.args.resolved_output_dir) / f"checkpoint-{earlier}"
            if folder.is_dir():
                return str(folder)
        if self.restorer is not None:
            return str(self.restorer.path)
        return None

    def begin_run(self, trainer: pl.Trainer, pl_module: pl.LightningModule, resume: str | bool | None,
                  plan: TrainingPlan | None) -> CheckpointRestorer | None:
        """Take `output_dir` for this run and restore `resume` into it (at `on_fit_start`): the folder is found
        (`find.resume_folder`), then checked, verified and restored (`CheckpointRestorer.on_fit_start`).

        Args:
            trainer: the starting Lightning trainer (optimizers exist, the fit loop has not started).
            pl_module: its module.
            resume: a checkpoint folder or True (the latest in `output_dir`); None falls back to
                `args.resume_from_checkpoint`; False: a fresh run whatever the arguments say.
            plan: this run's plan (None: no plan, e.g. a fit without the flow's `setup`).

        Returns:
            The restorer whose later hooks (`on_train_epoch_start`, `on_train_batch_start`) the flow calls, or None
            for a fresh run.

        Raises:
            ValueError / FileNotFoundError: no checkpoint to resume from, or an incomplete or damaged one.
            OutputDirLocked: another run uses `output_dir`.
        """
        self.saver.begin_run(trainer)  # the output-directory lock, then leftovers of killed runs are cleaned up
        self.restorer = None
        path = resume_folder(self.args, resume) if resume is not False else None
        if not path:
            say_replaced(trainer, self.args, None, self.policy.saves)
            if self.after_restore is not None:  # HF calls `_load_optimizer_and_scheduler(None)` on a fresh run too
                self.after_restore(None)
            return None
        restorer = CheckpointRestorer(path, self.args, self.policy, self.load_model_files)
        restorer.on_fit_start(trainer, pl_module, plan.updates_per_epoch if plan is not None and plan.sized else None)
        position = restorer.position
        if plan is not None and position is not None and nothing_left_to_train(
                position, plan.max_steps, plan.num_train_epochs if plan.sized else None):
            restorer.nothing_left = True
            say_nothing_left(trainer, restorer.path, position, plan)
        self.restorer = restorer
        if self.after_restore is not None:
            self.after_restore(restorer.path)
        return restorer

    def restore(self, trainer: pl.Trainer, plan: TrainingPlan, callbacks: CallbackList, control: TrainerControl
                ) -> RestoredState | None:
        """At `on_train_start` of a resumed run: the checkpoint's `TrainerState`, the plan with its intervals and
        the HF callback states (`CheckpointRestorer.restore_trainer_state`); None for a fresh run."""
        if self.restorer is None:
            return None
        return self.restorer.restore_trainer_state(trainer, plan, callbacks, control)

    def save(self, trainer: pl.Trainer, pl_module: pl.LightningModule, state: TrainerState,
             exportable: Sequence[object] = (), epoch_ending: bool = False,
             skip_callbacks: Sequence[pl.Callback] = ()) -> None:
        """Write `checkpoint-<global_step>` (`CheckpointSaver.save`: arguments there)."""
        self.saver.save(trainer, pl_module, state, exportable, epoch_ending, skip_callbacks)

    def wait(self, trainer: pl.Trainer) -> None:
        """Block until the save in flight (`save_async`) is complete on every process; re-raise its error."""
        self.saver.wait(trainer)

    def update_best(self, state: TrainerState, metrics: dict[str, Any]) -> bool:
        """HF's `_determine_best_metric` after a training-time evaluation; True on a new best."""
        return self.best.update(state, metrics)

    def step_plateau_scheduler(self, trainer: pl.Trainer, metrics: dict[str, Any]) -> None:
        """A `ReduceLROnPlateau` steps on the best-model metric (`BestModelTracker.step_plateau_scheduler`)."""
        self.best.step_plateau_scheduler(trainer, metrics)

    def finish(self, trainer: pl.Trainer, model: nn.Module, state: TrainerState) -> None:
        """At the end of training: the best checkpoint's weights into `model` (`load_best_model_at_end`; through
        `load_best_model` when a facade set one), then HF's `save_total_limit == 1` cleanup."""
        if self.best.best_to_load(state) is not None:  # verified first, whoever loads it
            if self.load_best_model is not None:
                self.load_best_model()
            else:
                self.best.load_best_weights(model, state, trainer.strategy)
        self.saver.finish(trainer, state)

    def load_best_now(self, trainer: pl.Trainer, model: nn.Module, state: TrainerState) -> None:
        """The built-in `_load_best_model`: the (verified) best checkpoint's weights into `model`."""
        self.best.load_best_weights(model, state, trainer.strategy)

    def end_run(self, trainer: pl.Trainer | None = None) -> None:
        """Give `output_dir` back (after `fit`, or after an exception); waits for a save in flight first."""
        self.saver.end_run(trainer)
