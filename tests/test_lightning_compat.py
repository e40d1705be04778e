"""Each function of `hf_lightning/_lightning_compat.py` against a real `lightning.Trainer`.

They wrap Lightning internals; when a Lightning release changes one, the test named after it fails here.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch.utils.data import DataLoader, TensorDataset

from hf_lightning import _lightning_compat as compat


class Tiny(pl.LightningModule):
    """A linear regression that records what the loops did."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.val_batches = 0
        self.train_batches: list[int] = []

    def training_step(self, batch, batch_idx):
        self.train_batches.append(batch_idx)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)  # needs the logger connector's state to be consistent
        return loss

    def validation_step(self, batch, batch_idx):
        self.val_batches += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int = 8) -> DataLoader:
    torch.manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 2), torch.randn(n, 1)), batch_size=2)


class _DataModule(pl.LightningDataModule):
    def train_dataloader(self):
        return _loader()

    def val_dataloader(self):
        return _loader(4)


def _trainer(callbacks=(), **kwargs) -> pl.Trainer:
    options = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, max_epochs=1)
    options.update(kwargs)
    return pl.Trainer(callbacks=list(callbacks), **options)


class _Hook(pl.Callback):
    """Runs `fn(trainer, pl_module, ...)` at one hook."""

    def __init__(self, hook: str, fn) -> None:
        setattr(self, hook, lambda trainer, pl_module, *args, **kwargs: fn(trainer, pl_module, *args, **kwargs))


def test_attached_trainer():
    module = Tiny()
    assert compat.attached_trainer(module) is None
    trainer = _trainer()
    trainer.fit(module, train_dataloaders=_loader())
    assert compat.attached_trainer(module) is trainer


def test_callbacks_of_and_datamodule_of():
    hook = _Hook("on_train_end", lambda trainer, module: None)
    trainer = _trainer([hook])
    assert hook in compat.callbacks_of(trainer)
    assert compat.datamodule_of(trainer) is None
    datamodule = _DataModule()
    trainer.fit(Tiny(), datamodule=datamodule)
    assert compat.datamodule_of(trainer) is datamodule


@pytest.mark.parametrize("value", [True, False])
def test_uses_distributed_sampler(value):
    assert compat.uses_distributed_sampler(_trainer(use_distributed_sampler=value)) is value


def test_grad_scaler():
    assert compat.grad_scaler(_trainer()) is None
    scaler = torch.amp.GradScaler("cpu")
    trainer = _trainer(plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    assert compat.grad_scaler(trainer) is scaler


def test_disable_validation_trigger():
    """Lightning validates at the end of the epoch by default; switched off, it never does."""
    module = Tiny()
    _trainer().fit(module, datamodule=_DataModule())
    assert module.val_batches == 2
    module = Tiny()
    _trainer([_Hook("setup", lambda trainer, pl_module, stage: compat.disable_validation_trigger(trainer))]).fit(
        module, datamodule=_DataModule())
    assert module.val_batches == 0


class _CountingDataModule(_DataModule):
    def __init__(self) -> None:
        super().__init__()
        self.val_requests = 0

    def val_dataloader(self):
        self.val_requests += 1
        return super().val_dataloader()


def test_defer_and_reload_validation_data():
    """Lightning asks for the val loaders when a fit starts, and keeps them; deferred, it asks only when a validation
    runs, and again after each `reload_validation_data`."""
    def switch_off(trainer, pl_module, stage):
        compat.disable_validation_trigger(trainer)
        compat.defer_validation_data(trainer)

    def validate(trainer, module, outputs, batch, batch_idx):
        if batch_idx in (1, 2):
            compat.reload_validation_data(trainer)
            compat.run_validation_now(trainer)

    data = _CountingDataModule()
    _trainer([_Hook("setup", lambda trainer, pl_module, stage: compat.disable_validation_trigger(trainer))]).fit(
        Tiny(), datamodule=data)
    assert data.val_requests == 1  # at fit start, never used
    data, module = _CountingDataModule(), Tiny()
    _trainer([_Hook("setup", switch_off)]).fit(module, datamodule=data)
    assert data.val_requests == 0 and module.val_batches == 0
    data, module = _CountingDataModule(), Tiny()
    _trainer([_Hook("setup", switch_off), _Hook("on_train_batch_end", validate)]).fit(module, datamodule=data)
    assert data.val_requests == 2 and module.val_batches == 2 + 2


def test_set_step_budget():
    def budget(trainer, pl_module, stage):
        compat.set_step_budget(trainer, max_steps=3, max_epochs=-1)

    module = Tiny()
    trainer = _trainer([_Hook("setup", budget)], max_epochs=5)
    trainer.fit(module, train_dataloaders=_loader())
    assert trainer.global_step == 3 and module.train_batches == [0, 1, 2]


def test_run_validation_now_inside_fit():
    """A validation run in the middle of an epoch: it runs at once, training continues and logs as before."""
    seen = []

    def validate(trainer, module, outputs, batch, batch_idx):
        if batch_idx == 1:
            compat.run_validation_now(trainer)
            seen.append((module.val_batches, trainer.training, trainer.validating))

    module = Tiny()
    trainer = _trainer([_Hook("on_train_batch_end", validate)], max_steps=4)
    trainer.fit(module, datamodule=_DataModule())
    assert seen == [(2, True, False)]
    assert module.train_batches == [0, 1, 2, 3] and module.val_batches == 2 + 2  # the epoch-end one too
    assert trainer.global_step == 4


def test_position_in_epoch():
    positions = []
    trainer = _trainer([_Hook("on_train_batch_end",
                              lambda trainer, module, *args: positions.append(compat.position_in_epoch(trainer)))])
    trainer.fit(Tiny(), train_dataloaders=_loader())
    assert positions == [(1, False), (2, False), (3, False), (4, True)]


def test_restart_train_iterator_makes_epoch_0s_iterator_after_the_hook():
    """Epoch 0's loader iterator exists before `on_train_epoch_start` (its seed drawn from the global RNG then);
    restarted in the hook, the epoch reads from a new iterator whose seed draw follows the hook's RNG reset."""
    def base_seeds(restart: bool) -> list[int]:
        seeds = []
        original = torch.utils.data.dataloader._BaseDataLoaderIter.__init__

        def record(iterator, loader):
            original(iterator, loader)
            seeds.append(iterator._base_seed)

        def hook(trainer, module):
            torch.manual_seed(123)
            if restart:
                compat.restart_train_iterator(trainer)

        torch.utils.data.dataloader._BaseDataLoaderIter.__init__ = record
        try:
            module = Tiny()
            _trainer([_Hook("on_train_epoch_start", hook)]).fit(module, train_dataloaders=_loader())
        finally:
            torch.utils.data.dataloader._BaseDataLoaderIter.__init__ = original
        assert module.train_batches == [0, 1, 2, 3]
        return seeds

    torch.manual_seed(123)
    expected = int(torch.empty((), dtype=torch.int64).random_().item())
    assert len(base_seeds(restart=False)) == 1 and base_seeds(restart=False)[0] != expected
    assert base_seeds(restart=True)[-1] == expected


def test_set_loop_position_resumes_mid_epoch():
    """Epoch 1, two of four batches done, 5 steps taken: the fit continues at batch 2 and stops after epoch 1."""
    def place(trainer, module):
        compat.set_loop_position(trainer, epoch=1, batches=2, global_step=5)

    epochs = []
    module = Tiny()
    trainer = _trainer([_Hook("on_fit_start", place),
                        _Hook("on_train_epoch_start", lambda trainer, m: epochs.append(trainer.current_epoch))],
                       max_epochs=2)
    with compat.ignore_mid_epoch_resume_warning():
        trainer.fit(module, train_dataloaders=_loader())
    assert epochs == [1]
    assert module.train_batches == [2, 3]
    assert trainer.global_step == 7


def test_ignore_mid_epoch_resume_warning_hides_exactly_lightnings_warning():
    """Without the filter Lightning warns when a loop placed mid-epoch starts; with it, not; later, again."""
    def place(trainer, module):
        compat.set_loop_position(trainer, epoch=0, batches=2, global_step=2)

    with pytest.warns(PossibleUserWarning, match="resuming from a checkpoint that ended before the epoch"):
        _trainer([_Hook("on_fit_start", place)]).fit(Tiny(), train_dataloaders=_loader())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with compat.ignore_mid_epoch_resume_warning():
            _trainer([_Hook("on_fit_start", place)]).fit(Tiny(), train_dataloaders=_loader())
            warnings.warn("another warning", UserWarning, stacklevel=1)
        warnings.warn("You're resuming from a checkpoint that ended before the epoch (after)", UserWarning,
                      stacklevel=1)
    messages = [str(w.message) for w in caught]
    assert not any("ended before the epoch ended" in m for m in messages)
    assert "another warning" in messages and any(m.endswith("(after)") for m in messages)


def test_optimizer_unscales_itself():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert compat.optimizer_unscales_itself(torch.optim.SGD(params, lr=0.1)) is False
    # torch's fused Adam unscales inside step(); Lightning reads the same flag
    assert compat.optimizer_unscales_itself(torch.optim.Adam(params, lr=0.1, fused=True)) is True


class _Recorder(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.messages.append(record.getMessage())
        return True


def test_rank_zero_loggers_carry_lightnings_info_messages():
    """A filter on these loggers sees `rank_zero_info` from both Lightning packages, and the device banner."""
    from lightning.fabric.utilities.rank_zero import rank_zero_info as fabric_info
    from lightning.pytorch.utilities.rank_zero import rank_zero_info as pytorch_info

    recorder = _Recorder()
    loggers = compat.rank_zero_loggers()
    for logger in loggers:
        # first in line: hf_lightning's console filter (installed by any earlier fit in this process) drops a
        # device banner it has shown once, and a filter returning False stops the filters after it
        logger.filters.insert(0, recorder)
    try:
        pytorch_info("from lightning.pytorch")
        fabric_info("from lightning.fabric")
        _trainer()
    finally:
        for logger in loggers:
            logger.removeFilter(recorder)
    assert "from lightning.pytorch" in recorder.messages and "from lightning.fabric" in recorder.messages
    assert any(m.startswith("GPU available:") for m in recorder.messages)


def test_rich_progress_bar_available_is_lightnings_default_choice():
    default_bar = pl.Trainer(accelerator="cpu", logger=False).progress_bar_callback
    assert compat.rich_progress_bar_available() == isinstance(default_bar, RichProgressBar)
    assert compat.rich_progress_bar_available() == (importlib.util.find_spec("rich") is not None)


def test_ignore_internal_deprecation_warnings_only_where_lightning_raises_them():
    """Lightning's `_tree_flatten` (run at every training step) triggers torch's LeafSpec deprecation; the filter
    hides it there, and the same warning raised elsewhere still shows."""
    from lightning.pytorch.utilities._pytree import _tree_flatten

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _tree_flatten(torch.ones(1))
    assert any("LeafSpec" in str(w.message) for w in caught), "Lightning no longer triggers it: drop the filter"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compat.ignore_internal_deprecation_warnings()
        _tree_flatten(torch.ones(1))
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated (here)", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["`isinstance(treespec, LeafSpec)` is deprecated (here)"]


def test_cluster_environment():
    from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

    assert isinstance(compat.cluster_environment(_trainer()), LightningEnvironment)
    slurm = SLURMEnvironment(auto_requeue=True)
    assert compat.cluster_environment(_trainer(plugins=[slurm])) is slurm


def test_replace_signal_connector_is_registered_at_the_loop_and_torn_down_after():
    """The replaced connector is the one Lightning registers when the fit loop starts (its handler is installed
    during training) and tears down at the end (the original handler is back); `received_sigterm` reads it."""
    import signal

    class Connector(compat.SignalConnector):
        def register_signal_handlers(self) -> None:
            self._original_handlers = self._get_current_signal_handlers()
            self._register_signal(signal.SIGTERM, self.handler)

        def handler(self, signum, frame) -> None:
            self.received_sigterm = True

    before = signal.getsignal(signal.SIGTERM)
    seen = []
    trainer = _trainer([_Hook("on_train_batch_start", lambda trainer, module, *_: seen.append(
        signal.getsignal(signal.SIGTERM)))])
    connector = Connector(trainer)
    compat.replace_signal_connector(trainer, connector)
    trainer.fit(Tiny(), train_dataloaders=_loader())
    assert seen and all(handler == connector.handler for handler in seen)
    assert signal.getsignal(signal.SIGTERM) is before
    connector.received_sigterm = True
    assert trainer.received_sigterm
