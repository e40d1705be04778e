"""`Trainer.accelerator`: the accelerate `Accelerator` calls that pasted `transformers.Trainer` code makes.

There is no accelerate `Accelerator` under hf_lightning: Lightning's trainer owns devices, strategies and precision.
Override bodies copied from `transformers.Trainer` subclasses call a few of its methods (`self.accelerator.backward`,
`unwrap_model`, `gather`, `is_main_process`...); `LightningAccelerator` answers them from the running Lightning trainer
and module. Anything else raises an `AttributeError` naming what is supported, never a silent no-op.
"""

from __future__ import annotations

import builtins
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch
from torch import nn

from hf_lightning._lightning_compat import grad_scaler
from hf_lightning.model_wrappers import without_compile

__all__ = ["LightningAccelerator", "SUPPORTED"]

SUPPORTED = (
    "autocast", "backward", "device", "distributed_type", "gather", "gather_for_metrics", "gradient_accumulation_steps",
    "is_local_main_process", "is_main_process", "local_process_index", "mixed_precision", "no_sync",
    "num_processes", "optimizer_step_was_skipped", "print", "process_index", "reduce", "scaler", "sync_gradients",
    "unwrap_model", "use_distributed", "wait_for_everyone",
)
"""The accelerate `Accelerator` members `LightningAccelerator` provides."""


class AcceleratorOwner(Protocol):
    """What `LightningAccelerator` reads from its `hf_lightning.Trainer`."""

    module: Any
    """The `TransformerModule` being trained."""
    lightning_trainer: Any
    """The running `lightning.Trainer`, or None before the first run."""
    args: Any
    """The training arguments."""


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

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's tensor, concatenated on dim 0 (a 0-dim tensor becomes one row per process)."""
        if self.num_processes == 1:
            return tensor
        gathered = self._trainer.strategy.all_gather(tensor)
        return gathered.reshape(-1, *tensor.shape[1:]) if tensor.dim() else gathered.reshape(-1)

    def gather_for_metrics(self, input_data: torch.Tensor, use_gather_object: bool = False) -> torch.Tensor:
        """`gather` (hf_lightning's evaluation shards hold no duplicates to drop)."""
        return self.gather(input_data)

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum", scale: float = 1.0) -> torch.Tensor:
        """The sum (or mean) over processes."""
        if self.num_processes == 1:
            return tensor * scale
        return self._trainer.strategy.reduce(tensor, reduce_op=reduction) * scale

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
