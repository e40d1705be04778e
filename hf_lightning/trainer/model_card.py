"""`create_model_card`: the README.md model card HF's `Trainer.create_model_card` writes, without the hub.

HF builds the card with `TrainingSummary.from_trainer` (transformers `modelcard.py`): metadata (library, language,
license, base model, tags, datasets, metrics and the model index), the "fine-tuned version of ... on ..." line, the
final evaluation results, the hyper-parameters, a table of the evaluations during training and the framework versions.
Here the same summary is filled from our trainer's state (`model_card_summary`) and rendered by HF's own
`TrainingSummary.to_model_card`, so the text is HF's. Differences, each on purpose:

- no hub request: HF looks the base model's license up on the hub when `license` is not given; here only the
  `license` argument counts (offline, nothing is guessed);
- the framework versions also list Lightning and hf_lightning, which did the training;
- a dataset built in memory (`Dataset.from_dict`, no builder) is "an unknown dataset", where HF writes "the None
  dataset" and a `null` dataset tag.
"""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard
from torch import nn
from transformers.modelcard import TASK_MAPPING, TrainingSummary, is_hf_dataset, parse_log_history

from hf_lightning.args import TrainingArguments

__all__ = ["hyperparameters_of", "model_card_summary", "render_model_card", "write_model_card"]

_FILE_DATASETS = ("csv", "json", "pandas", "parquet", "text")  # builders of local files: not hub datasets (HF's list)
_HF_TAG = "generated_from_trainer"


class _OfflineSummary(TrainingSummary):
    """HF's summary without its `__post_init__`, which asks the hub for the base model's license."""

    def __post_init__(self) -> None:
        return None


def hyperparameters_of(args: TrainingArguments, model_world_size: int) -> dict[str, Any]:
    """The "Training hyperparameters" list, with HF's keys and rules (transformers `modelcard.py`:
    `extract_hyperparameters_from_trainer`).

    Args:
        args: the training arguments.
        model_world_size: processes of the run (1 for a single process).
    """
    out: dict[str, Any] = {
        "learning_rate": args.learning_rate, "train_batch_size": args.train_batch_size,
        "eval_batch_size": args.eval_batch_size, "seed": args.seed,
    }
    if model_world_size > 1:
        out["distributed_type"] = "multi-GPU"  # HF's name for its DISTRIBUTED mode, whatever the device
        out["num_devices"] = model_world_size
    if args.gradient_accumulation_steps > 1:
        out["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    total_train = args.train_batch_size * model_world_size * args.gradient_accumulation_steps
    if total_train != out["train_batch_size"]:
        out["total_train_batch_size"] = total_train
    total_eval = args.eval_batch_size * model_world_size
    if total_eval != out["eval_batch_size"]:
        out["total_eval_batch_size"] = total_eval
    # HF's f-string of its str enum: `OptimizerNames.ADAMW_TORCH_FUSED` on Python >= 3.11 (the file is HF's text)
    optimizer = f"{args.optim}"
    if optimizer:
        extra = args.optim_args or "No additional optimizer arguments"
        if "adam" in optimizer.lower():
            out["optimizer"] = (f"Use {optimizer} with betas=({args.adam_beta1},{args.adam_beta2}) and "
                                f"epsilon={args.adam_epsilon} and optimizer_args={extra}")
        else:
            out["optimizer"] = f"Use {optimizer} and the args are:\n{extra}"
    out["lr_scheduler_type"] = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    if args.warmup_steps != 0.0:
        out["lr_scheduler_warmup_steps"] = args.warmup_steps
    if args.max_steps != -1:
        out["training_steps"] = args.max_steps
    else:
        out["num_epochs"] = args.num_train_epochs
    if args.fp16:
        out["mixed_precision_training"] = "Native AMP"
    if args.label_smoothing_factor != 0.0:
        out["label_smoothing_factor"] = args.label_smoothing_factor
    return out


def _task_of(model: Any) -> str | None:
    """HF's task tag for the model's class (the last task whose Auto mapping names the class, as HF's loop)."""
    name, found = type(model).__name__, None
    mappings: dict[str, Any] = dict(TASK_MAPPING)
    for task, mapping in mappings.items():
        names = [n for v in mapping.values() for n in (v if isinstance(v, (list, tuple)) else [v])]
        if name in names:
            found = task
    return found


def model_card_summary(
    model: nn.Module, args: TrainingArguments, log_history: list[dict[str, Any]], dataset: Any, world_size: int = 1, *,
    language: str | list[str] | None = None, license: str | None = None, tags: str | list[str] | None = None,
    model_name: str | None = None, finetuned_from: str | None = None, tasks: str | list[str] | None = None,
    dataset_tags: str | list[str] | None = None, dataset_name: str | list[str] | None = None,
    dataset_args: str | list[str] | None = None, dataset_metadata: Any = None,
) -> TrainingSummary:
    """HF's `TrainingSummary.from_trainer`, from explicit parts instead of a `transformers.Trainer`.

    Args:
        model: the trained model (its class gives the task, its config's `_name_or_path` the base model).
        args: the training arguments.
        log_history: `state.log_history` (evaluation table and final results).
        dataset: the eval dataset, else the train dataset (a hub dataset gives the dataset tags).
        world_size: processes of the run.
        language: the model's language(s), as HF's `create_model_card` argument.
        license: the license (never looked up on the hub).
        tags: tags; `generated_from_trainer` is always added.
        model_name: the card's title; default: the name of `output_dir`.
        finetuned_from: the base model; default: the config's `_name_or_path` unless it is a local folder.
        tasks: task tag(s); default: from the model's class.
        dataset_tags: dataset tag(s); default: a hub dataset's builder name.
        dataset_name: dataset name(s) for the text (HF's `dataset` argument); default: `dataset_tags`.
        dataset_args: dataset argument(s) (a hub dataset's config name).
        dataset_metadata: per-dataset metadata (a hub dataset's config and split).
    """
    if is_hf_dataset(dataset) and (dataset_tags is None or dataset_args is None or dataset_metadata is None):
        builder = dataset.builder_name
        if builder is not None and builder not in _FILE_DATASETS:  # HF writes "the None dataset" for in-memory data
            dataset_metadata = dataset_metadata or [{"config": dataset.config_name, "split": str(dataset.split)}]
            dataset_tags = dataset_tags or [builder]
            dataset_args = dataset_args or [dataset.config_name]
    if dataset_name is None and dataset_tags is not None:
        dataset_name = dataset_tags
    name_or_path = getattr(getattr(model, "config", None), "_name_or_path", None)
    if finetuned_from is None and name_or_path is not None and not os.path.isdir(name_or_path):
        finetuned_from = name_or_path  # a hub name; a local folder says nothing to a reader
    if tasks is None:
        tasks = _task_of(model)
    if model_name is None:
        model_name = Path(args.resolved_output_dir).name
    if not model_name:
        model_name = finetuned_from or ""
    if tags is None:
        tags = [_HF_TAG]
    elif isinstance(tags, str):
        tags = [tags] if tags == _HF_TAG else [tags, _HF_TAG]
    elif _HF_TAG not in tags:
        tags = [*tags, _HF_TAG]
    _, eval_lines, eval_results = parse_log_history(log_history)
    return _OfflineSummary(
        model_name=model_name, language=language, license=license, tags=tags, finetuned_from=finetuned_from,
        tasks=tasks, dataset=dataset_name, dataset_tags=dataset_tags, dataset_args=dataset_args,
        dataset_metadata=dataset_metadata, eval_results=eval_results, eval_lines=eval_lines,
        hyperparameters=hyperparameters_of(args, world_size),
    )


def render_model_card(summary: TrainingSummary) -> str:
    """HF's card text for `summary`, with Lightning and hf_lightning added to the framework versions."""
    card = summary.to_model_card()
    return card + f"- Lightning {version('lightning')}\n- hf_lightning {version('hf-lightning')}\n"


def write_model_card(output_dir: str, model: nn.Module, args: TrainingArguments, log_history: list[dict[str, Any]],
                     dataset: Any, world_size: int = 1, **card_fields: Any) -> Path:
    """Write `<output_dir>/README.md` as HF's `Trainer.create_model_card` does, offline; returns its path.

    Tags of an existing README.md are kept (HF's rule), and a PEFT adapter's card is then updated by PEFT.

    Args:
        output_dir: the run's output folder.
        model: the trained model.
        args: the training arguments.
        log_history: `state.log_history`.
        dataset: the eval (else train) dataset.
        world_size: processes of the run.
        card_fields: `create_model_card`'s keyword arguments (`dataset` named `dataset_name`).
    """
    path = Path(output_dir) / "README.md"
    is_peft = False
    if path.exists():
        existing = ModelCard.load(path).data
        is_peft = existing.get("library_name") == "peft"
        tags = card_fields.get("tags")
        if tags is not None and existing.tags is not None:
            tags = [tags] if isinstance(tags, str) else list(tags)
            card_fields["tags"] = tags + [tag for tag in existing.tags if tag not in tags]
    summary = model_card_summary(model, args, log_history, dataset, world_size, **card_fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_model_card(summary), encoding="utf-8")
    update_card = getattr(model, "create_or_update_model_card", None)  # a PEFT model's method
    if is_peft and callable(update_card):
        update_card(output_dir)
    return path
