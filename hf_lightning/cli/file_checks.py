"""Config mistakes found from the files alone, before torch, transformers, the data or the model are loaded.

`precheck` calls `check_config_files` once the `args`, `model` and `data` sections parsed. It answers in a fraction of
a second what the full run would only find after importing Lightning and reading the data (about 2 minutes on a
busy 2-core machine):

- the stage's data is configured: `fit` has training data; evaluation during `fit` has evaluation data;
- data files exist, and their columns (a CSV header, the keys of the first JSON lines, a Parquet schema) include the
  configured text / label columns (`tasks.checks.check_columns`, the rule the full run applies to loaded data);
- local folders named by `model.model_name_or_path`, `data.tokenizer_name_or_path`, `data.dataset_name` exist, and
  a model folder has the `config.json` that `from_pretrained` reads; `data.tokenizer_file` exists.

Hub names are left to the full run (`pretrained_source.py`), which asks the hub once. A file whose columns cannot be
read cheaply (a JSON document that is not JSON lines) is left to the full run as well.
"""

from __future__ import annotations

import csv
import json
import os
from types import SimpleNamespace
from typing import Any

from hf_lightning.args import TrainingArguments
from hf_lightning.tasks.checks import check_columns
from hf_lightning.tasks.loading import check_files, split_source, splits_for_stage
from hf_lightning.tasks.specs import DataSpec, ModelSpec
from hf_lightning.tasks.task import Task

__all__ = ["check_config_files", "file_columns", "folder_problem", "stage_data_problem"]

_JSON_LINES_READ = 1000  # JSON lines rows may differ in keys; `datasets` unites them, so read the first rows' union
_LOCAL_PATH_PREFIXES = (".", "/", "~")


def file_columns(path: str) -> list[str] | None:
    """The column names `datasets` will see in data file `path`, read cheaply, or None when they cannot be.

    CSV: the header row. JSON / JSON lines: the union of the keys of the first rows when the file is JSON lines (one
    object per line). Parquet: the schema. Text: `text`.
    """
    ext = os.path.splitext(path)[1].lower()
    if ext == ".txt":
        return ["text"]
    if ext == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
        return list(header) if header else None
    if ext in (".json", ".jsonl"):
        names: dict[str, None] = {}
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if i >= _JSON_LINES_READ:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    return None  # a JSON document over several lines: the full run reads it
                if not isinstance(row, dict):
                    return None
                names.update(dict.fromkeys(row))
        return list(names) or None
    if ext == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    return None


def stage_data_problem(subcommand: str, args: TrainingArguments, spec: DataSpec) -> str | None:
    """What data the stage lacks (files only: a `dataset_name`'s splits are known once it is loaded), or None."""
    if spec.dataset_name is not None:
        return None
    if subcommand == "fit" and spec.train_file is None:
        return "fit needs training data: set data.train_file or data.dataset_name."
    if subcommand == "fit" and "validation" in splits_for_stage("fit", args) and spec.validation_file is None:
        strategy = getattr(args.eval_strategy, "value", args.eval_strategy)  # HF's str enum once validated
        setting = (f"args.eval_strategy={strategy!r}" if strategy != "no"
                   else "args.eval_on_start=True")
        return (f"{setting} needs evaluation data: set data.validation_file (or data.validation_split), or "
                "args.eval_strategy: 'no'.")
    if subcommand != "fit" and spec.validation_file is None and spec.test_file is None:
        return f"{subcommand} needs data: set data.validation_file / data.test_file (or a dataset_name)."
    return None


def _looks_local(value: str) -> bool:
    return value.startswith(_LOCAL_PATH_PREFIXES) or value.count("/") > 1 or os.sep in value.replace("/", "")


def folder_problem(key: str, value: str | None, needs: str | None = None) -> str | None:
    """A local folder option: missing (with the closest existing folder) or without the file `needs`; else None."""
    if value is None:
        return None
    path = os.path.expanduser(value)
    if os.path.isdir(path):
        if needs is not None and not os.path.isfile(os.path.join(path, needs)):
            if os.path.isfile(os.path.join(path, "adapter_config.json")):
                return (f"{key}={value!r} holds a PEFT adapter (adapter_config.json), not a model: set {key} to the "
                        "base model and pass the adapter folder as --ckpt_path.")
            return (f"{key}={value!r} has no {needs}, which from_pretrained reads: it is not a saved model folder "
                    "(save_pretrained and every checkpoint-<step> folder write one).")
        return None
    if _looks_local(value):
        from hf_lightning.pretrained_source import missing_local_folder

        return missing_local_folder(key, value)
    return None  # a hub name: the full run asks the hub (pretrained_source.check_pretrained_source)


def check_config_files(
    subcommand: str, task: Task, args: TrainingArguments, model: ModelSpec | None, data: DataSpec
) -> str | None:
    """The first mistake of the config that the files alone show (see the module docstring), or None.

    Args:
        subcommand: `fit`, `validate` or `predict`.
        task: the task preset (which columns it needs).
        args: the parsed training arguments (`eval_strategy`, `eval_on_start`).
        model: the `model:` section, None when the config has none.
        data: the `data:` section.
    """
    if (problem := stage_data_problem(subcommand, args, data)) is not None:
        return problem
    try:
        check_files(data)
    except (ValueError, FileNotFoundError) as err:
        return str(err)
    if model is not None:
        subfolder = str(model.from_pretrained_kwargs.get("subfolder") or "")
        needs = os.path.join(subfolder, "config.json") if subfolder else "config.json"
        if (problem := folder_problem("model.model_name_or_path", model.model_name_or_path, needs)) is not None:
            return problem
    for key in ("tokenizer_name_or_path", "dataset_name"):
        if (problem := folder_problem(f"data.{key}", getattr(data, key))) is not None:
            return problem
    if data.tokenizer_file is not None and not os.path.isfile(os.path.expanduser(data.tokenizer_file)):
        return f"data.tokenizer_file={data.tokenizer_file!r}: no such file."
    if data.dataset_name is not None:
        return None
    raw: dict[str, Any] = {}
    for split in splits_for_stage(subcommand, args):
        _, source = split_source(data, split)
        if source is not None and (columns := file_columns(source)) is not None:
            raw[split] = SimpleNamespace(column_names=columns)
    try:
        check_columns(task, data, raw)
    except ValueError as err:
        return str(err)
    return None
