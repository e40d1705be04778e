"""The `transformers.Trainer` dataloader methods of `hf_lightning.Trainer`, and its dataset attributes.

`TransformerDataModule` asks the trainer for its loaders (`TransformerDataModule.loaders`): `get_train_dataloader`
once per `train()`, `get_eval_dataloader` once per evaluated dataset of every evaluation, `get_test_dataloader` once
per `predict()`. Each base method here calls the data module's built-in, so a subclass's override (a sequential
sampler, a custom collate, another dataset) drives the run and `super()` reaches the built-in.

What an overridden `get_train_dataloader` returns is a loader of micro-batches, as in HF: they are grouped into
updates of `gradient_accumulation_steps` (`data/windows.py`), fetched right before each update. On resume its first
batches are skipped without loading them when it is a map-style `DataLoader` (the order is then exact if the loader's
order is the same on every pass, or set by `set_epoch`), by reading otherwise (README "Subclassing the Trainer").
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Sampler
from transformers import TrainerState

from hf_lightning.args import TrainingArguments
from hf_lightning.data.datamodule import TransformerDataModule
from hf_lightning.data.dispatch import DispatchLoader
from hf_lightning.data.windows import num_examples

__all__ = ["DataHooks"]


class DataHooks:
    """HF's dataloader methods and dataset attributes (base implementations calling `self.datamodule`)."""

    datamodule: TransformerDataModule
    args: TrainingArguments
    state: TrainerState  # `LoopHooks.state`
    _eval_dataset: Any = None

    # ----- attributes -----
    @property
    def train_dataset(self) -> Any:
        """HF's `train_dataset` (the data module's: columns the model cannot take are dropped once training starts,
        as HF's loaders drop them)."""
        return self.datamodule.train_dataset

    @train_dataset.setter
    def train_dataset(self, dataset: Any) -> None:
        if "datamodule" in vars(self):  # before `Trainer.__init__`: its own value replaces it, as in HF
            self.datamodule.train_dataset = dataset

    @property
    def eval_dataset(self) -> Any:
        """HF's `eval_dataset`: the dataset or dict of datasets given to the constructor (or set since)."""
        return self._eval_dataset

    @eval_dataset.setter
    def eval_dataset(self, dataset: Any) -> None:
        self._eval_dataset = dataset
        if "datamodule" not in vars(self):
            return
        self.datamodule.eval_datasets = TransformerDataModule._named(dataset)
        self.datamodule.named_eval_datasets = dict(self.datamodule.eval_datasets or {})

    @property
    def data_collator(self) -> Any:
        """HF's `data_collator`: the given one, or HF's default for `processing_class`."""
        return self.datamodule.data_collator

    @data_collator.setter
    def data_collator(self, collator: Any) -> None:
        if "datamodule" in vars(self):
            self.datamodule.data_collator = collator

    @property
    def _train_batch_size(self) -> int:
        """HF's `_train_batch_size`: the micro-batch size per device; after `auto_find_batch_size` the size that fit
        (`state.train_batch_size`), which HF's batch search leaves there."""
        found = self.state.train_batch_size if self.args.auto_find_batch_size else None
        return int(found or self.args.per_device_train_batch_size)

    # ----- loaders -----
    def get_train_dataloader(self) -> DataLoader | DispatchLoader:
        """HF's `get_train_dataloader`: micro-batches of `train_dataset` in HF's seeded order (`_get_dataloader` with
        `_get_train_sampler`)."""
        return self.datamodule.get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        """HF's `get_eval_dataloader`: `eval_dataset` is a dataset, the name of one of the eval datasets, or None."""
        return self.datamodule.get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset: Any) -> DataLoader:
        """HF's `get_test_dataloader`."""
        return self.datamodule.get_test_dataloader(test_dataset)

    def _get_dataloader(
        self, dataset: Any, description: str, batch_size: int, sampler_fn: Any = None, is_training: bool = False,
        dataloader_key: str | None = None,
    ) -> DataLoader | DispatchLoader:
        """HF's `_get_dataloader`: columns the model cannot take removed, `sampler_fn(dataset)`'s order, sharded
        across processes as accelerate does."""
        return self.datamodule._get_dataloader(dataset, description, batch_size, sampler_fn, is_training,
                                               dataloader_key)

    def _get_train_sampler(self, train_dataset: Any = None) -> Sampler | None:
        """HF's `_get_train_sampler`: the seeded `seed + epoch` permutation, or sequential order."""
        return self.datamodule._get_train_sampler(train_dataset)

    def _get_eval_sampler(self, eval_dataset: Any) -> Sampler | None:
        """HF's `_get_eval_sampler`: dataset order (this process's contiguous block of it)."""
        return self.datamodule._get_eval_sampler(eval_dataset)

    def num_examples(self, dataloader: Any) -> int:
        """HF's `num_examples`: `len(dataloader.dataset)`, else the batches times the batch size."""
        return num_examples(dataloader, self.args.per_device_train_batch_size)
