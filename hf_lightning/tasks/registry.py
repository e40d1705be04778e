"""The task registry: what a task name means for the model class, the preprocessing, the collator and the metrics.

A task is data, not a subclass: adding seq2seq or generation evaluation is one `register_task(Task(...))` call with
its own functions. This module imports nothing heavy, so the CLI can list the names cheaply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Task", "register_task", "get_task", "task_names", "resolve", "args_for_task", "GENERATION_ARGS"]

GENERATION_ARGS = "hf_lightning.seq2seq.args.Seq2SeqTrainingArguments"
"""The widest `args` class: the CLI parser accepts its fields for every task (`args_for_task` narrows them)."""


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
        args_class: dotted path of the `args:` dataclass (the generation tasks take `Seq2SeqTrainingArguments`).
        module_class: dotted path of the LightningModule class (e.g. `Seq2SeqTransformerModule`).
        build_metrics: `fn(tokenizer, args) -> compute_metrics or None`, for metrics that need the tokenizer
            (replaces `compute_metrics` when set).
        model_defaults: `fn(tokenizer) -> dict` of config arguments for a random init (e.g. the EOS and decoder
            start ids of the tokenizer); `model.config_kwargs` override them.
        generates: whether `predict` can decode generated ids into texts (`predictions.jsonl`).
    """

    name: str
    auto_class: str
    preprocess: Callable[..., Any]
    collator: Callable[..., Any]
    label_values: Callable[..., list[Any]] | None = None
    compute_metrics: Callable[..., dict[str, float]] | None = None
    args_class: str = "hf_lightning.args.TrainingArguments"
    module_class: str = "hf_lightning.module.TransformerModule"
    build_metrics: Callable[..., Any] | None = None
    model_defaults: Callable[..., dict[str, Any]] | None = None
    generates: bool = False


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


def resolve(path: str) -> Any:
    """The object a dotted path names (`package.module.Name`)."""
    import importlib

    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def args_for_task(task: Task, values: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """`(args_class, values it accepts)` for `task`: fields of the wider generation arguments are dropped when
    they hold their default, rejected otherwise (a generation option given to, say, a classification task).

    Raises:
        ValueError: a non-default generation field for a task whose `args_class` lacks it, naming the key.
    """
    import dataclasses

    cls = resolve(task.args_class)
    known = {f.name for f in dataclasses.fields(cls)}
    defaults = {f.name: f.default for f in dataclasses.fields(resolve(GENERATION_ARGS))}
    for key, value in values.items():
        if key not in known and key in defaults and value != defaults[key]:
            generating = ", ".join(name for name in sorted(_TASKS) if _TASKS[name].generates)
            raise ValueError(f"args.{key}={value!r} is a generation option, for task {generating} only; "
                             f"task={task.name!r} does not generate.")
    return cls, {k: v for k, v in values.items() if k in known or k not in defaults}


def _load_builtin() -> None:
    if not _TASKS:
        from hf_lightning.tasks import generation, text  # noqa: F401  (register the built-in tasks)
