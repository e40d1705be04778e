"""`TransformerDataModule`: serves train / eval / predict data the way the HF Trainer's dataloaders do.

Train batches are accumulation *windows* (a list of micro-batches, see `sampling.py`), so one Lightning training
step is one optimizer update and Lightning's step counters, `max_steps` and resume positions count updates.
Evaluation and prediction loaders are plain, in dataset order; under DDP each rank gets a contiguous, unpadded shard
so gathered results are exact (Lightning's `DistributedSampler` pads with duplicates).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, IterableDataset
from typing_extensions import override

from hf_lightning._lightning_compat import uses_distributed_sampler
from hf_lightning.args import TrainingArguments
from hf_lightning.data.collate import (
    ColumnFilter,
    WindowCollator,
    default_collator,
    find_label_names,
    remove_unused_columns,
    signature_columns,
)
from hf_lightning.data.length_grouping import sample_lengths
from hf_lightning.data.sampling import ContiguousShardSampler, WindowBatchSampler

__all__ = ["TransformerDataModule", "ContiguousShardSampler"]


class _WindowedIterable:
    """Groups the micro-batches of an unsized loader into windows of `accumulation` (the last one may be short)."""

    def __init__(self, loader: DataLoader, accumulation: int) -> None:
        self.loader = loader
        self.accumulation = accumulation
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the dataset (a shuffled `datasets.IterableDataset` reshuffles with `seed + epoch`), as
        accelerate's `DataLoaderShard.set_epoch` does for the HF Trainer at every epoch."""
        if hasattr(self.loader.dataset, "set_epoch"):
            self.loader.dataset.set_epoch(epoch)

    @property
    def sampler(self) -> _WindowedIterable:
        """Lightning's `_set_sampler_epoch` calls `set_epoch` on `<loader>.sampler` only: expose ourselves there.
        Without it every pass over a shuffled iterable dataset repeated the first pass's order."""
        return self

    def __iter__(self) -> Iterator[list[Any]]:
        window: list[Any] = []
        skip, self.skip = self.skip * self.accumulation, 0
        for batch in self.loader:
            if skip:
                skip -= 1
                continue
            window.append(batch)
            if len(window) == self.accumulation:
                yield window
                window = []
        if window:
            yield window


class TransformerDataModule(pl.LightningDataModule):
    """Train, eval and predict data for a `TransformerModule`, with the HF Trainer's loader semantics.

    Args:
        train_dataset: a `datasets.Dataset`, `datasets.IterableDataset` or torch dataset.
        eval_dataset: one dataset, or a dict of named datasets (metrics get `eval_<name>_` prefixes).
        predict_dataset: data for `predict`.
        args: the training arguments (batch sizes, seeds, accumulation, loader options).
        data_collator: collator for every split; defaults to HF's choice for `processing_class`.
        processing_class: tokenizer or processor; selects `DataCollatorWithPadding`.

    Example::

        dm = TransformerDataModule(train_dataset=train, eval_dataset={"dev": dev}, args=TrainingArguments())
    """

    def __init__(
        self,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        predict_dataset: Any = None,
        args: TrainingArguments | None = None,
        data_collator: Any = None,
        processing_class: Any = None,
    ) -> None:
        super().__init__()
        self.args = args if args is not None else TrainingArguments()
        self.train_dataset = train_dataset
        self.eval_datasets: dict[str, Any] | None = self._named(eval_dataset)
        self.predict_dataset = predict_dataset
        self.processing_class = processing_class
        self.data_collator = data_collator if data_collator is not None else default_collator(processing_class)
        self._allowed_columns: list[str] | None = None
        self.train_sampler: WindowBatchSampler | None = None
        self.resume_position: tuple[int, int] | None = None
        """`(epoch, windows)`: the next train loader starts at that window of that epoch (set on resume, used once)."""
        self.train_lengths: list[int] | None = None
        """The training samples' lengths, for `train_sampling_strategy="group_by_length"` (measured in `setup`)."""
        self._lengths_of: Any = None
        if self.args.train_sampling_strategy == "group_by_length" and train_dataset is not None:
            self.train_lengths = self._sample_lengths(train_dataset)  # a bad column is an error now, not at fit
            self._lengths_of = train_dataset

    @staticmethod
    def _named(eval_dataset: Any) -> dict[str, Any] | None:
        if eval_dataset is None:
            return None
        if isinstance(eval_dataset, Mapping):
            return dict(eval_dataset)
        return {"": eval_dataset}

    @property
    def eval_dataset_names(self) -> list[str]:
        """Names of the eval datasets in loader order; `""` for a single unnamed dataset."""
        return list(self.eval_datasets or {})

    # ----- column handling -----
    @override
    def setup(self, stage: str) -> None:
        """Measure the training samples for `group_by_length`, then resolve the model's accepted columns and drop the
        others (HF `remove_unused_columns`; a length column is read before it goes)."""
        if self.args.train_sampling_strategy == "group_by_length" and self.train_dataset is not None \
                and self._lengths_of is not self.train_dataset:
            self.train_lengths = self._sample_lengths(self.train_dataset)
        self._lengths_of = self.train_dataset  # the lengths stay valid for the dataset without the length column
        module = self.trainer.lightning_module if self.trainer is not None else None
        model = getattr(module, "model", None)
        if not self.args.remove_unused_columns or model is None:
            return
        label_names = self.args.label_names or find_label_names(model)
        self._allowed_columns = signature_columns(model, label_names)
        if self.train_dataset is not None:
            self.train_dataset = remove_unused_columns(self.train_dataset, self._allowed_columns, "training")
        if self.eval_datasets:
            self.eval_datasets = {
                name: remove_unused_columns(ds, self._allowed_columns, f"evaluation {name!r}".replace(" ''", ""))
                for name, ds in self.eval_datasets.items()
            }
        if self.predict_dataset is not None:
            self.predict_dataset = remove_unused_columns(self.predict_dataset, self._allowed_columns, "prediction")
        self._lengths_of = self.train_dataset

    def _sample_lengths(self, dataset: Any) -> list[int]:
        """`group_by_length`'s lengths (`length_grouping.sample_lengths`); an unsized dataset is refused, where HF
        warns and reads it in its own order (T:1075-1085)."""
        if isinstance(dataset, IterableDataset):
            raise ValueError(
                "train_sampling_strategy='group_by_length' needs a map-style train dataset; an IterableDataset has "
                "no lengths to group by and is read in its own order. Use train_sampling_strategy='random', or a "
                "map-style dataset."
            )
        names = getattr(self.processing_class, "model_input_names", None)
        return sample_lengths(dataset, self.args.length_column_name, names[0] if names else "input_ids")

    def _collator(self, dataset: Any) -> Any:
        if self._allowed_columns is not None and not hasattr(dataset, "column_names"):
            return ColumnFilter(self.data_collator, self._allowed_columns)
        return self.data_collator

    # ----- distribution -----
    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 1, 0
        if trainer.world_size > 1 and uses_distributed_sampler(trainer):
            raise ValueError(
                "TransformerDataModule shards data itself; create the Lightning Trainer with "
                "`use_distributed_sampler=False` (got use_distributed_sampler=True with "
                f"world_size={trainer.world_size})."
            )
        return trainer.world_size, trainer.global_rank

    def _loader_kwargs(self) -> dict[str, Any]:
        args = self.args
        kwargs: dict[str, Any] = {
            "num_workers": args.dataloader_num_workers,
            "pin_memory": args.dataloader_pin_memory and not args.use_cpu and torch.cuda.is_available(),
        }
        if args.dataloader_num_workers > 0:
            kwargs["persistent_workers"] = args.dataloader_persistent_workers
            if args.dataloader_prefetch_factor is not None:
                kwargs["prefetch_factor"] = args.dataloader_prefetch_factor
        return kwargs

    # ----- loaders -----
    @override
    def train_dataloader(self) -> Any:
        """Windows of `gradient_accumulation_steps` micro-batches, in HF's seeded order."""
        if self.train_dataset is None:
            raise ValueError("`train_dataset` is None: pass a training dataset to train.")
        args, (world, rank) = self.args, self._world()
        collate = self._collator(self.train_dataset)
        if isinstance(self.train_dataset, IterableDataset):
            return self._iterable_train_loader(collate, world, rank)
        self.train_sampler = WindowBatchSampler(
            num_samples=len(self.train_dataset),
            batch_size=args.per_device_train_batch_size,
            accumulation=args.gradient_accumulation_steps,
            seed=args.data_seed if args.data_seed is not None else args.seed,
            shuffle=args.train_sampling_strategy == "random",
            drop_last=args.dataloader_drop_last,
            world_size=world,
            rank=rank,
            lengths=self.train_lengths if args.train_sampling_strategy == "group_by_length" else None,
        )
        if self.resume_position is not None:
            # O(1) resume: the sampler slices the epoch's order at the window, no skipped batch is loaded
            epoch, self.train_sampler.skip_windows = self.resume_position
            self.train_sampler.set_epoch(epoch)
            self.resume_position = None
        return DataLoader(
            self.train_dataset,
            batch_sampler=self.train_sampler,
            collate_fn=WindowCollator(collate, args.per_device_train_batch_size),
            **self._loader_kwargs(),
        )

    def _iterable_train_loader(self, collate: Any, world: int, rank: int) -> _WindowedIterable:
        """Windows read from an `IterableDataset` (a `datasets` one is split across processes by node)."""
        args, dataset = self.args, self.train_dataset
        if world > 1:
            # `datasets` (with pandas and pyarrow) only for this case: importing the data module stays light
            from datasets import IterableDataset as HFIterable
            from datasets.distributed import split_dataset_by_node

            if not isinstance(dataset, HFIterable):
                raise ValueError(
                    "A torch IterableDataset cannot be sharded across processes by hf_lightning; use a "
                    "`datasets.IterableDataset` or a map-style dataset for `train_dataset` under DDP."
                )
            dataset = split_dataset_by_node(dataset, rank=rank, world_size=world)
        loader = DataLoader(
            dataset, batch_size=args.per_device_train_batch_size, collate_fn=collate,
            drop_last=args.dataloader_drop_last, **self._loader_kwargs(),
        )
        windowed = _WindowedIterable(loader, args.gradient_accumulation_steps)
        if self.resume_position is not None:  # an iterable dataset can only skip by reading (as HF)
            windowed.set_epoch(self.resume_position[0])
            windowed.skip, self.resume_position = self.resume_position[1], None
        return windowed

    def num_train_microbatches(self) -> int | None:
        """Micro-batches per epoch on one process (`None` for an unsized dataset): HF's `len(train_dataloader)`."""
        if self.train_dataset is None or isinstance(self.train_dataset, IterableDataset):
            return None
        world, _ = self._world()
        sampler = WindowBatchSampler(
            len(self.train_dataset), self.args.per_device_train_batch_size, 1, 0, False,
            self.args.dataloader_drop_last, world, 0,
        )
        return sampler.num_microbatches()

    def _eval_loader(self, dataset: Any) -> DataLoader:
        world, rank = self._world()
        collate = self._collator(dataset)
        kwargs: dict[str, Any] = {
            "batch_size": self.args.per_device_eval_batch_size,
            "collate_fn": collate,
            "drop_last": self.args.dataloader_drop_last,
            **self._loader_kwargs(),
        }
        if not isinstance(dataset, IterableDataset):
            kwargs["sampler"] = ContiguousShardSampler(len(dataset), world, rank, self.args.per_device_eval_batch_size)
        return DataLoader(dataset, **kwargs)

    @override
    def val_dataloader(self) -> Any:
        """One loader per eval dataset, in the order of `eval_dataset_names`."""
        if not self.eval_datasets:
            return []
        loaders = [self._eval_loader(ds) for ds in self.eval_datasets.values()]
        return loaders[0] if len(loaders) == 1 else loaders

    @override
    def test_dataloader(self) -> Any:
        """Same as `val_dataloader` (Lightning's `test` runs the evaluation code)."""
        return self.val_dataloader()

    @override
    def predict_dataloader(self) -> Any:
        """The prediction dataset, in dataset order."""
        if self.predict_dataset is None:
            raise ValueError("`predict_dataset` is None: pass a dataset to predict on.")
        return self._eval_loader(self.predict_dataset)
