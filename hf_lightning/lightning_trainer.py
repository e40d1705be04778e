"""Building the `lightning.Trainer` and its callbacks, shared by the `Trainer` facade and the `hf-lightning` CLI.

Both entry points build the `HFTrainerFlow` callback and the `lightning.Trainer` (keyword arguments from
`args/to_lightning.py`) with these functions, and resolve the resume checkpoint with `resume.find.resolve_resume`,
so a behaviour cannot exist in one of them only.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from transformers import TrainerCallback

from hf_lightning.args import TrainingArguments
from hf_lightning.args.parallel import StrategyRequest
from hf_lightning.callbacks.flow import HFTrainerFlow
from hf_lightning.parallel.strategies import adopt_ddp_options, build_strategy

__all__ = ["is_hf_callback", "split_callbacks", "build_flow", "build_lightning_trainer"]


def is_hf_callback(callback: Any) -> bool:
    """Whether `callback` is a `transformers.TrainerCallback` instance or class (else: a Lightning callback)."""
    if isinstance(callback, type):
        return issubclass(callback, TrainerCallback)
    return isinstance(callback, TrainerCallback)


def split_callbacks(callbacks: list[Any] | None) -> tuple[list[Any], list[Any]]:
    """`(hf_callbacks, lightning_callbacks)`, each in the given order."""
    callbacks = list(callbacks or [])
    return [cb for cb in callbacks if is_hf_callback(cb)], [cb for cb in callbacks if not is_hf_callback(cb)]


def build_flow(args: TrainingArguments, hf_callbacks: list[Any] | None, processing_class: Any) -> HFTrainerFlow:
    """The `HFTrainerFlow` callback for these arguments and HF callbacks."""
    return HFTrainerFlow(args, list(hf_callbacks or []), processing_class)


def build_lightning_trainer(
    flow: HFTrainerFlow, lightning_callbacks: list[Any], trainer_kwargs: dict[str, Any]
) -> pl.Trainer:
    """`lightning.Trainer` with the flow first, then the user's callbacks (also those in `trainer_kwargs`).

    `trainer_kwargs` is the output of `args.to_lightning.lightning_trainer_kwargs`; its `StrategyRequest` (HF's
    strategy fields) becomes a fresh Lightning strategy here, one per trainer.
    """
    kwargs = dict(trainer_kwargs)
    extra = kwargs.pop("callbacks", None) or []
    extra = extra if isinstance(extra, list) else [extra]
    request = kwargs.get("strategy")
    if isinstance(request, StrategyRequest):
        kwargs["strategy"] = build_strategy(request)
    trainer = pl.Trainer(callbacks=[flow, *lightning_callbacks, *extra], **kwargs)
    if isinstance(request, StrategyRequest):
        adopt_ddp_options(trainer.strategy, request)
    return trainer
