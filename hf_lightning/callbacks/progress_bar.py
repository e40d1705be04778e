"""The progress bar of an hf_lightning run: Lightning's own (rich when installed, else tqdm), showing what an HF
user reads in HF's bar and logs: updates, the training loss and the latest evaluation's metrics; not Lightning's
`v_num` (the logger version)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

from hf_lightning.console import latest_eval_metrics

__all__ = ["HFRichProgressBar", "HFTQDMProgressBar", "progress_bar"]


class _HFMetrics:
    """`get_metrics` without `v_num`, plus the latest evaluation's metrics while training."""

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        items.pop("v_num", None)
        if trainer.training:
            from hf_lightning.callbacks.flow import HFTrainerFlow

            flow = next((cb for cb in trainer.callbacks if isinstance(cb, HFTrainerFlow)), None)
            if flow is not None:
                history = flow.state.log_history
                cached = getattr(self, "_hf_eval_metrics", (-1, {}))
                if cached[0] != len(history):  # the bar refreshes every update; the history grows at log steps
                    cached = (len(history), latest_eval_metrics(history))
                    self._hf_eval_metrics = cached
                items.update(cached[1])
        return items


class HFRichProgressBar(_HFMetrics, RichProgressBar):
    """Lightning's `RichProgressBar` with the metrics of `_HFMetrics`."""


class HFTQDMProgressBar(_HFMetrics, TQDMProgressBar):
    """Lightning's `TQDMProgressBar` with the metrics of `_HFMetrics`."""


def progress_bar() -> RichProgressBar | TQDMProgressBar:
    """The bar Lightning would pick by default (rich when installed), with hf_lightning's metrics."""
    return HFRichProgressBar() if _RICH_AVAILABLE else HFTQDMProgressBar()
