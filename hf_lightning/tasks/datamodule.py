"""`TaskDataModule`: a `TransformerDataModule` that loads and preprocesses the splits a config names.

Preprocessing runs in `prepare_data` (rank 0 of each node first; `datasets` caches the result) and again in `setup`
on every rank, where it is a cache hit: the tokenisation is done once under DDP.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from hf_lightning.args import TrainingArguments
from hf_lightning.data.datamodule import TransformerDataModule
from hf_lightning.tasks.loading import load_split, splits_for_stage
from hf_lightning.tasks.specs import DataSpec
from hf_lightning.tasks.task import Task

__all__ = ["TaskDataModule", "splits_for_stage"]


class TaskDataModule(TransformerDataModule):
    """Data for one `hf-lightning` run.

    Args:
        task: the task preset (preprocessing and collator).
        spec: the `data:` section.
        args: the training arguments.
        tokenizer: the tokenizer (also the `processing_class`).
        label2id: class name -> id, for tasks with classes.
        stage: `fit`, `validate` or `predict`.
        raw: already loaded raw splits (name -> dataset), to avoid reading files twice.
    """

    def __init__(self, task: Task, spec: DataSpec, args: TrainingArguments, tokenizer: Any,
                 label2id: dict[str, int] | None, stage: str, raw: dict[str, Any] | None = None) -> None:
        super().__init__(args=args, data_collator=task.collator(tokenizer, spec), processing_class=tokenizer)
        self.task, self.spec, self.label2id, self.stage = task, spec, label2id, stage
        self._raw = dict(raw or {})

    def _raw_split(self, name: str) -> Any:
        if name not in self._raw:
            self._raw[name] = load_split(self.spec, name)
        return self._raw[name]

    def _processed(self) -> dict[str, Any]:
        out = {}
        for name in splits_for_stage(self.stage, self.args):
            raw = self._raw_split(name)
            if raw is not None:
                out[name] = self.task.preprocess(raw, self.processing_class, self.spec, self.label2id)
        return out

    @override
    def prepare_data(self) -> None:
        """Tokenise once (rank 0 of the node); the `datasets` cache serves the other ranks in `setup`."""
        self._processed()

    @override
    def setup(self, stage: str) -> None:
        """Read the preprocessed splits (a cache hit after `prepare_data`), then drop unused columns."""
        splits = self._processed()
        self.train_dataset = splits.get("train")
        if "validation" in splits:
            self.eval_datasets = {"": splits["validation"]}
        self.predict_dataset = splits.get("test")
        super().setup(stage)
