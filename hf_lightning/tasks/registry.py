"""The task registry: what a task name means for the model class, the preprocessing, the collator and the metrics.

A task is data, not a subclass: adding seq2seq or generation evaluation is one `register_task(Task(...))` call with
its own functions. This module imports nothing heavy, so the CLI can list the names cheaply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Task", "register_task", "get_task", "task_names"]


@dataclass(frozen=True)
class Task:
    """One task preset.

    Attributes:
        name: the `task:` value in a config.
        auto_class: the `transformers` Auto class that builds the model (e.g. `AutoModelForCausalLM`).
        preprocess: `fn(dataset, tokenizer, data_spec, label2id) -> dataset` of model inputs (a `datasets.map`).
        collator: `fn(tokenizer, data_spec) -> collator`.
        label_values: `fn(dataset, data_spec) -> list of label values` for tasks with classes, else None.
        compute_metrics: `fn(EvalPrediction) -> dict`, or None (loss only).
    """

    name: str
    auto_class: str
    preprocess: Callable[..., Any]
    collator: Callable[..., Any]
    label_values: Callable[..., list[Any]] | None = None
    compute_metrics: Callable[..., dict[str, float]] | None = None


_TASKS: dict[str, Task] = {}


def register_task(task: Task) -> None:
    """Add (or replace) a task preset."""
    _TASKS[task.name] = task


def task_names() -> list[str]:
    """Registered task names, sorted."""
    _load_builtin()
    return sorted(_TASKS)


def get_task(name: str) -> Task:
    """The task called `name`.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
    """
    _load_builtin()
    if name not in _TASKS:
        raise ValueError(f"task={name!r} is not a registered task; allowed: {', '.join(sorted(_TASKS))}.")
    return _TASKS[name]


def _load_builtin() -> None:
    if not _TASKS:
        from hf_lightning.tasks import text  # noqa: F401  (registers the text tasks)
