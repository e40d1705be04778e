"""The task registry: what a task name means for the model class, the preprocessing, the collator and the metrics.

A task is data, not a subclass: adding seq2seq or generation evaluation is one `register_task(Task(...))` call with
its own functions. This module imports nothing heavy, so the CLI can list the names cheaply.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from hf_lightning.tasks import generation, text  # noqa: F401  (importing them registers the built-in presets)
from hf_lightning.tasks.task import Task, register_task, registered_tasks

_TASKS = registered_tasks()

__all__ = [
    "LIBRARY_TRAINER_TASKS", "Task", "register_task", "get_task", "task_names", "resolve", "args_for_task",
    "GENERATION_ARGS",
]

GENERATION_ARGS = "hf_lightning.seq2seq.args.Seq2SeqTrainingArguments"
"""The widest `args` class: the CLI parser accepts its fields for every task (`args_for_task` narrows them)."""


def task_names() -> list[str]:
    """Registered task names, sorted."""
    return sorted(_TASKS)


LIBRARY_TRAINER_TASKS = {
    "sft": "TRL's SFTTrainer", "dpo": "TRL's DPOTrainer", "grpo": "TRL's GRPOTrainer", "reward": "TRL's RewardTrainer",
    "sentence_transformers": "sentence-transformers' SentenceTransformerTrainer",
}
"""Task names that mean a library's `transformers.Trainer` subclass, which the CLI runs only from a config naming
it (`cli/library_config.py`; `sft`, `dpo` and `grpo` are routed there before `get_task` is asked)."""

_LIBRARY_TRAINER_HELP = (
    "the CLI runs a library trainer from a config that names it, `trainer_class` and `args_class` "
    "(configs/sft.yaml, configs/dpo.yaml, configs/grpo.yaml run TRL's SFT, DPO and GRPO trainers; `task: sft` / "
    "`dpo` / `grpo` are their short forms), built as transformers.Trainer is "
    "(model, args, train_dataset, eval_dataset, processing_class) from the config's model and data. For {what}, name "
    "it there the same way, or, where its constructor needs more (a reward model, a SentenceTransformer model), "
    "run it from Python with `hf_lightning.use_as_transformers_trainer()` before importing the library "
    "(examples/run_sft.py; README \"TRL and sentence-transformers trainers\")."
)


def get_task(name: str) -> Task:
    """The task called `name`.

    Raises:
        ValueError: unknown name (the message lists the registered ones); a library trainer's name (`dpo`...)
            says how the CLI runs a library trainer and what runs it instead.
    """
    if name not in _TASKS and name in LIBRARY_TRAINER_TASKS:
        raise ValueError(f"task={name!r} is not a CLI task: "
                         + _LIBRARY_TRAINER_HELP.format(what=LIBRARY_TRAINER_TASKS[name]))
    if name not in _TASKS:
        raise ValueError(f"task={name!r} is not a registered task; allowed: {', '.join(sorted(_TASKS))}.")
    return _TASKS[name]


def resolve(path: str) -> Any:
    """The object a dotted path names (`package.module.Name`)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def args_for_task(task: Task, values: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """`(args_class, values it accepts)` for `task`: fields of the wider generation arguments are dropped when
    they hold their default, rejected otherwise (a generation option given to, say, a classification task).

    Raises:
        ValueError: a non-default generation field for a task whose `args_class` lacks it, naming the key.
    """
    cls = resolve(task.args_class)
    known = {f.name for f in dataclasses.fields(cls)}
    defaults = {f.name: f.default for f in dataclasses.fields(resolve(GENERATION_ARGS))}
    for key, value in values.items():
        if key not in known and key in defaults and value != defaults[key]:
            generating = ", ".join(name for name in sorted(_TASKS) if _TASKS[name].generates)
            raise ValueError(f"args.{key}={value!r} is a generation option, for task {generating} only; "
                             f"task={task.name!r} does not generate.")
    return cls, {k: v for k, v in values.items() if k in known or k not in defaults}
