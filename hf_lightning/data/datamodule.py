"""`TransformerDataModule`: serves train / eval / predict data the way the HF Trainer's dataloaders do.

The loaders come from HF's dataloader methods, with their signatures (`get_train_dataloader`,
`get_eval_dataloader(eval_dataset)`, `get_test_dataloader(test_dataset)`, `_get_dataloader`, `_get_train_sampler`,
`_get_eval_sampler`), called through `loaders`: this data module's built-ins, or an attached `hf_lightning.Trainer`
whose subclass overrides them (its base methods call back into these).

The train loader yields micro-batches, HF's `get_train_dataloader` result: HF's seeded order, sharded like accelerate,
one collation per micro-batch (in the loader's workers with HF's `seed_worker` when there are workers). Lightning sees
it grouped into accumulation *windows* (`windows.py`), so one Lightning training step is one optimizer update and
Lightning's step counters, `max_steps` and resume positions count updates; each window's micro-batches are fetched
right before its update (`on_before_batch_transfer`), where HF fetches them, so random collators and dropout draw the
RNG in HF's order.

Evaluation and prediction loaders are plain, in dataset order; under DDP each rank gets a contiguous, unpadded shard
so gathered results are exact (Lightning's `DistributedSampler` pads with duplicates).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from itertools import islice
from typing import Any

import lightning.pytorch as pl
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Sampler, SequentialSampler
from transformers.trainer_utils import seed_worker
from typing_extensions import override

from hf_lightning._lightning_compat import uses_distributed_sampler
from hf_lightning.args import TrainingArguments
from hf_lightning.args.accelerator_config import loader_settings
from hf_lightning.contracts import HFColumnHooks, HFDataHooks
from hf_lightning.data.collate import (
    ColumnFilter,
    default_collator,
    find_label_names,
    missing_labels_problem,
    remove_unused_columns,
    signature_columns,
)
from hf_lightning.data.dispatch import DispatchLoader
from hf_lightning.data.length_grouping import train_sample_lengths
from hf_lightning.data.row_checks import RowCheckingCollator, RowLimits, can_check_ahead, check_dataset
from hf_lightning.data.sampling import (
    ContiguousShardSampler,
    EpochSampler,
    GroupingDraw,
    OrderBatchSampler,
    WindowBatchSampler,
    dataset_length,
    split_batch_size,
    uneven_batches_problem,
)
from hf_lightning.data.stream_loader import WindowedStream, iterable_loader, stream_windows
from hf_lightning.data.stream_state import to_plain
from hf_lightning.data.windows import EpochLoader, LazyWindow, WindowStream, is_sized, loader_options

__all__ = ["TransformerDataModule", "ContiguousShardSampler", "shard_eval_loader"]


def _train_batch_sampler(loader: Any) -> Any:
    """The batch sampler of a train loader (of the whole loader rank 0 reads under `dispatch_batches=True`), or
    None."""
    if isinstance(loader, DispatchLoader):
        loader = loader.loader
    return getattr(loader, "batch_sampler", None)


def shard_eval_loader(loader: Any, world_size: int, rank: int) -> Any:
    """`loader` as this process's part of an evaluation over `world_size` processes (accelerate's `prepare` of an
    eval loader, with hf_lightning's contiguous shards: gathered in rank order, the results are in dataset order).

    A loader already sharded by hf_lightning (`get_eval_dataloader()` / `get_test_dataloader()` called while a run
    is attached), and any loader of a single process, is returned as it is; another map-style loader is rebuilt
    around a `ContiguousShardSampler` that splits its sampler's order (same dataset, collator, batch size, workers).

    Raises:
        ValueError: several processes, and a loader that cannot be split exactly (an iterable dataset, a batch
            sampler of its own, or no batch size).
    """
    samplers = (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    if world_size < 2 or any(isinstance(sampler, ContiguousShardSampler) for sampler in samplers):
        return loader
    dataset, batch_size = getattr(loader, "dataset", None), getattr(loader, "batch_size", None)
    if isinstance(dataset, IterableDataset) or dataset_length(dataset) is None or not batch_size:
        raise ValueError(
            f"evaluation_loop: a {type(loader).__name__} over {type(dataset).__name__} with batch_size={batch_size} "
            f"cannot be split exactly across {world_size} processes (it needs a sized map-style dataset and a "
            "batch_size). Pass the loader of `get_eval_dataloader()` / `get_test_dataloader()` called during the run, "
            "or a DataLoader(dataset, batch_size=..., collate_fn=...)."
        )
    assert dataset is not None  # sized, checked above
    order = None if isinstance(loader.sampler, SequentialSampler) else loader.sampler
    sampler = ContiguousShardSampler(len(dataset), world_size, rank, int(batch_size), order=order)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=loader.collate_fn,
                      drop_last=loader.drop_last, num_workers=loader.num_workers, pin_memory=loader.pin_memory)


class TransformerDataModule(pl.LightningDataModule):
    """Train, eval and predict data for a `TransformerModule`, with the HF Trainer's loader semantics.

    Args:
        train_dataset: a `datasets.Dataset`, `datasets.IterableDataset` or torch dataset.
        eval_dataset: one dataset, or a dict of named datasets (metrics get `eval_<name>_` prefixes).
        predict_dataset: data for `predict`.
        args: the training arguments (batch sizes, seeds, accumulation, loader options).
        data_collator: collator for every split; defaults to HF's choice for `processing_class`.
        processing_class: tokenizer or processor; selects `DataCollatorWithPadding`.
        loader_owner: the owner of HF's dataloader methods (an `hf_lightning.Trainer`, whose subclass may override
            them); None: this data module.
        columns_owner: the owner of HF's `_set_signature_columns_if_needed` / `_signature_columns` (an
            `hf_lightning.Trainer`, whose subclass may override them, as TRL's `SFTTrainer` does); None: the model's
            `forward` parameters and the label names.

    Attributes:
        eval_loader_args: per eval dataset name, what `get_eval_dataloader` receives (HF passes the dataset given to
            `evaluate`, else the dataset's name, or None for a single unnamed one).
        signature_model: the model whose `forward` decides the kept columns when no Lightning trainer is attached.

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
        loader_owner: HFDataHooks | None = None,
        columns_owner: HFColumnHooks | None = None,
    ) -> None:
        super().__init__()
        self.args = args if args is not None else TrainingArguments()
        self.train_dataset = train_dataset
        self.eval_datasets: dict[str, Any] | None = self._named(eval_dataset)
        self.named_eval_datasets: dict[str, Any] = dict(self.eval_datasets or {})
        """The eval datasets by name, as given (what a name passed to `get_eval_dataloader` refers to)."""
        self.predict_dataset = predict_dataset
        self.processing_class = processing_class
        self.data_collator = data_collator if data_collator is not None else default_collator(processing_class)
        self.loader_owner = loader_owner
        self.eval_loader_args: dict[str, Any] | None = None
        self.loop_loader: Any = None
        """The loader of a running `evaluation_loop` call: the validation loader while set."""
        self.signature_model: nn.Module | None = None
        self.columns_owner = columns_owner
        self._allowed_columns: list[str] | None = None
        self._label_names: list[str] = []
        self._fit_loader: Any = None
        self.resume_position: tuple[int, int] | None = None
        """`(epoch, windows)`: the next train loader starts at that window of that epoch (set on resume, used once)."""
        self.resume_start_sample = 0
        """With `resume_position` (an elastic resume): the resumed epoch is the rest of its order after this many
        samples, in this run's windows (`WindowStream.start_sample`); 0: `resume_position`'s windows are skipped."""
        self.windows: WindowStream | None = None
        """The windows of the current sized train loader (None for an unsized one)."""
        self.resume_stream_position: Any = None
        """With `resume_position`: the saved position of an unsized train stream after those windows (or None)."""
        self.resume_grouping_draw: GroupingDraw | None = None
        """`group_by_length`: the saved draw of the epoch a checkpoint was written in (`load_state_dict`)."""
        self.train_stream: WindowedStream | None = None
        """The windows of the current unsized train loader (None for a sized one)."""
        self.train_lengths: list[int] | None = None
        """The training samples' lengths, for `train_sampling_strategy="group_by_length"` (measured in `setup`)."""
        self._lengths_of: Any = None
        self._rows_checked: list[tuple[Any, RowLimits]] = []  # datasets (by identity) checked against limits
        self._eval_loaders: dict[str, tuple[Any, DataLoader]] = {}
        """With `dataloader_persistent_workers`: the eval loader per key (HF's `_eval_dataloaders`) and its dataset."""
        self._train_lengths()  # a bad length column is an error now, not at fit

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

    @property
    def loaders(self) -> HFDataHooks:
        """The owner of HF's dataloader methods the Lightning hooks call: `loader_owner`, else this data module."""
        return self.loader_owner if self.loader_owner is not None else self

    # ----- column handling -----
    @override
    def setup(self, stage: str) -> None:
        """Measure the training samples for `group_by_length` (once per train dataset), then resolve the columns the
        model accepts (HF `remove_unused_columns`); every loader drops the others, as HF's `_get_dataloader` does, and
        the datasets themselves stay as given (HF's `trainer.train_dataset` is too), so a length column is still
        there to be read."""
        self._train_lengths()
        self._resolve_columns()
        self._check_rows(stage)

    def _row_model(self) -> nn.Module | None:
        module = self.trainer.lightning_module if self.trainer is not None else None
        return getattr(module, "model", None) or self.signature_model

    def _check_rows(self, stage: str) -> None:
        """One pass over the rows of the datasets this stage reads, before it starts (`row_checks.py`): a row the
        model cannot take is one error naming it, not a crash at the step that first draws it."""
        named = {f"eval ({name})" if name else "eval": dataset for name, dataset in (self.eval_datasets or {}).items()}
        datasets = {"fit": {"train": self.train_dataset, **named}, "validate": named,
                    "predict": {"test": self.predict_dataset}}.get(stage, {})
        for split, dataset in datasets.items():
            self._check_ahead(dataset, split)

    def _check_ahead(self, dataset: Any, split: str) -> bool:
        """Check a `datasets.Dataset`'s rows once (True); False for data that is only checked as it is read."""
        if dataset is None or not can_check_ahead(dataset):
            return False
        model = self._row_model()
        if model is None:
            return False
        limits = RowLimits.of(model)
        if any(done is dataset and checked == limits for done, checked in self._rows_checked):
            return True  # the same rows against the same model (`evaluate()` again, a batch-size search's next fit)
        check_dataset(dataset, split, limits)
        self._rows_checked.append((dataset, limits))
        return True

    def _train_lengths(self) -> list[int] | None:
        """The train dataset's lengths for `group_by_length` (None for another order), measured once per dataset."""
        if self.args.train_sampling_strategy != "group_by_length" or self.train_dataset is None:
            return None
        if self._lengths_of is not self.train_dataset:
            self.train_lengths = self._sample_lengths(self.train_dataset)
            self._lengths_of = self.train_dataset
        return self.train_lengths

    def _sample_lengths(self, dataset: Any) -> list[int]:
        return train_sample_lengths(dataset, self.args.length_column_name, self.processing_class)

    def _resolve_columns(self, module: Any = None) -> None:
        if module is None and self.trainer is not None:
            module = self.trainer.lightning_module
        model = getattr(module, "model", None) or self.signature_model
        if self.args.remove_unused_columns and model is not None:
            label_names = getattr(module, "label_names", None)  # the trainer's `label_names`, if it was set
            if label_names is None:
                label_names = self.args.label_names or find_label_names(model)
            self._allowed_columns = self._owner_columns() or signature_columns(model, label_names)
            self._label_names = list(label_names)

    def _owner_columns(self) -> list[str] | None:
        """The owner's `_signature_columns` after its `_set_signature_columns_if_needed` (HF's point: the first
        loader), or None without an owner."""
        owner = self.columns_owner
        if owner is None:
            return None
        owner._set_signature_columns_if_needed()
        return None if owner._signature_columns is None else list(owner._signature_columns)

    def check_training_labels(self, dataset: Any = None, module: Any = None) -> None:
        """A training dataset whose label column `remove_unused_columns` would drop is one error before training
        (`collate.missing_labels_problem`); a user loss (`compute_loss` / `training_step` override,
        `compute_loss_func`) may need no labels and is not judged.

        Args:
            dataset: the training dataset (default: `train_dataset`).
            module: the `TransformerModule` that will train (default: the attached trainer's).

        Raises:
            ValueError: naming the dropped columns and the model's arguments.
        """
        dataset = self.train_dataset if dataset is None else dataset
        columns = getattr(dataset, "column_names", None)
        if columns is None:
            return
        if module is None and self.trainer is not None:
            module = self.trainer.lightning_module
        if getattr(module, "hf_loss_rule", False) or getattr(module, "compute_loss_func", None) is not None:
            return
        if self._allowed_columns is None:
            self._resolve_columns(module)
        if self._allowed_columns is None:  # remove_unused_columns=False: every column reaches the collator
            return
        problem = missing_labels_problem(columns, self._allowed_columns, self._label_names, self.data_collator)
        if problem is not None:
            raise ValueError(problem)

    def _with_columns(self, dataset: Any, description: str) -> tuple[Any, Any]:
        """`(dataset, collator)`: a `datasets.Dataset` loses its unused columns; other datasets are filtered by item."""
        if self._allowed_columns is None:
            self._resolve_columns()
        collator = self.data_collator
        split = {"Training": "train", "Evaluation": "eval"}.get(description, description)
        if not self._check_ahead(dataset, split) and (model := self._row_model()) is not None:
            # a stream or a torch dataset: each row is checked as it is read, and named when it is met
            collator = RowCheckingCollator(collator, split, RowLimits.of(model))
        if self._allowed_columns is None:
            return dataset, collator
        if hasattr(dataset, "column_names"):
            return remove_unused_columns(dataset, self._allowed_columns, description.lower()), collator
        return dataset, ColumnFilter(collator, self._allowed_columns)

    def example_micro_batch(self, size: int) -> dict[str, Any]:
        """The first `size` training rows collated as the training loader collates them (unused columns removed):
        the memory plan reads their keys, dtypes and dimensions.

        Raises:
            ValueError: there is no `train_dataset`, or it has no rows.
        """
        if self.train_dataset is None:
            raise ValueError("Trainer: the memory plan needs a train_dataset (it plans a training update).")
        dataset, collate = self._with_columns(self.train_dataset, "Training")
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            rows = list(islice(iter(dataset), size))
        else:
            rows = [dataset[i] for i in range(min(size, len(dataset)))]
        if not rows:
            raise ValueError("Trainer: the memory plan needs at least one training row; train_dataset is empty.")
        return dict(collate(rows))

    @override
    def teardown(self, stage: str) -> None:
        """The next fit asks for a new train loader (HF calls `get_train_dataloader` once per `train()`)."""
        if stage == "fit":
            self._fit_loader = None

    @override
    def on_exception(self, exception: BaseException) -> None:
        """A failed fit (Lightning skips `teardown` then) leaves no loader behind: `auto_find_batch_size` fits again
        with a smaller batch and must get a new one."""
        self._fit_loader = None

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
        return loader_options(self.args)

    # ----- HF's dataloader methods (the built-ins; an `hf_lightning.Trainer` subclass may override them) -----
    def get_train_dataloader(self) -> DataLoader | DispatchLoader:
        """HF's `get_train_dataloader` (T:916-934): micro-batches of `train_dataset` in HF's seeded order.

        Raises:
            ValueError: there is no `train_dataset`.
        """
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        loaders = self.loaders
        return loaders._get_dataloader(self.train_dataset, "Training", self.args.per_device_train_batch_size,
                                       loaders._get_train_sampler, is_training=True)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
        """HF's `get_eval_dataloader` (T:936-973): `eval_dataset` is a dataset, an eval dataset's name, or None.

        Raises:
            ValueError: no eval dataset, an unknown name, or None with several named eval datasets.
        """
        dataset = self._eval_dataset(eval_dataset)
        key = eval_dataset if isinstance(eval_dataset, str) else "eval"
        # HF reuses the loader of a key under `dataloader_persistent_workers` (its workers stay up between
        # evaluations); HF's would also hand back the cached loader for another dataset passed in, so the dataset
        # must be the same object here too
        cached = self._eval_loaders.get(key)
        if self.args.dataloader_persistent_workers and cached is not None and cached[0] is dataset:
            return cached[1]
        loaders = self.loaders
        loader = loaders._get_dataloader(dataset, "Evaluation", self.args.per_device_eval_batch_size,
                                         loaders._get_eval_sampler, dataloader_key=key)
        if self.args.dataloader_persistent_workers:
            self._eval_loaders[key] = (dataset, loader)
        return loader

    def _eval_dataset(self, eval_dataset: Any) -> Any:
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            return eval_dataset
        if eval_dataset is None:
            datasets = self.eval_datasets or {}
            if "" not in datasets:
                raise ValueError("Trainer: evaluation requires an eval_dataset." if not datasets else
                                 f"get_eval_dataloader(None): the eval datasets are named {list(datasets)}; pass one "
                                 "of these names or a dataset.")
            return datasets[""]
        return self.get_eval_dataset(eval_dataset)

    def get_eval_dataset(self, name: str) -> Any:
        """The eval dataset named `name` (HF's `eval_dataset[name]`).

        Raises:
            ValueError: no eval dataset has that name.
        """
        if name not in self.named_eval_datasets:
            raise ValueError(f"No eval dataset is named {name!r}; the eval datasets are named "
                             f"{[n for n in self.named_eval_datasets if n]}.")
        return self.named_eval_datasets[name]

    @contextmanager
    def evaluating(self, dataset: Any, loader_arg: Any) -> Iterator[None]:
        """Within the block, the validation loaders are `dataset`'s alone (`get_eval_dataloader(loader_arg)`): one
        dataset of HF's `evaluate()`."""
        saved = self.eval_datasets, self.eval_loader_args
        self.eval_datasets, self.eval_loader_args = {"": dataset}, {"": loader_arg}
        try:
            yield
        finally:
            self.eval_datasets, self.eval_loader_args = saved

    @contextmanager
    def running_loader(self, loader: Any) -> Iterator[None]:
        """Within the block, the validation loader is `loader` itself (an `evaluation_loop(dataloader)` call),
        sharded across processes here when it is not already (`shard_eval_loader`)."""
        saved = self.eval_datasets, self.eval_loader_args, self.loop_loader
        self.eval_datasets, self.eval_loader_args = {"": getattr(loader, "dataset", None)}, None
        self.loop_loader = loader
        try:
            yield
        finally:
            self.eval_datasets, self.eval_loader_args, self.loop_loader = saved

    @contextmanager
    def predicting(self, dataset: Any) -> Iterator[None]:
        """Within the block, the prediction loader is `dataset`'s (`get_test_dataloader(dataset)`): HF's `predict`."""
        saved, self.predict_dataset = self.predict_dataset, dataset
        try:
            yield
        finally:
            self.predict_dataset = saved

    def get_test_dataloader(self, test_dataset: Any) -> DataLoader:
        """HF's `get_test_dataloader` (T:975-991)."""
        loaders = self.loaders
        return loaders._get_dataloader(test_dataset, "test", self.args.per_device_eval_batch_size,
                                       loaders._get_eval_sampler)

    def _get_train_sampler(self, train_dataset: Any = None) -> Sampler | None:
        """HF's training order (T:1071-1145): the seeded `seed + epoch` permutation, sequential, or length-grouped in
        groups of `train_batch_size * gradient_accumulation_steps` (HF's `LengthGroupedSampler`); None if unsized."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        size = dataset_length(dataset)
        if size is None:
            return None
        args = self.args
        seed = args.data_seed if args.data_seed is not None else args.seed
        lengths = self._train_lengths()
        if lengths is not None and len(lengths) != size:  # another dataset than `train_dataset`
            lengths = self._sample_lengths(dataset)
        return EpochSampler(size, seed, shuffle=args.train_sampling_strategy == "random", lengths=lengths,
                            group_size=args.per_device_train_batch_size * args.gradient_accumulation_steps,
                            seedable=loader_settings(args).use_seedable_sampler)

    def _get_eval_sampler(self, eval_dataset: Any) -> Sampler | None:
        """Evaluation order: this process's contiguous, unpadded block of the dataset (None if unsized)."""
        size = dataset_length(eval_dataset)
        if size is None:
            return None
        world, rank = self._world()
        return ContiguousShardSampler(size, world, rank, self.args.per_device_eval_batch_size)

    def _get_dataloader(
        self, dataset: Any, description: str, batch_size: int, sampler_fn: Callable[[Any], Any] | None = None,
        is_training: bool = False, dataloader_key: str | None = None,
    ) -> DataLoader | DispatchLoader:
        """HF's `_get_dataloader` (T:1007-1069): unused columns removed, `sampler_fn`'s order, sharded per process.

        The loader carries accelerate's `total_batch_size` (what HF's prepared `DataLoaderShard` reports: the batch
        of all processes together, `batch_size` per process times the processes; read by HF's tests and libraries).
        With `accelerator_config={"split_batches": True}`, `batch_size` is that of all processes together: each
        process reads `batch_size // processes` (`sampling.split_batch_size`), as accelerate splits every batch.
        """
        world = self._world()[0]
        if world > 1 and self.args.eval_use_gather_object:
            raise ValueError(
                f"eval_use_gather_object=True under {world} processes: hf_lightning gathers evaluation outputs as "
                "tensors inside Lightning's loop, not as Python objects (HF's object gather of tensors returns lists "
                "of rows). Use eval_use_gather_object=False, and gather Python objects in your `compute_metrics` "
                "yourself (`trainer.accelerator.gather_for_metrics(objects, use_gather_object=True)`)."
            )
        settings = loader_settings(self.args)
        if world > 1 and settings.dispatch_batches is not None:
            if is_training and settings.dispatch_batches:
                return self._dispatch_loader(dataset, description, batch_size, sampler_fn)
            if settings.dispatch_batches is False and dataset_length(dataset) is None:
                raise ValueError(
                    f"accelerator_config dispatch_batches=False with a stream (`IterableDataset`) under {world} "
                    "processes: accelerate then shards the stream by its files, or slices every round of batches on "
                    "every process, neither of which hf_lightning reads. Use dispatch_batches=True (rank 0 reads "
                    "every batch and sends each process its part, as accelerate) or None (each process reads its "
                    "`split_dataset_by_node` part)."
                )
        if settings.split_batches:  # accelerate: the batch of all processes together, split into per-process parts
            what = "per_device_train_batch_size" if is_training else "per_device_eval_batch_size"
            loader = self._build_loader(dataset, description, split_batch_size(batch_size, world, what), sampler_fn,
                                        is_training)
            loader.total_batch_size = batch_size
            return loader
        loader = self._build_loader(dataset, description, batch_size, sampler_fn, is_training)
        loader.total_batch_size = batch_size * world
        return loader

    def _dispatch_loader(self, dataset: Any, description: str, batch_size: int,
                         sampler_fn: Callable[[Any], Any] | None) -> DispatchLoader:
        """The train loader of `dispatch_batches=True` under several processes: the whole loader, read by rank 0,
        each process given its part of every round (`data/dispatch.py`); evaluation loaders stay this process's
        contiguous shard (the results are one process's either way)."""
        world, rank = self._world()
        split = loader_settings(self.args).split_batches
        if split:
            split_batch_size(batch_size, world, "per_device_train_batch_size")  # accelerate's error, by name
        whole = self._build_loader(dataset, description, batch_size, sampler_fn, True, world=1, rank=0)
        return DispatchLoader(whole, world, rank, split_batches=split, drop_last=self.args.dataloader_drop_last)

    def _build_loader(self, dataset: Any, description: str, batch_size: int,
                      sampler_fn: Callable[[Any], Any] | None, is_training: bool, world: int | None = None,
                      rank: int = 0) -> DataLoader:
        """One loader; `world` / `rank` (default: this run's) say which processes' shard it reads."""
        if is_training:
            self.check_training_labels(dataset)
        dataset, collate = self._with_columns(dataset, description)
        if world is None:
            world, rank = self._world()
        kwargs = self._loader_kwargs()
        drop_last = self.args.dataloader_drop_last
        if isinstance(dataset, IterableDataset):
            return iterable_loader(dataset, is_training, world, rank, batch_size=batch_size, collate_fn=collate,
                                   drop_last=drop_last, **kwargs)
        sampler = sampler_fn(dataset) if sampler_fn is not None else None
        if is_training:
            # HF seeds each worker from its base seed (`seed_worker`, T:1047-1050); collators draw there
            init = partial(seed_worker, num_workers=self.args.dataloader_num_workers, rank=rank)
            return EpochLoader(dataset, batch_sampler=self._train_batches(dataset, sampler, batch_size, world, rank),
                               collate_fn=collate, worker_init_fn=init, **kwargs)
        if sampler is not None and not isinstance(sampler, ContiguousShardSampler) and world > 1:
            sampler = ContiguousShardSampler(len(dataset), world, rank, batch_size, order=sampler)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate, drop_last=drop_last,
                          **kwargs)

    def _train_batches(self, dataset: Any, sampler: Any, batch_size: int, world: int, rank: int) -> Sampler:
        """The micro-batch sampler: O(1)-resumable for HF's own order, `OrderBatchSampler` for any other sampler.

        Raises:
            ValueError: `even_batches=False` and batches that would leave some process one batch short
                (`sampling.uneven_batches_problem`).
        """
        drop_last = self.args.dataloader_drop_last
        even = loader_settings(self.args).even_batches
        batches: WindowBatchSampler | OrderBatchSampler
        if isinstance(sampler, EpochSampler):
            batches = WindowBatchSampler(len(dataset), batch_size, 1, sampler.seed, sampler.shuffle, drop_last, world,
                                         rank, lengths=sampler.lengths, group_size=sampler.group_size,
                                         even_batches=even, seedable=sampler.seedable)
        else:
            batches = OrderBatchSampler(range(len(dataset)) if sampler is None else sampler, batch_size, drop_last,
                                        world, rank, even_batches=even)
        if not even:
            size = dataset_length(batches.sampler if isinstance(batches, OrderBatchSampler) else dataset)
            problem = None if size is None else uneven_batches_problem(-(-size // batch_size), world, drop_last)
            if problem is not None:
                raise ValueError(problem)
        return batches

    # ----- Lightning's loaders -----
    def train_loader(self) -> Any:
        """The micro-batch loader of the running fit (see `FlowDataModule`)."""
        return self._fit_train_loader()

    def _fit_train_loader(self) -> Any:
        """`get_train_dataloader()` of the running fit, called once (HF calls it once per `train()`)."""
        if self._fit_loader is None:
            self._fit_loader = self.loaders.get_train_dataloader()
        return self._fit_loader

    def num_train_microbatches(self) -> int | None:
        """Micro-batches per epoch on one process (`None` for an unsized loader): HF's `len(train_dataloader)`."""
        if self.train_dataset is None and self.loader_owner is None:
            return None
        return dataset_length(self._fit_train_loader())

    @override
    def train_dataloader(self) -> Any:
        """The train loader's micro-batches in windows of `gradient_accumulation_steps`, one window per update."""
        loader = self._fit_train_loader()
        accumulation = self.args.gradient_accumulation_steps
        if not is_sized(loader):
            self.windows = None
            self.train_stream = stream_windows(loader, accumulation, self.resume_position, self.resume_stream_position)
            self.resume_position = self.resume_stream_position = None
            return self.train_stream
        self.train_stream = None
        self.windows = windows = WindowStream(loader, accumulation)
        if self.resume_position is not None:
            # the resumed epoch starts at its window: O(1) for our samplers, index-only for a map-style loader
            epoch, windows.skip = self.resume_position
            if self.resume_start_sample:  # an elastic resume: the rest of the epoch's order, in this run's windows
                windows.skip, windows.start_sample = 0, self.resume_start_sample
            windows.set_epoch(epoch)
            sampler = _train_batch_sampler(loader)
            if windows.skip and self.resume_grouping_draw is not None and isinstance(sampler, WindowBatchSampler):
                # inside an epoch its saved draw is its order; at an epoch start (or `ignore_data_skip`) the order
                # is drawn after the RNG states are loaded, as HF's
                sampler.restore_grouping_draw(self.resume_grouping_draw)
            self.resume_position, self.resume_grouping_draw, self.resume_start_sample = None, None, 0
        return windows

    @override
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the data (`lightning_state.pt`): with `group_by_length`, the current epoch's
        draw (the global generator state its order was drawn from), so a run resumed inside the epoch continues
        that order."""
        sampler = _train_batch_sampler(self._fit_loader)
        draw = sampler.grouping_draw if isinstance(sampler, WindowBatchSampler) else None
        return {"length_grouping": draw.to_dict()} if draw is not None else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A checkpoint's `state_dict()`, restored on resume before the train loader is made."""
        saved = state_dict.get("length_grouping")
        self.resume_grouping_draw = GroupingDraw.from_dict(saved) if saved else None

    def sample_position(self, windows_done: int) -> dict[str, Any] | None:
        """Where the current epoch's order stands after `windows_done` windows (Lightning's count): the order
        (`num_samples`, `seed`, `shuffle`) and the samples of it trained over all processes (`samples_done`), for a
        resume in any geometry (`checkpoint/elastic.py`); None when the order is not hf_lightning's own (a sampler
        override, `group_by_length`, an unsized loader)."""
        sampler = _train_batch_sampler(self._fit_loader)
        if self.windows is None or not isinstance(sampler, WindowBatchSampler) or sampler.draws_globally:
            return None
        done = self.windows.samples_done(windows_done)
        if done is None:
            return None
        return {"samples_done": done, "num_samples": sampler.num_samples, "seed": sampler.seed,
                "shuffle": sampler.shuffle}

    def train_order(self) -> dict[str, Any] | None:
        """This run's train order as `sample_position` records it (`num_samples`, `seed`, `shuffle`), or None when it
        is not hf_lightning's own `seed + epoch` order."""
        sampler = _train_batch_sampler(self._fit_train_loader())
        if not isinstance(sampler, WindowBatchSampler) or sampler.draws_globally:
            return None
        return {"num_samples": sampler.num_samples, "seed": sampler.seed, "shuffle": sampler.shuffle}

    def rest_windows(self, start_sample: int) -> int | None:
        """Windows of this run left in an epoch resumed after `start_sample` samples of its order (None: the train
        order is not hf_lightning's own, so it cannot start at a sample)."""
        loader = self._fit_train_loader()
        sampler = _train_batch_sampler(loader)
        if not isinstance(sampler, WindowBatchSampler) or sampler.draws_globally:
            return None
        return WindowStream(loader, self.args.gradient_accumulation_steps).rest_windows(start_sample)

    def train_stream_position(self, windows_done: int) -> Any:
        """The position of the unsized train stream after `windows_done` windows of the current pass (saved in
        checkpoints, per process), or None (a sized loader, a stream without a state, or not recorded)."""
        position = self.train_stream.position_after(windows_done) if self.train_stream is not None else None
        return to_plain(position) if position is not None else None

    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A training window's micro-batches are fetched now, right before its update (see the module docstring)."""
        return batch.materialize() if isinstance(batch, LazyWindow) else batch

    def _eval_loader_arg(self, name: str) -> Any:
        if self.eval_loader_args is not None and name in self.eval_loader_args:
            return self.eval_loader_args[name]
        return name or None

    @override
    def val_dataloader(self) -> Any:
        """One loader per eval dataset, in the order of `eval_dataset_names` (`get_eval_dataloader` each)."""
        if self.loop_loader is not None:
            return shard_eval_loader(self.loop_loader, *self._world())
        if not self.eval_datasets:
            return []
        loaders = [self.loaders.get_eval_dataloader(self._eval_loader_arg(name)) for name in self.eval_datasets]
        return loaders[0] if len(loaders) == 1 else loaders

    @override
    def test_dataloader(self) -> Any:
        """Same as `val_dataloader` (Lightning's `test` runs the evaluation code)."""
        return self.val_dataloader()

    @override
    def predict_dataloader(self) -> Any:
        """The prediction dataset, in dataset order (`get_test_dataloader`)."""
        if self.predict_dataset is None:
            raise ValueError("`predict_dataset` is None: pass a dataset to predict on.")
        return self.loaders.get_test_dataloader(self.predict_dataset)
