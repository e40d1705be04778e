"""The progress bar of an hf_lightning run: Lightning's own (rich when installed, else tqdm), showing what an HF
user reads in HF's bar and logs: updates, the training loss and the latest evaluation's metrics; not Lightning's
`v_num` (the logger version). Epochs are counted from 1 as HF counts them (`Epoch 3/3` in the last epoch of a
3-epoch run; Lightning's own bar says `Epoch 2/2`)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from transformers import TrainerState
from typing_extensions import override

from hf_lightning._lightning_compat import callbacks_of, rich_progress_bar_available
from hf_lightning.console import latest_eval_metrics

__all__ = ["HFRichProgressBar", "HFTQDMProgressBar", "adopt_bar", "epoch_description", "progress_bar"]


def epoch_description(current_epoch: int, max_epochs: int | None) -> str:
    """`Epoch <n>/<total>` counted from 1 (HF's epochs); without a known total (-1, None: unsized data) `Epoch <n>`."""
    total = f"/{max_epochs}" if max_epochs is not None and max_epochs > 0 else ""
    return f"Epoch {current_epoch + 1}{total}"


class _HFMetrics:
    """The bar's items without `v_num`, plus the latest evaluation's metrics while training."""

    _eval_metrics: tuple[int, dict[str, float]] = (-1, {})
    """`(len(log_history), latest_eval_metrics(log_history))`: recomputed only when the history has grown."""

    def hf_items(self, trainer: pl.Trainer, items: dict[str, Any]) -> dict[str, Any]:
        items.pop("v_num", None)
        if not trainer.training:
            return items
        # the flow by its state key: this module is imported by the flow's console set-up (no import back)
        flow = next((cb for cb in callbacks_of(trainer) if getattr(cb, "state_key", None) == "HFTrainerFlow"), None)
        state: TrainerState | None = getattr(flow, "state", None)
        if state is not None:
            history = state.log_history
            if self._eval_metrics[0] != len(history):  # the bar refreshes every update; the history grows at logs
                self._eval_metrics = (len(history), latest_eval_metrics(history))
            items.update(self._eval_metrics[1])
        return items


class HFRichProgressBar(_HFMetrics, RichProgressBar):
    """Lightning's `RichProgressBar` with the items of `_HFMetrics` and HF's epoch count."""

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        return self.hf_items(trainer, super().get_metrics(trainer, pl_module))

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        description = epoch_description(current_epoch, self.trainer.max_epochs)
        # as Lightning's: padded to the validation bar's description, so the two do not flicker
        return f"{description:{len(self.validation_description)}}"


class HFTQDMProgressBar(_HFMetrics, TQDMProgressBar):
    """Lightning's `TQDMProgressBar` with the items of `_HFMetrics` and HF's epoch count."""

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        return self.hf_items(trainer, super().get_metrics(trainer, pl_module))

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.train_progress_bar.set_description(epoch_description(trainer.current_epoch, trainer.max_epochs))


def progress_bar() -> RichProgressBar | TQDMProgressBar:
    """The bar Lightning would pick by default (rich when installed), with hf_lightning's items."""
    return HFRichProgressBar() if rich_progress_bar_available() else HFTQDMProgressBar()


def adopt_bar(bar: Any) -> bool:
    """Give Lightning's own bar (exactly `RichProgressBar` / `TQDMProgressBar`, the one a plain `lightning.Trainer`
    adds) hf_lightning's items, keeping its settings (theme, refresh rate); True when it was adopted. A bar of
    another class (the user's own) is left alone."""
    adopted = {RichProgressBar: HFRichProgressBar, TQDMProgressBar: HFTQDMProgressBar}.get(type(bar))
    if adopted is None:
        return False
    bar.__class__ = adopted  # the subclasses add methods only, no state
    return True
