"""Resuming a run from an HF-layout checkpoint folder (ours or one written by `transformers.Trainer`).

`HFTrainerFlow` drives it through three hooks, in HF's order (T:1559-1710, 1817-1890):

1. `on_fit_start` (optimizers exist, the fit loop has not started): model weights (shapes checked), optimizer,
   scheduler, grad scaler, Lightning callback states, the loop position and the data sampler's start window.
2. `on_train_start`: `trainer_state.json` replaces the fresh `TrainerState` (`max_steps` / `num_train_epochs` from
   this run), HF callback states if `restore_callback_states_from_checkpoint`.
3. the RNG states: at an epoch boundary in the first `on_train_epoch_start` (before the epoch's loader is iterated,
   as HF loads before `iter`); mid-epoch in the first `on_train_batch_start`, after the first window was fetched
   (the new loader iterator's seed draw is behind us, as HF loads after its first `get_batch_samples`). Both match
   the uninterrupted run.

`checkpoint/lifecycle.py` (`Checkpoints.begin_run` / `restore`) drives it; without a checkpoint only the
output-directory rule applies (`say_replaced`).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy, Strategy
from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState
from transformers.utils import logging as hf_logging

from hf_lightning._lightning_compat import datamodule_of, grad_scaler, restart_train_iterator
from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint import distributed as dist_state
from hf_lightning.checkpoint.adapters import load_adapter_checkpoint
from hf_lightning.checkpoint.changed_settings import read_recorded_arguments, setting_changes
from hf_lightning.checkpoint.elastic import (
    ElasticResume,
    elastic_line,
    elastic_max_steps,
    elastic_resume,
    hf_rule_rows,
    keep_global_batch_accumulation,
    read_lightning_state,
)
from hf_lightning.checkpoint.elastic import (
    updates_per_epoch as geometry_updates_per_epoch,
)
from hf_lightning.checkpoint.find import CheckpointFiles, check_checkpoint, replaced_checkpoints_notice, resume_folder
from hf_lightning.checkpoint.io import TRAINER_STATE_NAME
from hf_lightning.checkpoint.lightning_state import epoch_geometry, geometry_changes, restore_callback_states
from hf_lightning.checkpoint.position import ResumePosition, apply_loop_position, resume_position
from hf_lightning.checkpoint.same_run import plain_values
from hf_lightning.checkpoint.sharded import (
    full_shapes,
    is_deepspeed,
    load_engine_state,
    load_full_weights,
    optimizer_shard_owner,
)
from hf_lightning.checkpoint.stream_position import read_stream_position
from hf_lightning.checkpoint.verify import checkpoint_error
from hf_lightning.checkpoint.weight_files import is_adapter_file
from hf_lightning.contracts import ElasticTrainOrder, FlowDataModule, ResumableTrainStream, flow_model
from hf_lightning.flow.messages import logger as hf_logger
from hf_lightning.plan import SavePolicy, TrainingPlan, plan_training, resume_intervals, save_policy, with_max_steps

__all__ = ["CallbackList", "CheckpointRestorer", "ModelFilesLoader", "RestoredState", "load_weights", "plan_for_resume",
           "read_file", "read_weights", "say_nothing_left", "say_replaced", "weight_mismatches"]

log = logging.getLogger(__name__)


def read_file(path: str | Path, loader: Callable[[Path], Any], what: str = "resume_from_checkpoint") -> Any:
    """`loader(path)` for a file of a checkpoint folder; a failure names the file and the checkpoint to use instead.

    Raises:
        DamagedCheckpointError: the file cannot be read (truncated, corrupted).
    """
    path = Path(path)
    try:
        return loader(path)
    except Exception as err:
        detail = " ".join(f"{type(err).__name__}: {err}".split())  # one line, whatever the library printed
        detail = detail if len(detail) <= 300 else detail[:297] + "..."
        raise checkpoint_error(path.parent, {path.name: detail}, what) from err


def read_weights(path: str | Path, what: str = "resume_from_checkpoint") -> dict[str, torch.Tensor]:
    """The tensors of a weights file: `model.safetensors`, a sharded `*.index.json`, or `pytorch_model.bin`.

    Raises:
        DamagedCheckpointError: a weights file cannot be read (named, with the checkpoint to use instead).
    """
    path = Path(path)
    if path.name.endswith(".index.json"):
        index = read_file(path, lambda p: json.loads(p.read_text())["weight_map"], what)
        merged: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index.values())):
            merged.update(read_weights(path.parent / shard, what))
        return merged
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return read_file(path, lambda p: load_file(str(p)), what)
    return read_file(path, lambda p: torch.load(p, map_location="cpu", weights_only=True), what)


def weight_mismatches(model_shapes: dict[str, tuple[int, ...]], saved_shapes: dict[str, tuple[int, ...]]
                      ) -> list[str]:
    """Why saved weights do not fit a model: parameters whose shapes differ, or no common parameter at all.

    Parameters missing from the checkpoint are allowed (tied weights are saved once), as HF's `strict=False`.
    """
    problems = [
        f"{name}: checkpoint {list(saved_shapes[name])} vs model {list(shape)}"
        for name, shape in model_shapes.items()
        if name in saved_shapes and tuple(saved_shapes[name]) != tuple(shape)
    ]
    if not problems and saved_shapes and not set(saved_shapes) & set(model_shapes):
        problems.append(
            f"no parameter name in common (checkpoint has e.g. {sorted(saved_shapes)[:3]}, "
            f"the model e.g. {sorted(model_shapes)[:3]})"
        )
    return problems


def load_weights(model: nn.Module, path: str | Path, what: str = "resume_from_checkpoint",
                 strategy: Strategy | None = None) -> None:
    """Load a checkpoint's weights into `model` (plain, or sharded by `strategy`) after checking they belong to it.

    A PEFT adapter file is loaded into the `PeftModel`'s adapter instead (`checkpoint/adapters.py`).

    Raises:
        ValueError: the checkpoint belongs to a different model (names the parameters whose shapes differ).
    """
    if is_adapter_file(path):
        load_adapter_checkpoint(model, path, what)
        return
    saved = read_weights(path, what)
    if _own_load_state_dict(model, strategy):
        # HF loads through the model's `load_state_dict(state_dict, False)`: an override that renames or reshapes
        # keys decides what fits (torch still refuses a shape it gets wrong)
        if is_deepspeed(strategy):  # through the override too, then the engine's fp32 master weights refreshed
            load_full_weights(strategy, model, saved)
        else:
            _warn_after_load(model, model.load_state_dict(saved, False))
        return
    model_shapes = full_shapes(strategy, model)
    if model_shapes is None:  # FSDP1: the shards do not know the shapes; torch checks them while loading
        load_full_weights(strategy, model, saved)
        return
    problems = weight_mismatches(model_shapes, {k: tuple(v.shape) for k, v in saved.items()})
    if problems:
        listed = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ValueError(f"{what}: {path} belongs to a different model: {listed}.")
    missing = sorted(set(model_shapes) - set(saved))
    if missing:
        log.info("Weights not in %s (kept as initialised, e.g. tied): %s", path, missing[:10])
    load_full_weights(strategy, model, saved)


def _own_load_state_dict(model: nn.Module, strategy: Strategy | None) -> bool:
    """Whether the model's class overrides `load_state_dict` and the load would go through it (a plain or DDP
    model, or DeepSpeed below ZeRO-3: FSDP and ZeRO-3 load the shards with torch's / DeepSpeed's own code, where the
    shapes are checked before)."""
    overridden = type(model).load_state_dict is not nn.Module.load_state_dict
    sharded = full_shapes(strategy, model) is None or dist_state.is_sharded(model) or (
        isinstance(strategy, DeepSpeedStrategy) and strategy.zero_stage_3)
    return overridden and not sharded


def _warn_after_load(model: nn.Module, result: Any) -> None:
    """HF's `_issue_warnings_after_load`: missing keys (unless they are the model's `_keys_to_ignore_on_save`,
    then the weights are tied again) and unexpected keys, from what the model's `load_state_dict` returned."""
    missing = list(getattr(result, "missing_keys", None) or [])
    unexpected = list(getattr(result, "unexpected_keys", None) or [])
    if missing:
        ignored = getattr(model, "_keys_to_ignore_on_save", None)
        if ignored and set(missing) == set(ignored):
            model.tie_weights()  # type: ignore[operator]  # a PreTrainedModel's, the one kind with that attribute
        else:
            hf_logger.warning(f"There were missing keys in the checkpoint model loaded: {missing}.")
    if unexpected:
        hf_logger.warning(f"There were unexpected keys in the checkpoint model loaded: {unexpected}.")


def _torch_load(path: Path) -> Any:
    """`torch.load(weights_only=True)` of a checkpoint file (a failure names it, see `read_file`)."""
    from transformers.trainer_pt_utils import safe_globals

    def load(target: Path) -> Any:
        with safe_globals():  # numpy's RNG state in HF's rng files needs these allow-listed for weights_only
            return torch.load(target, map_location="cpu", weights_only=True)

    return read_file(path, load)


class CallbackList(Protocol):
    """The HF callbacks of a run (the flow's `HFCallbackHandler`), whose exportable states a resume rebuilds."""

    @property
    def callbacks(self) -> list[TrainerCallback]: ...

    def add_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None: ...

    def remove_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None: ...


@dataclass(frozen=True)
class RestoredState:
    """What a resumed run starts its training with (`CheckpointRestorer.restore_trainer_state`).

    Attributes:
        state: the checkpoint's `TrainerState`, with this run's `max_steps` / `num_train_epochs`.
        plan: this run's plan with the checkpoint's intervals (`plan.resume_intervals`).
        control: the `TrainerControl`: rebuilt from the checkpoint when its state is restored, else the one given.
    """

    state: TrainerState
    plan: TrainingPlan
    control: TrainerControl


ModelFilesLoader = Callable[[str, "nn.Module | None"], None]
"""Loads a checkpoint folder's model files into the model (`None`: the trainer's own; the sharded model under FSDP)."""


class CheckpointRestorer:
    """Restores one checkpoint into a starting Lightning run (see the module docstring for the order).

    Args:
        path: the checkpoint folder (already resolved).
        args: this run's training arguments.
        policy: this run's save policy (default: from `args`).
    """

    def __init__(self, path: str, args: TrainingArguments, policy: SavePolicy | None = None,
                 load_model: ModelFilesLoader | None = None) -> None:
        self.path = path
        self.args = args
        self.policy = policy if policy is not None else save_policy(args)
        self.load_model = load_model
        """Loads the folder's model files (a facade's overridden `_load_from_checkpoint`); None: built in."""
        self.files: CheckpointFiles | None = None
        self.position: ResumePosition | None = None
        self.nothing_left = False
        """The checkpoint is at or past this run's end: the flow runs HF's train begin and end without training."""
        self._rng_pending = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, updates_per_epoch: int | None) -> None:
        """Weights, optimizer, scheduler, scaler, Lightning callback states, loop position, sampler start."""
        files = check_checkpoint(self.path, trainer.world_size, trainer.global_rank)
        self.files = files
        trainer_state = read_file(files.path / TRAINER_STATE_NAME, lambda p: json.loads(p.read_text()))
        global_step = int(trainer_state["global_step"])
        say_replaced(trainer, self.args, global_step, self.policy.saves)
        _check_changed_settings(trainer, files, self.args, global_step)
        model = flow_model(pl_module)
        strategy = trainer.strategy
        hf_logger.info(f"Loading model from {self.path}.")  # HF's message (T:3667)
        _refuse_engine_state_elsewhere(files, strategy, trainer.world_size, self.path)
        if is_deepspeed(strategy):
            # the engine's checkpoint holds the fp32 master weights with the optimizer; HF resumes from it only
            if not load_engine_state(strategy, files.path):
                raise ValueError(f"Can't find a valid checkpoint at {files.path} (DeepSpeed resumes from a checkpoint "
                                 "written under DeepSpeed: `global_step<N>/` and `latest`).")
        elif self.load_model is None:
            load_weights(model, files.weights, strategy=strategy)
        elif optimizer_shard_owner(strategy, model) is not None:  # FSDP: HF passes the wrapped model (T:1815)
            self.load_model(str(files.path), model)
        else:  # HF's call before the model is prepared (T:1564); an override loads its own format
            self.load_model(str(files.path), None)
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        optimizer = getattr(optimizer, "optimizer", optimizer)
        owner = optimizer_shard_owner(strategy, model)
        if optimizer is None or is_deepspeed(strategy):
            pass  # DeepSpeed: loaded with the engine's checkpoint above
        elif files.sharded_optimizer is not None:
            # written sharded (FSDP2 / FSDP1) by any number of processes: torch.distributed.checkpoint reshards it
            # into this run's shards, or whole tensors for an unsharded optimizer (DDP, one process)
            target = owner if owner is not None else model
            read_file(files.sharded_optimizer, lambda p: dist_state.load_sharded_optimizer(target, optimizer, p))
        elif files.optimizer is not None and owner is not None:
            # whole tensors (DDP, one process, transformers.Trainer) into sharded parameters: each rank keeps its
            # shard (loading them as they are crashed at the first update: plain tensors against DTensors)
            dist_state.load_full_optimizer(owner, optimizer, _torch_load(files.optimizer))
        elif files.optimizer is not None:
            optimizer.load_state_dict(_torch_load(files.optimizer))
        if files.scheduler is not None and trainer.lr_scheduler_configs:
            trainer.lr_scheduler_configs[0].scheduler.load_state_dict(_torch_load(files.scheduler))
        scaler = grad_scaler(trainer)
        if scaler is not None and files.scaler is not None:
            scaler.load_state_dict(_torch_load(files.scaler))
        # weights_only, as Lightning loads its own checkpoints: a checkpoint folder is not trusted code
        saved = _torch_load(files.lightning_state) if files.lightning_state else None
        position = resume_position(global_step, updates_per_epoch, saved)
        datamodule: FlowDataModule = datamodule_of(trainer)  # checked by the flow's setup
        changes: list[str] = []
        elastic: ElasticResume | None = None
        if saved is not None:
            before = saved.get("geometry", {"world_size": saved.get("world_size")})
            current = epoch_geometry(trainer, self.args)
            changes = geometry_changes(before, current)
            if updates_per_epoch and saved.get("global_step") == global_step:
                elastic = _elastic_position(saved, current, datamodule, updates_per_epoch)
            if elastic is not None:  # the saved sample position: every row once per epoch, whatever changed
                position = ResumePosition(elastic.epoch, elastic.windows_done, global_step)
                if changes and trainer.is_global_zero:
                    log.warning(_elastic_message(self.path, saved, before, current, elastic, updates_per_epoch or 0,
                                                 global_step, self.args))
            elif changes:  # the recorded window position belongs to other epochs: HF's rule places the run
                if not updates_per_epoch and position.windows and not self.args.ignore_data_skip:
                    raise ValueError(
                        f"resume_from_checkpoint={self.path!r}: the training stream was saved by "
                        f"{before.get('world_size')} process(es) ({'; '.join(changes)}); its saved positions are per "
                        "process and cannot be split over this geometry, and reading it again would train other rows. "
                        "Resume with the checkpoint's number of processes, per-device batch and accumulation, or "
                        "pass ignore_data_skip=True to start the stream's pass again.")
                position = resume_position(global_step, updates_per_epoch)
                if trainer.is_global_zero:
                    log.warning(
                        "resume_from_checkpoint=%r: the epoch is not the checkpoint's (%s). As transformers.Trainer "
                        "does, the %d updates done count as %d full epoch(s) of %s updates plus %d update(s) of epoch "
                        "%d, whose first %d window(s) are skipped: %s.", self.path, "; ".join(changes), global_step,
                        position.epoch, updates_per_epoch, position.windows, position.epoch, position.windows,
                        hf_rule_rows(saved, before, current, position.epoch, position.windows))
        if self.args.ignore_data_skip:  # HF replays the resumed epoch from its first batch (T:1706-1709)
            position, elastic = ResumePosition(position.epoch, 0, global_step), None
        self.position = position
        apply_loop_position(trainer, position)
        if saved is not None:
            restore_callback_states(trainer, saved)
        datamodule.resume_position = (position.epoch, position.windows)
        if isinstance(datamodule, ElasticTrainOrder):
            datamodule.resume_start_sample = elastic.start_sample if elastic is not None else 0
        if saved is not None and not changes and position.windows and isinstance(datamodule, ResumableTrainStream) \
                and elastic is None:
            datamodule.resume_stream_position = read_stream_position(
                files.path, position.epoch, position.windows, trainer.world_size, trainer.global_rank)
        self._rng_pending = True

    def restore_trainer_state(self, trainer: pl.Trainer, plan: TrainingPlan, callbacks: CallbackList,
                              control: TrainerControl) -> RestoredState:
        """The checkpoint's `TrainerState` to replace the fresh one, as HF (T:1694-1710, CB:183-186); with
        `restore_callback_states_from_checkpoint`, the HF callbacks' states rebuilt in `callbacks` (and `control`).
        """
        assert self.files is not None
        state = read_file(self.files.path / TRAINER_STATE_NAME, lambda p: TrainerState.load_from_json(str(p)))
        if state.best_model_checkpoint is not None and not os.path.isdir(state.best_model_checkpoint):
            log.warning("The best checkpoint %s recorded in the resumed state does not exist anymore. Ignoring it for "
                        "this run.", state.best_model_checkpoint)
            state.best_model_checkpoint = None
        # HF keeps the checkpoint's intervals (T:1694-1710): the loaded state drives them
        plan, changed = resume_intervals(plan, state, self.args.per_device_train_batch_size)
        if changed:  # HF's words, on transformers' logger (a caller capturing transformers' log sees them, as HF's)
            hf_logging.get_logger("transformers.trainer_utils").warning_once(
                "Warning: The following arguments do not match the ones in the `trainer_state.json` within the "
                "checkpoint directory: " + "".join(f"\n\t{line}" for line in changed))
        state.max_steps, state.num_train_epochs = plan.max_steps, plan.num_train_epochs
        state.is_local_process_zero = trainer.local_rank == 0
        state.is_world_process_zero = trainer.is_global_zero
        if self.args.restore_callback_states_from_checkpoint:
            control = self.restore_hf_callbacks(callbacks, control, state)
        return RestoredState(state, plan, control)

    @staticmethod
    def restore_hf_callbacks(handler: CallbackList, control: TrainerControl, state: TrainerState) -> TrainerControl:
        """HF `_load_callback_state` (T:4028-4065): rebuild each stored `ExportableState` from its args/attributes;
        the rebuilt callbacks replace theirs in `handler`; returns the control (rebuilt, when it was stored)."""
        originals: list[TrainerCallback | TrainerControl] = [*handler.callbacks, control]
        rebuilt_callbacks: list[TrainerCallback] = []
        not_found: list[str] = []
        # HF annotates `stateful_callbacks` as the callbacks given to a fresh state; one loaded from JSON holds their
        # exported states, by class name
        stored: dict[str, Any] = state.stateful_callbacks  # type: ignore[assignment]  # see above
        for name, data in stored.items():
            matching = [cb for cb in originals if type(cb).__name__ == name]
            if not matching:
                not_found.append(name)
            for callback, entry in zip(matching, data if isinstance(data, list) else [data]):
                rebuilt = type(callback)(**entry.get("args", {}))
                for attribute, value in entry.get("attributes", {}).items():
                    setattr(rebuilt, attribute, value)
                if isinstance(rebuilt, TrainerControl):
                    control = rebuilt
                else:
                    rebuilt_callbacks.append(rebuilt)
                    handler.remove_callback(type(rebuilt))  # as HF: the rebuilt ones are added after all
        if not_found:  # HF's words
            hf_logger.warning("Checkpoint included callbacks not included in current configuration. Ignoring. "
                              f"({', '.join(not_found)})")
        for callback in rebuilt_callbacks:
            handler.add_callback(callback)
        return control

    def on_train_epoch_start(self, trainer: pl.Trainer) -> None:
        """At an epoch boundary, load this rank's RNG states now (see the module docstring)."""
        if self.position is None or self.position.windows == 0:
            self._load_rng()
            if self.position is not None and trainer.current_epoch == 0:
                # HF loads the states before it makes the epoch's loader iterator (T:1856-1857, 1865), whose seed
                # draw then follows them; Lightning made epoch 0's iterator before this hook (`ignore_data_skip`,
                # or a step-0 checkpoint), and an unsized loader's first window was read then: make it again, after them
                restart_train_iterator(trainer)

    def on_train_batch_start(self) -> None:
        """Mid-epoch, load this rank's RNG states after the first window was fetched (see the module docstring)."""
        self._load_rng()

    def _load_rng(self) -> None:
        """Load this rank's RNG states, once."""
        if not self._rng_pending:
            return
        self._rng_pending = False
        self._load_rng_states()

    def _load_rng_states(self) -> None:
        """This rank's python, numpy, torch (and CUDA) RNG states from the checkpoint's RNG file, if it has one."""
        assert self.files is not None
        if self.files.rng is None:
            log.info("No RNG file in %s for this process: reproducibility is not guaranteed.", self.files.path)
            return
        import random

        import numpy as np

        states = _torch_load(self.files.rng)
        random.setstate(states["python"])
        np.random.set_state(states["numpy"])
        torch.random.set_rng_state(states["cpu"])
        if torch.cuda.is_available() and "cuda" in states:
            cuda = states["cuda"]
            if isinstance(cuda, (list, tuple)):
                torch.cuda.random.set_rng_state_all(cuda)
            else:
                torch.cuda.random.set_rng_state(cuda)


def plan_for_resume(trainer: pl.Trainer, args: TrainingArguments, resume: str | bool | None,
                    datamodule: FlowDataModule) -> TrainingPlan:
    """This run's plan (at `setup`, before the optimizer and its schedule are built), knowing the checkpoint it
    resumes from (`checkpoint/elastic.py`):

    - `resume_keep_global_batch`: `gradient_accumulation_steps` is set first, to keep the checkpoint's global batch
      (refused with the numbers when it cannot divide);
    - an epoch-based run resumed in another geometry by its sample position: `max_steps` counts the updates this run
      really does (the resumed epoch's rest in this geometry), so the schedule ends with the run.

    Raises:
        ValueError: `resume_keep_global_batch` cannot keep the checkpoint's global batch.
    """
    folder = None
    if resume is not False:
        try:
            folder = resume_folder(args, resume)
        except ValueError:
            folder = None  # named by the restorer at fit start, with the other checks of the folder
    saved = read_lightning_state(folder) if folder else None
    if args.resume_keep_global_batch and folder:
        accumulation = keep_global_batch_accumulation(saved.get("geometry") if saved else None,
                                                      args.per_device_train_batch_size, trainer.world_size, folder)
        if accumulation != args.gradient_accumulation_steps and trainer.is_global_zero:
            log.warning("resume_keep_global_batch=True: gradient_accumulation_steps %d -> %d, so %d per device x %d x "
                        "%d process(es) is the checkpoint's global batch.", args.gradient_accumulation_steps,
                        accumulation, args.per_device_train_batch_size, accumulation, trainer.world_size)
        args.gradient_accumulation_steps = accumulation
    plan = plan_training(args, datamodule.num_train_microbatches())
    if saved is None or not plan.sized or args.max_steps > 0 or args.ignore_data_skip:
        return plan
    elastic = _elastic_position(saved, epoch_geometry(trainer, args), datamodule, plan.updates_per_epoch)
    if elastic is None:
        return plan
    max_steps = elastic_max_steps(plan.max_steps, plan.updates_per_epoch, int(saved["global_step"]), elastic)
    return with_max_steps(plan, args, max_steps)


def _refuse_engine_state_elsewhere(files: CheckpointFiles, strategy: Strategy, world_size: int, path: str) -> None:
    """A DeepSpeed checkpoint (its optimizer state only in the engine's `global_step<N>/`) read by another strategy
    or another number of processes: refused before anything is loaded, naming DeepSpeed's conversion.

    Raises:
        ValueError: the checkpoint's optimizer state is DeepSpeed's and this run cannot load it as it is.
    """
    if files.engine_state is None or files.optimizer is not None or files.sharded_optimizer is not None:
        return
    saved = read_lightning_state(files.path) or {}
    saved_world = (saved.get("geometry") or {}).get("world_size", saved.get("world_size"))
    if is_deepspeed(strategy) and saved_world in (None, world_size):
        return
    now = f"{type(strategy).__name__} on {world_size} process(es)"
    tag = (files.path / "latest").read_text().strip() or "global_step<N>"
    raise ValueError(
        f"resume_from_checkpoint={path!r}: its optimizer state is DeepSpeed's partitioned engine checkpoint "
        f"(written by {saved_world or 'an unknown number of'} process(es)), which {now} cannot load as it is. Convert "
        f"it with DeepSpeed's universal checkpoint (`python -m deepspeed.checkpoint.ds_to_universal --input_folder "
        f"{path}/{tag} --output_folder {path}/{tag}_universal`, then resume under DeepSpeed with "
        "`\"checkpoint\": {\"load_universal\": true}`), or start the optimizer fresh from the checkpoint's weights "
        "(`from_pretrained`), or resume with the checkpoint's strategy and number of processes.")


def _elastic_position(saved: dict[str, Any], current: dict[str, Any], datamodule: object, upe: int
                      ) -> ElasticResume | None:
    """The elastic position of a resume from `saved` (`elastic.elastic_resume`), asking the data module for its
    order and for the windows left after the saved sample position."""
    sample_position = saved.get("sample_position")
    if sample_position is None or not isinstance(datamodule, ElasticTrainOrder):
        return None
    rest_windows = upe if saved["epoch_finished"] else datamodule.rest_windows(int(sample_position["samples_done"]))
    return elastic_resume(saved, current, datamodule.train_order(), upe, rest_windows)


def _elastic_message(path: str, saved: dict[str, Any], before: dict[str, Any], current: dict[str, Any],
                     elastic: ElasticResume, upe: int, global_step: int, args: TrainingArguments) -> str:
    """`elastic.elastic_line` for this resume (the old run's updates per epoch and `max_steps` from its geometry)."""
    old_upe = geometry_updates_per_epoch(before) if all(
        k in before for k in ("train_samples", "per_device_train_batch_size", "gradient_accumulation_steps",
                              "world_size")) else upe
    epochs = args.num_train_epochs
    old_max = math.ceil(epochs * old_upe) if args.max_steps <= 0 else None
    new_max = args.max_steps if args.max_steps > 0 else elastic_max_steps(math.ceil(epochs * upe), upe, global_step,
                                                                          elastic)
    return elastic_line(path, before, current, elastic, old_upe, upe, global_step, old_max, new_max, args.max_steps,
                        epochs)


def _check_changed_settings(trainer: pl.Trainer, files: CheckpointFiles, args: TrainingArguments, step: int) -> None:
    """Name each setting changed since the checkpoint, once (global rank zero), with what the run does; refuse another
    optimizer class on every rank before anything is loaded (`changed_settings.py`).

    Raises:
        ValueError: `optim` builds another optimizer class than the checkpoint's, whose state it holds.
    """
    recorded = read_recorded_arguments(files.path)
    if recorded is None:
        return
    has_optimizer_state = any(f is not None for f in (files.optimizer, files.sharded_optimizer, files.engine_state))
    changes = setting_changes(recorded, plain_values(args), step, has_optimizer_state, str(files.path))
    if changes.refusal is not None:
        raise ValueError(changes.refusal)
    if changes.lines and trainer.is_global_zero:
        log.warning("resume_from_checkpoint=%r: %d setting(s) differ from the checkpoint's training_args.bin:\n  %s",
                    str(files.path), len(changes.lines), "\n  ".join(changes.lines))


def say_replaced(trainer: pl.Trainer, args: TrainingArguments, resume_step: int | None, saves: bool) -> None:
    """Name, once (global rank zero), the checkpoints already in `output_dir` that this run will replace (none when
    it `saves` nothing)."""
    notice = replaced_checkpoints_notice(args.resolved_output_dir, resume_step, saves, args)
    if notice and trainer.is_global_zero:
        log.warning(notice)


def say_nothing_left(trainer: pl.Trainer, path: str, position: ResumePosition, plan: TrainingPlan) -> None:
    """Name, once (global rank zero), a checkpoint at or past the end of this run: nothing is left to train."""
    if trainer.is_global_zero:
        log.warning("resume_from_checkpoint=%r is at step %d, epoch %d: at or past the end of this run (max_steps=%d, "
                    "%d epoch(s)); nothing left to train. The state, best model and train metrics are the "
                    "checkpoint's.", path, position.global_step, position.epoch, plan.max_steps,
                    plan.num_train_epochs)
