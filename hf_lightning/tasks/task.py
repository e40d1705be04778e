"""`Task`: what a task name means (model class, preprocessing, collator, metrics), and the table of registered ones.

The presets (`text.py`, `generation.py`) register themselves here when imported; `registry.py` imports them, so
the registry is complete whenever it is used. Nothing here imports a preset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Task", "register_task", "registered_tasks"]


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
        length_fields: the `data.` fields that bound a tokenised row (`max_length`; `block_size` for language
            modelling), checked against the model's position embeddings before training (`checks.check_lengths`).
    """

    name: str
    auto_class: str
    preprocess: Callable[..., Any]
    collator: Callable[..., Any]
    label_values: Callable[..., list[Any]] | None = None
    compute_metrics: Callable[..., dict[str, float]] | None = None
    args_class: str = "hf_lightning.args.TrainingArguments"
    module_class: str = "hf_lightning.module.module.TransformerModule"
    build_metrics: Callable[..., Any] | None = None
    model_defaults: Callable[..., dict[str, Any]] | None = None
    generates: bool = False
    length_fields: tuple[str, ...] = ("max_length",)


_TASKS: dict[str, Task] = {}


def register_task(task: Task) -> None:
    """Add (or replace) a task preset."""
    _TASKS[task.name] = task


def registered_tasks() -> dict[str, Task]:
    """The registered tasks by name (the table itself: `register_task` adds to it)."""
    return _TASKS
