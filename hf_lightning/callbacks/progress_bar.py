"""The progress bar of an hf_lightning run: Lightning's own (rich when installed, else tqdm), showing what an HF
user reads in HF's bar and logs: updates, the training loss and the latest evaluation's metrics; not Lightning's
`v_num` (the logger version)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from typing_extensions import override

from hf_lightning._lightning_compat import callbacks_of, rich_progress_bar_available
from hf_lightning.callbacks.flow import HFTrainerFlow
from hf_lightning.console import latest_eval_metrics

__all__ = ["HFRichProgressBar", "HFTQDMProgressBar", "progress_bar"]


class _HFMetrics:
    """The bar's items without `v_num`, plus the latest evaluation's metrics while training."""

    _eval_metrics: tuple[int, dict[str, float]] = (-1, {})
    """`(len(log_history), latest_eval_metrics(log_history))`: recomputed only when the history has grown."""

    def hf_items(self, trainer: pl.Trainer, items: dict[str, Any]) -> dict[str, Any]:
        items.pop("v_num", None)
        if not trainer.training:
            return items
        flow = next((cb for cb in callbacks_of(trainer) if isinstance(cb, HFTrainerFlow)), None)
        if flow is not None:
            history = flow.state.log_history
            if self._eval_metrics[0] != len(history):  # the bar refreshes every update; the history grows at logs
                self._eval_metrics = (len(history), latest_eval_metrics(history))
            items.update(self._eval_metrics[1])
        return items


class HFRichProgressBar(_HFMetrics, RichProgressBar):
    """Lightning's `RichProgressBar` with the items of `_HFMetrics`."""

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        return self.hf_items(trainer, super().get_metrics(trainer, pl_module))


class HFTQDMProgressBar(_HFMetrics, TQDMProgressBar):
    """Lightning's `TQDMProgressBar` with the items of `_HFMetrics`."""

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        return self.hf_items(trainer, super().get_metrics(trainer, pl_module))


def progress_bar() -> RichProgressBar | TQDMProgressBar:
    """The bar Lightning would pick by default (rich when installed), with hf_lightning's items."""
    return HFRichProgressBar() if rich_progress_bar_available() else HFTQDMProgressBar()
