"""Building the `lightning.Trainer` and its callbacks, shared by the `Trainer` facade and the `hf-lightning` CLI.

Both entry points build the `HFTrainerFlow` callback and the `lightning.Trainer` (keyword arguments from
`args/to_lightning.py`) with these functions, and resolve the resume checkpoint with `resume.find.resolve_resume`,
so a behaviour cannot exist in one of them only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar
from transformers import TrainerCallback

from hf_lightning.args import TrainingArguments
from hf_lightning.args.parallel import StrategyRequest
from hf_lightning.callbacks.progress_bar import progress_bar
from hf_lightning.console import install_console_filters
from hf_lightning.contracts import HFLoopHooks
from hf_lightning.flow.flow import FLOW_RESUME_HINT, HFTrainerFlow
from hf_lightning.module.micro_batching import MicroBatchRecord
from hf_lightning.parallel.strategies import adopt_ddp_options, build_strategy
from hf_lightning.run_options.batch_search import run_with_batch_search
from hf_lightning.run_options.device_cache import empty_device_cache

__all__ = ["is_hf_callback", "split_callbacks", "build_flow", "build_lightning_trainer", "fit_with_batch_search"]

T = TypeVar("T")


def is_hf_callback(callback: Any) -> bool:
    """Whether `callback` is a `transformers.TrainerCallback` instance or class (else: a Lightning callback)."""
    if isinstance(callback, type):
        return issubclass(callback, TrainerCallback)
    return isinstance(callback, TrainerCallback)


def split_callbacks(callbacks: list[Any] | None) -> tuple[list[Any], list[Any]]:
    """`(hf_callbacks, lightning_callbacks)`, each in the given order."""
    callbacks = list(callbacks or [])
    return [cb for cb in callbacks if is_hf_callback(cb)], [cb for cb in callbacks if not is_hf_callback(cb)]


def build_flow(
    args: TrainingArguments, hf_callbacks: list[Any] | None, processing_class: Any,
    resume_hint: str = FLOW_RESUME_HINT, owner: HFLoopHooks | None = None, overridden: frozenset[str] = frozenset(),
) -> HFTrainerFlow:
    """The `HFTrainerFlow` callback for these arguments and HF callbacks (`owner`, `overridden`, `resume_hint`: see
    `HFTrainerFlow`)."""
    return HFTrainerFlow(args, list(hf_callbacks or []), processing_class, owner=owner, overridden=overridden,
                         resume_hint=resume_hint)


def build_lightning_trainer(
    flow: HFTrainerFlow, lightning_callbacks: list[Any], trainer_kwargs: dict[str, Any]
) -> pl.Trainer:
    """`lightning.Trainer` with the flow first, then the user's callbacks (also those in `trainer_kwargs`).

    `trainer_kwargs` is the output of `args.to_lightning.lightning_trainer_kwargs`; its `StrategyRequest` (HF's
    strategy fields) becomes a fresh Lightning strategy here, one per trainer. Unless a progress bar is given or
    disabled, hf_lightning's bar is added (`callbacks/progress_bar.py`); `console.install_console_filters` keeps the
    output to the bar, the summary and real warnings.
    """
    install_console_filters()
    flow.lightning_console = True  # `trainer_kwargs` (args/to_lightning.py) decide the summary, bar and log interval
    kwargs = dict(trainer_kwargs)
    extra = kwargs.pop("callbacks", None) or []
    extra = extra if isinstance(extra, list) else [extra]
    # auto_micro_batch: first, so DDP's sync is given back before the flow's `on_train_batch_end` evaluates
    record = [MicroBatchRecord()] if flow.args.auto_micro_batch else []
    callbacks = [*record, flow, *lightning_callbacks, *extra]
    if kwargs.get("enable_progress_bar", True) and not any(isinstance(cb, ProgressBar) for cb in callbacks):
        callbacks.append(progress_bar())
    request = kwargs.get("strategy")
    if isinstance(request, StrategyRequest):
        kwargs["strategy"] = build_strategy(request)
    trainer = pl.Trainer(callbacks=callbacks, **kwargs)
    if isinstance(request, StrategyRequest):
        adopt_ddp_options(trainer.strategy, request)
    return trainer


def fit_with_batch_search(args: TrainingArguments, resume: str | bool | None, fit: Callable[[], T]) -> T:
    """`fit()` once, or with `auto_find_batch_size` again from the start with a smaller per-device batch after each
    out-of-memory error (`run_options/batch_search.py`). `fit` must build a fresh `lightning.Trainer` on every call.

    `args.per_device_train_batch_size` holds the size being tried during the runs (the data module, the state and
    DeepSpeed read it) and gets the user's value back afterwards; `state.train_batch_size` records the size that fit.
    A resumed run starts from the checkpoint's `train_batch_size`, as HF's.
    """
    if not args.auto_find_batch_size:
        return fit()
    start = args.per_device_train_batch_size
    state_file = os.path.join(resume, "trainer_state.json") if isinstance(resume, str) else None
    if state_file is not None and os.path.isfile(state_file):
        with open(state_file) as f:
            start = json.load(f).get("train_batch_size") or start
    original = args.per_device_train_batch_size

    def attempt(batch_size: int) -> T:
        args.per_device_train_batch_size = batch_size
        return fit()

    try:
        return run_with_batch_search(attempt, start, lambda: empty_device_cache(collect_garbage=True))
    finally:
        args.per_device_train_batch_size = original
