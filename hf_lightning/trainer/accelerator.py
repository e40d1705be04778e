"""`Trainer.accelerator`: the accelerate `Accelerator` calls that pasted `transformers.Trainer` code makes.

There is no accelerate `Accelerator` under hf_lightning: Lightning's trainer owns devices, strategies and precision.
Override bodies copied from `transformers.Trainer` subclasses call a few of its methods (`self.accelerator.backward`,
`unwrap_model`, `gather`, `is_main_process`...); `LightningAccelerator` answers them from the running Lightning trainer
and module. Anything else raises an `AttributeError` naming what is supported, never a silent no-op.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from hf_lightning._lightning_compat import grad_scaler
from hf_lightning.args import TrainingArguments
from hf_lightning.args.accelerator_config import loader_settings
from hf_lightning.data.sampling import BatchShard, batch_shard_problem, dataset_length
from hf_lightning.data.windows import EpochLoader
from hf_lightning.model_wrappers import without_compile
from hf_lightning.module.module import TransformerModule

__all__ = ["AcceleratorState", "LightningAccelerator", "SUPPORTED", "StrategyPlugin"]

SUPPORTED = (
    "autocast", "backward", "device", "dispatch_batches", "distributed_type", "even_batches", "gather",
    "gather_for_metrics",
    "gradient_accumulation_steps", "gradient_state", "is_local_main_process", "is_main_process", "local_process_index",
    "mixed_precision", "no_sync", "num_processes", "optimizer_step_was_skipped", "pad_across_processes",
    "parallelism_config", "prepare", "prepare_model", "print", "process_index", "reduce", "scaler", "split_batches",
    "state", "sync_gradients", "unwrap_model", "use_distributed", "use_seedable_sampler", "wait_for_everyone",
)
"""The accelerate `Accelerator` members `LightningAccelerator` provides."""

_ACCUMULATION_DEFAULTS = {"num_steps": None, "adjust_scheduler": True, "sync_with_dataloader": True,
                          "sync_each_batch": False}
"""accelerate's `GradientAccumulationPlugin` defaults (its `to_kwargs()` keeps only the values that differ)."""


@dataclass(frozen=True)
class GradientStateView:
    """What HF's tests and libraries read of accelerate's `GradientState`."""

    plugin_kwargs: dict[str, Any]
    sync_gradients: bool


_EVEN_BATCHES = "_accelerator_even_batches"
"""The owner's attribute holding a value given to `accelerator.even_batches`."""


def _all_tensors(data: Any) -> bool:
    """Whether every leaf of nested lists / tuples / dicts is a tensor."""
    if isinstance(data, Mapping):
        return all(_all_tensors(value) for value in data.values())
    if isinstance(data, (list, tuple)):
        return bool(data) and all(_all_tensors(value) for value in data)
    return isinstance(data, torch.Tensor)


class AcceleratorOwner(Protocol):
    """What `LightningAccelerator` reads from its `hf_lightning.Trainer`."""

    module: TransformerModule
    """The `TransformerModule` being trained."""
    lightning_trainer: pl.Trainer | None
    """The running `lightning.Trainer`, or None before the first run."""
    args: TrainingArguments
    """The training arguments."""


PLUGIN_ATTRIBUTES = {"deepspeed": ("kind", "strategy", "deepspeed_config", "zero_stage"),
                     "fsdp": ("kind", "strategy", "fsdp_version")}
"""What a `StrategyPlugin` answers, by kind."""


class StrategyPlugin:
    """`accelerator.state.deepspeed_plugin` / `fsdp_plugin` under Lightning: which sharded strategy runs.

    Attributes:
        kind: "deepspeed" or "fsdp".
        strategy: the Lightning strategy (None before the first run: then the strategy requested).
        deepspeed_config: the DeepSpeed config dict (DeepSpeed only; `hf_ds_config.config` in accelerate).
        zero_stage: the ZeRO stage (DeepSpeed only).
        fsdp_version: 1 (Lightning's `FSDPStrategy`) or 2 (`ModelParallelStrategy`, FSDP2) (FSDP only).
    """

    def __init__(self, kind: str, strategy: Any, deepspeed_config: dict[str, Any] | None = None,
                 fsdp_version: int | None = None) -> None:
        self.kind, self.strategy = kind, strategy
        if kind == "deepspeed":
            self.deepspeed_config = dict(deepspeed_config or {})
            self.zero_stage = int(self.deepspeed_config.get("zero_optimization", {}).get("stage", 0))
        else:
            self.fsdp_version = fsdp_version

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"accelerator.state.{self.kind}_plugin has no {name!r} under hf_lightning: Lightning's strategy runs "
            f"{self.kind}. It answers {', '.join(PLUGIN_ATTRIBUTES.get(self.kind, ()))}; read the rest from "
            "`trainer.lightning_trainer.strategy`."
        )


class AcceleratorState:
    """`accelerator.state`: the members of accelerate's `AcceleratorState` HF code reads.

    Attributes:
        deepspeed_plugin: a `StrategyPlugin` when DeepSpeed runs, else None.
        fsdp_plugin: a `StrategyPlugin` when FSDP (1 or 2) runs, else None.
    """

    def __init__(self, accelerator: LightningAccelerator) -> None:
        self._accelerator = accelerator
        kind, strategy, config, version = accelerator.strategy_kind()
        self.deepspeed_plugin = StrategyPlugin("deepspeed", strategy, config) if kind == "deepspeed" else None
        self.fsdp_plugin = StrategyPlugin("fsdp", strategy, fsdp_version=version) if kind == "fsdp" else None

    @property
    def distributed_type(self) -> str:
        return self._accelerator.distributed_type

    @property
    def num_processes(self) -> int:
        return self._accelerator.num_processes

    @property
    def process_index(self) -> int:
        return self._accelerator.process_index

    @property
    def local_process_index(self) -> int:
        return self._accelerator.local_process_index

    @property
    def device(self) -> torch.device:
        return self._accelerator.device

    @property
    def mixed_precision(self) -> str:
        return self._accelerator.mixed_precision

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"accelerator.state has no {name!r} under hf_lightning. It answers deepspeed_plugin, fsdp_plugin, "
            "distributed_type, num_processes, process_index, local_process_index, device, mixed_precision."
        )


def _strategy_kind(strategy: Any) -> tuple[str | None, Any, dict[str, Any] | None, int | None]:
    """`(kind, strategy, deepspeed config, fsdp version)` of a Lightning strategy, its name, or hf_lightning's
    `StrategyRequest` (the request of the next run, before a Lightning trainer exists)."""
    deepspeed, fsdp = getattr(strategy, "deepspeed", None), getattr(strategy, "fsdp", None)
    if deepspeed is not None or fsdp is not None:  # a StrategyRequest
        if deepspeed is not None:
            return "deepspeed", strategy, dict(deepspeed), None
        return "fsdp", strategy, None, int(getattr(fsdp, "version", 1))
    name = (strategy if isinstance(strategy, str) else type(strategy).__name__).lower()
    if "deepspeed" in name:
        return "deepspeed", strategy, dict(getattr(strategy, "config", None) or {}), None
    if "modelparallel" in name or "fsdp2" in name:
        return "fsdp", strategy, None, 2
    if "fsdp" in name:
        return "fsdp", strategy, None, 1
    return None, strategy, None, None


class LightningAccelerator:
    """The `Accelerator` members HF code calls, answered by the trainer's running Lightning trainer and module.

    Args:
        owner: the `hf_lightning.Trainer` (its `module`, `lightning_trainer` and `args`).
    """

    def __init__(self, owner: AcceleratorOwner) -> None:
        self._owner = owner

    @property
    def _trainer(self) -> Any:
        return self._owner.lightning_trainer

    # ----- the step -----
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """`loss.backward()` through Lightning (`manual_backward`: AMP scaling, the strategy's backward).

        HF passes `scale_wrt_gas=False` under DeepSpeed; gradient accumulation is hf_lightning's, so it is dropped.

        Raises:
            TypeError: another keyword argument (e.g. LOMO's `learning_rate`), which has no meaning here.
        """
        kwargs.pop("scale_wrt_gas", None)
        if kwargs:
            raise TypeError(f"accelerator.backward: unsupported arguments {sorted(kwargs)} under hf_lightning.")
        self._owner.module.manual_backward(loss)

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
                     ) -> nn.Module:
        """The model inside DDP / `torch.compile` wrappers."""
        return without_compile(model)  # DDP and compile wrappers (a PEFT model stays one, as in accelerate)

    def autocast(self, autocast_handler: Any = None) -> AbstractContextManager:
        """The precision plugin's autocast context (already active inside a training or evaluation step)."""
        trainer = self._trainer
        return trainer.precision_plugin.forward_context() if trainer is not None else nullcontext()

    def no_sync(self, model: nn.Module | None = None) -> AbstractContextManager:
        """No gradient all-reduce inside the block (the strategy's `block_backward_sync`)."""
        trainer = self._trainer
        block = getattr(getattr(trainer, "strategy", None), "block_backward_sync", None)
        return block() if callable(block) else nullcontext()

    @property
    def sync_gradients(self) -> bool:
        """Whether the micro-batch running now is the last of its update (gradients are all-reduced after it)."""
        return bool(self._owner.module.is_last_micro_batch)

    @property
    def gradient_accumulation_steps(self) -> int:
        return int(self._owner.args.gradient_accumulation_steps)

    @property
    def gradient_state(self) -> GradientStateView:
        """Accelerate's `gradient_state` as HF's Trainer configures it: `plugin_kwargs` (the accumulation kwargs that
        differ from accelerate's defaults, `num_steps` 1 since the Trainer accumulates itself) and `sync_gradients`."""
        config = getattr(self._owner.args, "accelerator_config", None)
        given = dict(getattr(config, "gradient_accumulation_kwargs", None) or {})
        given["num_steps"] = 1  # HF's Trainer (T:824): it accumulates itself
        kwargs = {key: value for key, value in given.items() if _ACCUMULATION_DEFAULTS.get(key, object()) != value}
        return GradientStateView(kwargs, self.sync_gradients)

    @property
    def use_seedable_sampler(self) -> bool:
        """`args.accelerator_config.use_seedable_sampler` (accelerate's default True)."""
        return bool(getattr(getattr(self._owner.args, "accelerator_config", None), "use_seedable_sampler", True))

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the AMP grad scaler skipped the last optimizer step (inf / NaN gradients)."""
        return bool(self._owner.module.optimizer_step_was_skipped)

    @property
    def mixed_precision(self) -> str:
        """Accelerate's name of the precision: "no", "fp16" or "bf16"."""
        precision = str(getattr(self._trainer, "precision", "32"))
        return "fp16" if precision.startswith("16") else "bf16" if precision.startswith("bf16") else "no"

    # ----- processes -----
    @property
    def device(self) -> torch.device:
        return self._owner.module.device

    @property
    def num_processes(self) -> int:
        trainer = self._trainer
        return int(trainer.world_size) if trainer is not None else int(self._owner.args.world_size)

    @property
    def process_index(self) -> int:
        trainer = self._trainer
        return int(trainer.global_rank) if trainer is not None else int(self._owner.args.process_index)

    @property
    def local_process_index(self) -> int:
        trainer = self._trainer
        return int(trainer.local_rank) if trainer is not None else int(self._owner.args.local_process_index)

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def distributed_type(self) -> str:
        """Accelerate's `DistributedType` value (a `str` enum: compare with `DistributedType.X` or its string)."""
        name = type(getattr(self._trainer, "strategy", None)).__name__
        if "DeepSpeed" in name:
            return "DEEPSPEED"
        if "FSDP" in name or "ModelParallel" in name:
            return "FSDP"
        if self.num_processes > 1:
            return "MULTI_GPU" if self.device.type == "cuda" else "MULTI_CPU"
        return "NO"

    def gather(self, tensor: Any) -> Any:
        """Every process's tensor, concatenated on dim 0 (a 0-dim tensor becomes one row per process); nested
        lists / tuples / dicts of tensors are gathered leaf by leaf, as accelerate's. Shapes beyond dim 0 must
        match across processes (`pad_across_processes` first)."""
        if isinstance(tensor, Mapping):
            return {key: self.gather(value) for key, value in tensor.items()}
        if isinstance(tensor, (list, tuple)):
            return type(tensor)(self.gather(value) for value in tensor)
        if self.num_processes == 1:
            return tensor
        gathered = self._trainer.strategy.all_gather(tensor)
        return gathered.reshape(-1, *tensor.shape[1:]) if tensor.dim() else gathered.reshape(-1)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """`gather`, or with `use_gather_object` (or any non-tensor data) every process's list concatenated in rank
        order. accelerate drops the samples its even-batch padding duplicated at the end of an eval loader;
        hf_lightning's eval shards (`get_eval_dataloader`, `evaluation_loop`) duplicate none, so nothing is dropped
        (see `even_batches`)."""
        tensors = isinstance(input_data, torch.Tensor) or (
            isinstance(input_data, (list, tuple, Mapping)) and _all_tensors(input_data))
        if tensors and not use_gather_object:
            return self.gather(input_data)
        if self.num_processes == 1:
            return input_data
        parts: list[Any] = [None] * self.num_processes
        torch.distributed.all_gather_object(parts, input_data)
        if all(isinstance(part, list) for part in parts):
            return [item for part in parts for item in part]
        return parts

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """`tensor` padded with `pad_index` along `dim` to the largest size any process has there (a collective);
        nested lists / tuples / dicts leaf by leaf, as accelerate's."""
        if isinstance(tensor, Mapping):
            return {key: self.pad_across_processes(value, dim, pad_index, pad_first) for key, value in tensor.items()}
        if isinstance(tensor, (list, tuple)):
            return type(tensor)(self.pad_across_processes(value, dim, pad_index, pad_first) for value in tensor)
        if self.num_processes == 1 or tensor.dim() == 0 or dim >= tensor.dim():
            return tensor
        size = torch.tensor([tensor.shape[dim]], device=tensor.device)
        largest = int(self.gather(size).max())
        if largest == tensor.shape[dim]:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = largest
        padded = tensor.new_full(shape, pad_index)
        span = slice(largest - tensor.shape[dim], largest) if pad_first else slice(0, tensor.shape[dim])
        index = [slice(None)] * tensor.dim()
        index[dim] = span
        padded[tuple(index)] = tensor
        return padded

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum", scale: float = 1.0) -> torch.Tensor:
        """The sum (or mean) over processes."""
        if reduction not in ("sum", "mean"):
            raise ValueError(f"accelerator.reduce: reduction={reduction!r}; hf_lightning supports 'sum' and 'mean'.")
        if self.num_processes == 1:
            return tensor * scale
        return self._trainer.strategy.reduce(tensor.clone(), reduce_op=reduction) * scale

    @property
    def split_batches(self) -> bool:
        """`args.accelerator_config.split_batches` (False, accelerate's default: batch sizes are per process; True: the
        `per_device_*_batch_size` loaders are split across the processes, as accelerate does)."""
        return bool(getattr(getattr(self._owner.args, "accelerator_config", None), "split_batches", False))

    @property
    def dispatch_batches(self) -> bool | None:
        """The `dispatch_batches` of accelerate: `args.accelerator_config.dispatch_batches` (None, accelerate's default:
        every process reads its own shard; other values are refused by the arguments)."""
        config = getattr(self._owner.args, "accelerator_config", None)
        return getattr(config, "dispatch_batches", None)

    @property
    def even_batches(self) -> bool:
        """`args.accelerator_config.even_batches` (accelerate's default True) until set here: the training loaders
        follow it (`data/sampling.py`). hf_lightning's eval shards never repeat a sample whatever its value (they are
        contiguous blocks that may differ by one batch: the results accelerate's `gather_for_metrics` gives after
        dropping its padding, and those of one process).

        Setting it (sentence-transformers sets False before preparing its train loader, True for its eval loaders) is
        honoured by `prepare(DataLoader)`: a loader that would need accelerate's padding (True) or leave a process a
        batch short (False) is refused there, by name; one that needs neither is sharded as accelerate does."""
        value = getattr(self._owner, _EVEN_BATCHES, None)
        if value is None:
            return loader_settings(self._owner.args).even_batches
        return bool(value)

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        setattr(self._owner, _EVEN_BATCHES, bool(value))  # the accelerator object is made anew at every access

    @property
    def parallelism_config(self) -> None:
        """None: no tensor, context or sequence parallelism runs under hf_lightning (TRL checks it for None)."""
        return None

    @property
    def state(self) -> AcceleratorState:
        """`deepspeed_plugin` / `fsdp_plugin` (a `StrategyPlugin` saying which runs, else None), and the process
        members."""
        return AcceleratorState(self)

    def strategy_kind(self) -> tuple[str | None, Any, dict[str, Any] | None, int | None]:
        """`(kind, strategy, deepspeed config, fsdp version)` of the running strategy, or of the next run's request
        before a Lightning trainer exists; kind is "deepspeed", "fsdp" or None."""
        trainer = self._trainer
        if trainer is not None:
            return _strategy_kind(trainer.strategy)
        return _strategy_kind(getattr(self._owner, "_trainer_kwargs", {}).get("strategy", "auto"))

    def prepare(self, *objects: Any, device_placement: list[bool] | None = None) -> Any:
        """Identity for what Lightning already prepared: models go through `prepare_model`, optimizers and
        schedulers come back as they are (Lightning's strategy wraps and steps the trainer's own); a `DataLoader`
        becomes this process's shard with accelerate's `set_epoch` (`_prepare_loader`).

        Raises:
            ValueError, NotImplementedError: a `DataLoader` that cannot be sharded exactly (`_prepare_loader`).
        """
        prepared = [self._prepare_one(obj) for obj in objects]
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def _prepare_one(self, obj: Any) -> Any:
        if isinstance(obj, nn.Module):
            return self.prepare_model(obj)
        if isinstance(obj, DataLoader):
            return self._prepare_loader(obj)
        return obj

    def _prepare_loader(self, loader: DataLoader) -> DataLoader:
        """A plain map-style `DataLoader` as accelerate's `DataLoaderShard`: `set_epoch` reaches its batch sampler
        every epoch (`EpochLoader`), and under several processes it yields this process's batches (`BatchShard`,
        batch `i` on rank `i % num_processes`). Anything else comes back as it is on one process.

        Raises:
            ValueError: several processes and batches that accelerate would pad or leave uneven
                (`sampling.batch_shard_problem`, which names `even_batches` and what to change).
            NotImplementedError: several processes and a loader that cannot be sharded by batch (an iterable dataset,
                a `DataLoader` subclass).
        """
        world = self.num_processes
        batch_sampler: Any = loader.batch_sampler
        plain = type(loader) is DataLoader and not isinstance(loader.dataset, torch.utils.data.IterableDataset) \
            and batch_sampler is not None
        if not plain:
            if world > 1:
                raise NotImplementedError(
                    f"accelerator.prepare({type(loader).__name__}) under several processes: hf_lightning shards a "
                    "plain map-style DataLoader by batch, not this one. Pass it to `trainer.evaluation_loop(loader, "
                    "...)` (sharded exactly there), or build it with `trainer.get_eval_dataloader()` / "
                    "`get_test_dataloader()`."
                )
            return loader
        if world > 1:
            size = getattr(batch_sampler, "batch_size", None)
            rows = dataset_length(loader.dataset)
            full = bool(getattr(batch_sampler, "drop_last", False)) or size is None or (rows or 0) % size == 0
            problem = batch_shard_problem(len(batch_sampler), full, world, self.even_batches)
            if problem is not None:
                raise ValueError(problem)
            batch_sampler = BatchShard(batch_sampler, world, self.process_index)
        return EpochLoader(
            loader.dataset, batch_sampler=batch_sampler, collate_fn=loader.collate_fn, num_workers=loader.num_workers,
            pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
            prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers,
        )

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
                      ) -> nn.Module:
        """The trainer's model comes back as it is (Lightning placed and wrapped it). Another model (e.g. TRL's
        reference model) is moved to this process's device, which is all accelerate does in `evaluation_mode`.

        Raises:
            NotImplementedError: another model to train under several processes (accelerate would wrap it in DDP;
                Lightning wraps only the trainer's model).
        """
        own = self._owner.module.model
        if model is own or without_compile(model) is without_compile(own):
            return model
        if not evaluation_mode and self.num_processes > 1:
            raise NotImplementedError(
                "accelerator.prepare_model: only the trainer's own model is trained (and wrapped) by Lightning under "
                "several processes; pass evaluation_mode=True for a model used without gradients (it is moved to "
                "the device), or make it part of the trainer's model."
            )
        return model.to(self.device) if device_placement is not False else model

    def wait_for_everyone(self) -> None:
        trainer = self._trainer
        if trainer is not None:
            trainer.strategy.barrier("accelerator.wait_for_everyone")

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on the local main process only."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    @property
    def scaler(self) -> Any:
        """The AMP grad scaler of a `"16-mixed"` run, else None."""
        trainer = self._trainer
        return grad_scaler(trainer) if trainer is not None else None

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"hf_lightning.Trainer.accelerator has no {name!r}: there is no accelerate Accelerator under Lightning. "
            f"Supported: {', '.join(SUPPORTED)}. Use `trainer.lightning_trainer` (the lightning.Trainer) for the rest."
        )
