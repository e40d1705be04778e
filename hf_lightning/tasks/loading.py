"""Loading what a config names: raw dataset splits, the tokenizer, the label list and the model.

Real `from_pretrained` code paths (a local directory or a hub name), or a random init from a config class.
No model object ever goes into hyperparameters: the config keeps names and numbers only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint.verify import require_verified
from hf_lightning.plan import evaluates_during_fit
from hf_lightning.tasks.code_paths import import_checked, is_auto_class, is_config_class
from hf_lightning.tasks.specs import DataSpec, ModelSpec
from hf_lightning.tasks.task import Task

__all__ = ["check_files", "load_split", "split_source", "splits_for_stage", "load_tokenizer", "label_list_for",
           "build_model", "FILE_BUILDERS"]

FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}
"""File extension -> `datasets` builder."""


def split_source(spec: DataSpec, split: str) -> tuple[str, str | None]:
    """`(key, file_or_split)` for split `train`, `validation` or `test` (test falls back to validation)."""
    if spec.dataset_name is None:
        files = {"train": spec.train_file, "validation": spec.validation_file, "test": spec.test_file}
        if split == "test" and files["test"] is None:
            return "data.validation_file", files["validation"]
        return f"data.{split}_file", files[split]
    names = {"train": spec.train_split, "validation": spec.validation_split,
             "test": spec.test_split or spec.validation_split}
    return f"data.{split}_split", names[split]


def splits_for_stage(stage: str, args: TrainingArguments) -> list[str]:
    """Raw splits a run needs: fit -> train (+ validation when evaluating), validate -> validation, predict -> test."""
    if stage == "fit":
        return ["train", "validation"] if evaluates_during_fit(args) else ["train"]
    return ["validation"] if stage == "validate" else ["test"]


def check_files(spec: DataSpec) -> None:
    """Every data file the spec names exists and has a supported extension (cheap; no dataset is read).

    Raises:
        ValueError: an unsupported extension. FileNotFoundError: a missing file.
    """
    for key in ("train_file", "validation_file", "test_file"):
        source = getattr(spec, key)
        if source is None:
            continue
        ext = os.path.splitext(source)[1].lower()
        if ext not in FILE_BUILDERS:
            allowed = ", ".join(FILE_BUILDERS)
            raise ValueError(f"data.{key}={source!r}: unsupported file type {ext!r}; allowed: {allowed}.")
        if not os.path.isfile(source):
            raise FileNotFoundError(f"data.{key}={source!r}: no such file.")


def load_split(spec: DataSpec, split: str) -> Any:
    """The raw `datasets.Dataset` of `split` (`train`, `validation`, `test`), or None when the config has none.

    Raises:
        ValueError: an unsupported file extension or a missing split (naming the key).
        FileNotFoundError: a data file that does not exist.
    """
    key, source = split_source(spec, split)
    if source is None:
        return None
    import datasets

    if spec.dataset_name is None:
        check_files(spec)
        ext = os.path.splitext(source)[1].lower()
        dataset = datasets.load_dataset(FILE_BUILDERS[ext], data_files={"data": source}, split="data")
    elif os.path.isdir(spec.dataset_name):
        loaded = datasets.load_from_disk(spec.dataset_name)
        if isinstance(loaded, datasets.DatasetDict):
            if source not in loaded:
                raise ValueError(f"{key}={source!r} is not a split of {spec.dataset_name}; allowed: {list(loaded)}.")
            loaded = loaded[source]
        dataset = loaded
    else:
        dataset = datasets.load_dataset(spec.dataset_name, spec.dataset_config_name, split=source)
    limit = spec.max_train_samples if split == "train" else spec.max_eval_samples
    if limit is not None and limit < len(dataset):
        dataset = dataset.select(range(limit))
    return dataset


def load_tokenizer(data: DataSpec, model: ModelSpec) -> Any:
    """The tokenizer: `data.tokenizer_file`, else `data.tokenizer_name_or_path`, else `model.model_name_or_path`.

    Raises:
        ValueError: none of them is set.
    """
    if data.tokenizer_file is not None:
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        if not os.path.isfile(data.tokenizer_file):
            raise FileNotFoundError(f"data.tokenizer_file={data.tokenizer_file!r}: no such file.")
        vocab = Tokenizer.from_file(data.tokenizer_file).get_vocab()
        special = {k: v for k, v in data.special_tokens.items() if v in vocab}
        return PreTrainedTokenizerFast(tokenizer_file=data.tokenizer_file, **special)
    source = data.tokenizer_name_or_path or model.model_name_or_path
    if source is None:
        raise ValueError("data: set `tokenizer_file` or `tokenizer_name_or_path` (the model is built from a config).")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


def _sorted_labels(values: list[Any]) -> list[str]:
    unique = set(values)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in unique):
        return [str(v) for v in sorted(unique)]
    return sorted(str(v) for v in unique)


def label_list_for(task: Task, data: DataSpec, model: ModelSpec, splits: list[Any]) -> list[str] | None:
    """Class names in id order: `data.label_list`, else a pretrained config's `id2label` (when it is not HF's
    `LABEL_<i>` placeholder), else the sorted labels of the first split that has them. None for tasks without
    classes."""
    if task.label_values is None:
        return None
    if data.label_list:
        return [str(v) for v in data.label_list]
    if model.model_name_or_path is not None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model.model_name_or_path, **model.from_pretrained_kwargs)
        names = [config.id2label[i] for i in sorted(config.id2label)]
        if names and names != [f"LABEL_{i}" for i in range(len(names))]:
            return [str(n) for n in names]
    for split in splits:
        if split is not None and data.label_column in split.column_names:
            return _sorted_labels(task.label_values(split, data))
    raise ValueError(
        f"data.label_column={data.label_column!r}: no split has labels to build the label list; set data.label_list."
    )


def build_model(spec: ModelSpec, task: Task, tokenizer: Any, labels: list[str] | None,
                allow_code_from: Sequence[str] = ()) -> Any:
    """The model for `task`: `from_pretrained(model_name_or_path)` or `from_config(config_class(...))`.

    The label list, when there is one, sets `num_labels`, `id2label` and `label2id` (saved with checkpoints, so a
    checkpoint folder predicts with the same classes).
    """
    auto = import_checked(spec.auto_class or task.auto_class, "model.auto_class", "a transformers Auto model class",
                          is_auto_class, allow_code_from)
    overrides = dict(spec.config_overrides)
    if labels is not None:
        overrides.update(num_labels=len(labels), id2label=dict(enumerate(labels)),
                         label2id={name: i for i, name in enumerate(labels)})
    if spec.model_name_or_path is not None:
        from transformers import AutoConfig

        # a checkpoint folder is verified before its weights are trusted (checkpoint/verify.py)
        require_verified(spec.model_name_or_path, "model.model_name_or_path")
        config = AutoConfig.from_pretrained(spec.model_name_or_path, **spec.from_pretrained_kwargs)
        for name, value in overrides.items():
            setattr(config, name, value)
        return auto.from_pretrained(spec.model_name_or_path, config=config, **spec.from_pretrained_kwargs)
    assert spec.config_class is not None  # ModelSpec requires it without model_name_or_path
    config_class = import_checked(spec.config_class, "model.config_class", "a transformers.PretrainedConfig subclass",
                                  is_config_class, allow_code_from)
    kwargs = {"vocab_size": len(tokenizer)}
    if getattr(tokenizer, "pad_token_id", None) is not None:
        kwargs["pad_token_id"] = tokenizer.pad_token_id
    if task.model_defaults is not None:
        kwargs.update(task.model_defaults(tokenizer))
    kwargs.update(spec.config_kwargs)
    config = config_class(**kwargs)
    for name, value in overrides.items():
        setattr(config, name, value)
    return auto.from_config(config)
