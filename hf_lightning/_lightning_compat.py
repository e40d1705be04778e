"""Every use of a Lightning internal, behind one named function each (tested in tests/test_lightning_compat.py).

hf_lightning replays the HF Trainer's loop on top of Lightning's. A few things Lightning 2.6 offers no public API for:
switching off its own validation trigger, running the validation loop right where HF evaluates, and placing the loops
at a resumed position. They live here and nowhere else, so a Lightning release that changes them fails in one test
that names the function, not somewhere deep in a training run.

The console (`console.py`, `callbacks/progress_bar.py`) needs three more: the loggers Lightning's `rank_zero_info`
writes through (named after Lightning's modules), whether Lightning picks its rich progress bar, and the warnings
Lightning's own code triggers in torch (its `_pytree` module).

Why `lightning>=2.6,<2.7` (pyproject.toml): the names used below (`_TrainingEpochLoop._should_check_val_fx`,
`_LoggerConnector._first_loop_iter`, `_EvaluationLoop._combined_loader`, `_TrainingEpochLoop._batches_that_stepped` /
`_restarting`, `Trainer._signal_connector`, `_AcceleratorConnector.cluster_environment`, the progress trackers'
counters, `_AcceleratorConnector.use_distributed_sampler`,
`LightningModule._trainer`, `lightning.pytorch.utilities.imports._RICH_AVAILABLE`, the `rank_zero` logger names, the
`_pytree` module, `DDPStrategy._ddp_kwargs` / `_process_group_backend` / `_timeout`, and torch's
`Optimizer._step_supports_amp_scaling` that Lightning reads too) are private and may change in any minor release.
Raise the upper bound only after tests/test_lightning_compat.py passes on the new series.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.utilities import CombinedLoader
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

__all__ = [
    "SignalConnector",
    "attached_trainer",
    "callbacks_of",
    "cluster_environment",
    "datamodule_of",
    "defer_validation_data",
    "disable_validation_trigger",
    "grad_scaler",
    "ignore_internal_deprecation_warnings",
    "ignore_mid_epoch_resume_warning",
    "optimizer_unscales_itself",
    "position_in_epoch",
    "rank_zero_loggers",
    "restart_train_iterator",
    "rich_progress_bar_available",
    "reload_validation_data",
    "replace_signal_connector",
    "run_validation_now",
    "set_ddp_options",
    "set_loop_position",
    "set_step_budget",
    "uses_distributed_sampler",
]

_MID_EPOCH_RESUME_WARNING = "You're resuming from a checkpoint that ended before the epoch"
_RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
_INTERNAL_DEPRECATIONS = (
    # torch >= 2.10 deprecates `isinstance(x, LeafSpec)`, which Lightning 2.6's `_tree_flatten` does at every step
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
)


def attached_trainer(module: pl.LightningModule) -> pl.Trainer | None:
    """The `lightning.Trainer` running `module`, or None (`module.trainer` raises when there is none)."""
    return module._trainer


def callbacks_of(trainer: pl.Trainer) -> list[Callback]:
    """`trainer.callbacks` (public, but set by Lightning's callback connector, so not declared on the class)."""
    return trainer.callbacks  # type: ignore[attr-defined]  # see the docstring


def datamodule_of(trainer: pl.Trainer) -> Any:
    """`trainer.datamodule`, or None (public, but set by Lightning's data connector, so not declared on the class)."""
    return trainer.datamodule  # type: ignore[attr-defined]  # see the docstring


def uses_distributed_sampler(trainer: pl.Trainer) -> bool:
    """Whether the trainer was built with `use_distributed_sampler=True` (it would replace our samplers)."""
    return bool(trainer._accelerator_connector.use_distributed_sampler)


def grad_scaler(trainer: pl.Trainer) -> Any:
    """The AMP grad scaler of a `"16-mixed"` run, else None."""
    plugin = trainer.precision_plugin
    return plugin.scaler if isinstance(plugin, MixedPrecision) else None


def optimizer_unscales_itself(optimizer: Any) -> bool:
    """Whether an optimizer unscales AMP gradients inside its own `step()` (torch's fused ones do; Lightning's
    `MixedPrecision` then skips its unscaling before `on_before_optimizer_step`, reading the same torch flag)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def disable_validation_trigger(trainer: pl.Trainer) -> None:
    """Switch off Lightning's own decision to validate (every epoch end, or every `val_check_interval` batches).

    `HFTrainerFlow` starts every evaluation itself, at HF's optimizer steps (`run_validation_now`).
    """
    loop = trainer.fit_loop.epoch_loop
    loop._should_check_val_fx = lambda data_fetcher: False  # type: ignore[method-assign]  # replaced on purpose


def set_step_budget(trainer: pl.Trainer, max_steps: int, max_epochs: int) -> None:
    """Set the fit loop's step and epoch limits after `setup` (HF computes them from the data, we do it then)."""
    trainer.fit_loop.epoch_loop.max_steps = max_steps
    trainer.fit_loop.max_epochs = max_epochs


def run_validation_now(trainer: pl.Trainer) -> None:
    """Run the validation loop inside `fit`, now, as Lightning's epoch loop does when it validates.

    Lightning's own call site (`_TrainingEpochLoop.on_advance_end`) saves and restores the logger connector's
    first-iteration flag around the run and sets the trainer's stage flags; this does the same.
    """
    connector = trainer._logger_connector
    first_loop_iter = connector._first_loop_iter
    trainer.validating = True  # picks the validation loop as `trainer._active_loop`
    try:
        trainer.fit_loop.epoch_loop.val_loop.run()
    finally:
        trainer.training = True
        connector._first_loop_iter = first_loop_iter


def restart_train_iterator(trainer: pl.Trainer) -> None:
    """Make the fit loop's train iterator again now (in `on_train_epoch_start`; its first batch is fetched again).

    Lightning makes the first epoch's iterator in `_FitLoop.setup_data`, before any epoch hook, and keeps it for epoch
    0 (`_TrainingEpochLoop.on_run_start`); later epochs get theirs after `on_train_epoch_start`.
    """
    fetcher = trainer.fit_loop._data_fetcher
    if fetcher is not None:  # set by `setup_data`, which runs before any epoch hook
        iter(fetcher)


def defer_validation_data(trainer: pl.Trainer) -> None:
    """Keep Lightning from asking for the validation loaders when the fit starts (it does so for its progress bar):
    HF builds them at each evaluation only (`reload_validation_data` before each run), so an overridden
    `get_eval_dataloader` is called as often as HF calls it."""
    trainer.fit_loop.epoch_loop.val_loop._combined_loader = CombinedLoader([], "sequential")


def reload_validation_data(trainer: pl.Trainer) -> None:
    """Make the next validation run inside `fit` ask the data module for its loaders again (`val_dataloader`).

    Lightning keeps the loaders of its first validation for the whole fit; HF builds them at every evaluation
    (`get_eval_dataloader`), and an evaluation may be on other datasets (`evaluate(eval_dataset=...)` in a subclass).
    """
    trainer.fit_loop.epoch_loop.val_loop._combined_loader = None


def position_in_epoch(trainer: pl.Trainer) -> tuple[int, bool]:
    """`(batches done in the current epoch, whether the last one was the epoch's last)` of the fit loop."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return int(progress.current.ready), bool(progress.is_last_batch)


def set_loop_position(trainer: pl.Trainer, epoch: int, batches: int, global_step: int) -> None:
    """Place the fit loop (before it runs) at `batches` done in epoch `epoch`, after `global_step` optimizer steps.

    - epoch progress = `epoch` finished epochs, so `current_epoch` is `epoch` and `on_train_epoch_start` runs for it;
    - optimizer-step progress (manual and automatic) and `_batches_that_stepped` = `global_step`, which is what
      `trainer.global_step` and the loggers' step read;
    - with `batches > 0` the epoch loop is marked restarting with that many batches done: it keeps the count (so
      `batch_idx` and `is_last_batch` continue) and uses the loader iterator made in `setup_data`.
    """
    fit_loop = trainer.fit_loop
    _set_counters(fit_loop.epoch_progress.total, epoch)
    _set_counters(fit_loop.epoch_progress.current, epoch)
    epoch_loop = fit_loop.epoch_loop
    steps = epoch_loop.manual_optimization.optim_step_progress.total
    steps.ready = steps.completed = global_step
    auto = epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
    auto.ready = auto.completed = global_step
    epoch_loop._batches_that_stepped = global_step
    if batches > 0:
        _set_counters(epoch_loop.batch_progress.total, batches)
        _set_counters(epoch_loop.batch_progress.current, batches)
        epoch_loop._restarting = True  # only this loop: the fit loop starts the epoch normally


def _set_counters(tracker: Any, value: int) -> None:
    """Every counter of a progress tracker (`ready`, `started`, `processed`, `completed`) to `value`."""
    for counter in ("ready", "started", "processed", "completed"):
        setattr(tracker, counter, value)  # the tracker classes declare different subsets of these


@contextmanager
def ignore_mid_epoch_resume_warning() -> Iterator[None]:
    """Within the block, hide Lightning's warning that a plain DataLoader cannot resume mid-epoch.

    Ours can: the sampler starts at the resumed window. Lightning emits it when the epoch loop of the resumed epoch
    starts (`_TrainingEpochLoop.reset`), so `HFTrainerFlow` holds this open from that epoch's `on_train_epoch_start`
    to its first `on_train_batch_start`; every other warning, and every later one, is shown as usual.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_MID_EPOCH_RESUME_WARNING)
        yield


def rank_zero_loggers() -> list[logging.Logger]:
    """The loggers that Lightning's `rank_zero_info` messages go through (the device banner, the fit's stop reason,
    tips): `lightning.pytorch` and `lightning.fabric` each point `rank_zero_info` at a logger named after their
    `rank_zero` module. A `logging.Filter` on these sees every such message (filters do not apply to records that
    only propagate through a logger)."""
    return [logging.getLogger(name) for name in _RANK_ZERO_LOGGERS]


def rich_progress_bar_available() -> bool:
    """Whether Lightning's default progress bar would be its `RichProgressBar` (rich is installed), else tqdm's."""
    return bool(_RICH_AVAILABLE)


def ignore_internal_deprecation_warnings() -> None:
    """Hide the deprecation warnings that Lightning's own code triggers in torch, and only where Lightning's module
    raises them (the same warning from the user's code still shows). Installs process-wide warning filters."""
    for message, module in _INTERNAL_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning, module=module)


def set_ddp_options(strategy: Any, ddp_kwargs: dict[str, Any], backend: str | None, timeout: Any) -> None:
    """Give the `DDPStrategy` Lightning chose by itself (`strategy="auto"` with several processes) HF's DDP options.

    Lightning builds that strategy with its defaults; its constructor arguments are kept in `_ddp_kwargs` (read when
    the model is wrapped), `_process_group_backend` and `_timeout` (read when the process group starts), all before
    `fit` runs. `backend` None keeps Lightning's choice for the device.
    """
    strategy._ddp_kwargs = {**strategy._ddp_kwargs, **ddp_kwargs}
    if backend is not None:
        strategy._process_group_backend = backend
    strategy._timeout = timeout


SignalConnector = _SignalConnector
"""Lightning's signal connector (private): registers the fit's signal handlers when its loop starts and restores the
original handlers at teardown; `flow/preemption.py` subclasses it (see `replace_signal_connector`)."""


def cluster_environment(trainer: pl.Trainer) -> Any:
    """The trainer's cluster environment (`SLURMEnvironment`, `LightningEnvironment`...), as Lightning's signal
    connector reads it (`_accelerator_connector.cluster_environment`)."""
    return trainer._accelerator_connector.cluster_environment


def signal_connector(trainer: pl.Trainer) -> _SignalConnector:
    """The trainer's signal connector (`Trainer._signal_connector`)."""
    return trainer._signal_connector


def replace_signal_connector(trainer: pl.Trainer, connector: Any) -> None:
    """Make `connector` (a `_SignalConnector` subclass) the one Lightning registers at the start of the fit loop and
    tears down at its end (`Trainer._signal_connector`; `trainer.received_sigterm` reads it). Call it before `fit`
    reaches its loop (a callback's `setup` is in time)."""
    trainer._signal_connector = connector
