"""The memory plan of a run as it is configured: `Trainer.memory_plan()`, `hf-lightning plan` and the line at the
start of `train()`.

Reads what the run will do from its pieces (the module's model and optimizer choice, the data module's collated
rows, the arguments, the `lightning.Trainer` keyword arguments: precision, strategy, devices) and hands them to
`run_options/memory_plan.py`, which traces one update on fake tensors.
"""

from __future__ import annotations

import inspect
import os
import sys
from dataclasses import replace
from typing import Any, TextIO

import torch
from torch import nn

from hf_lightning.args import TrainingArguments
from hf_lightning.args.to_lightning import _strategy_family
from hf_lightning.data.datamodule import TransformerDataModule
from hf_lightning.data.length_grouping import train_sample_lengths
from hf_lightning.module.module import TransformerModule
from hf_lightning.module.optim import parameter_groups
from hf_lightning.run_options.memory_plan import MemoryPlan, budget_bytes, memory_plan_line, plan_memory

__all__ = ["MemoryPlanWarning", "build_memory_plan", "print_memory_plan_line"]


class MemoryPlanWarning(UserWarning):
    """The memory plan does not fit the memory available (the message names the numbers)."""


_PRECISIONS = {"32": "32-true", "32-true": "32-true", "bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed",
               "16": "16-mixed", "16-mixed": "16-mixed", "bf16-true": "bf16-true", "16-true": "16-true",
               "64": "64-true", "64-true": "64-true"}


def _precision(trainer_kwargs: dict[str, Any]) -> str:
    value = trainer_kwargs.get("precision")
    plugins = trainer_kwargs.get("plugins") or []
    plugins = plugins if isinstance(plugins, (list, tuple)) else [plugins]
    fp16_plugin = [p for p in plugins if type(p).__name__ == "MixedPrecision"]
    if value is None and fp16_plugin:  # FSDP2's "16-mixed" travels as a plugin (args/to_lightning.py)
        value = "16-mixed" if getattr(fp16_plugin[0], "precision", "16-mixed") == "16-mixed" else "bf16-mixed"
    name = _PRECISIONS.get(str(value if value is not None else "32-true"))
    if name is None:
        raise ValueError(f"memory plan: precision={value!r} is not one the plan traces; it plans "
                         f"{', '.join(sorted(set(_PRECISIONS.values())))}.")
    return name


def _device(trainer_kwargs: dict[str, Any]) -> torch.device:
    accelerator = trainer_kwargs.get("accelerator", "auto")
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    if name in ("gpu", "cuda") or "cuda" in name or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _world_size(trainer_kwargs: dict[str, Any], device: torch.device) -> int:
    if "WORLD_SIZE" in os.environ:  # torchrun: one run over the launcher's processes
        return int(os.environ["WORLD_SIZE"])
    devices = trainer_kwargs.get("devices", "auto")
    nodes = int(trainer_kwargs.get("num_nodes", 1))
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    elif isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        count = int(devices)
    elif isinstance(devices, int):
        count = devices
    else:
        count = -1
    if count == -1:  # "auto" / -1: every GPU, or one CPU process
        count = torch.cuda.device_count() if device.type == "cuda" else 1
    return max(count, 1) * nodes


def _sharding(trainer_kwargs: dict[str, Any], world_size: int) -> str:
    family = _strategy_family(trainer_kwargs.get("strategy"))
    if family in ("fsdp1", "deepspeed"):
        raise ValueError(f"memory plan: the strategy ({family}) is not one the plan models; it plans one device, "
                         "DDP and FSDP2 (fsdp_version 2).")
    if family == "fsdp2":
        return "fsdp2"
    return "ddp" if world_size > 1 else "none"


def _optimizer_factory(module: TransformerModule, args: TrainingArguments) -> Any:
    """Builds, over a (fake) model, the optimizer the run's `create_optimizer` builds: a given optimizer's class and
    defaults, `optimizer_cls_and_kwargs`, or `args.optim` with HF's two parameter groups."""

    def make(model: nn.Module) -> torch.optim.Optimizer:
        given = module.optimizer
        if given is not None:  # `optimizers=(optimizer, scheduler)` (or an earlier run's): its class and settings
            accepted = inspect.signature(type(given).__init__).parameters
            settings = {k: v for k, v in given.defaults.items() if k in accepted}  # AdamW's defaults hold more
            return type(given)([p for p in model.parameters() if p.requires_grad], **settings)
        hooks = module.hooks
        if module.optimizer_cls_and_kwargs is not None:
            cls, kwargs = module.optimizer_cls_and_kwargs
        else:
            cls, kwargs = hooks.get_optimizer_cls_and_kwargs(args, model)
        kwargs = {k: v for k, v in dict(kwargs).items() if k not in ("params", "model", "optimizer_dict")}
        return cls(parameter_groups(model, args.weight_decay, hooks.get_decay_parameter_names(model)), **kwargs)

    return make


def _longest_row(datamodule: TransformerDataModule, example: dict[str, Any]) -> int:
    """The longest training row (`input_ids`, or `length_column_name`), else the example's padded length."""
    try:
        lengths = train_sample_lengths(datamodule.train_dataset, datamodule.args.length_column_name,
                                       datamodule.processing_class)
    except (ValueError, TypeError, KeyError):  # a stream, or rows without a length to read
        lengths = []
    padded = [v.shape[1] for v in example.values() if isinstance(v, torch.Tensor) and v.dim() >= 2]
    return max([*lengths, *padded], default=1)


def build_memory_plan(module: TransformerModule, datamodule: TransformerDataModule, args: TrainingArguments,
                      trainer_kwargs: dict[str, Any], *, micro_batch: int | None = None, seq_len: int | None = None,
                      budget: int | None = None, world_size: int | None = None,
                      find_largest: bool = True) -> MemoryPlan:
    """The memory plan of the run these pieces make (see `Trainer.memory_plan` for the arguments).

    Raises:
        ValueError: no training rows, a precision or strategy the plan does not model, a size below 1.
    """
    micro_batch = args.per_device_train_batch_size if micro_batch is None else micro_batch
    if datamodule.signature_model is None:  # the CLI's data module: its columns are the model's arguments
        datamodule.signature_model = module.model
    example = datamodule.example_micro_batch(min(micro_batch, 2))
    device = _device(trainer_kwargs)
    world = world_size if world_size is not None else _world_size(trainer_kwargs, device)
    plan = plan_memory(
        module.model, example, micro_batch, seq_len if seq_len is not None else _longest_row(datamodule, example),
        _optimizer_factory(module, args), precision=_precision(trainer_kwargs),
        sharding=_sharding(trainer_kwargs, world), world_size=world,
        accumulation=args.gradient_accumulation_steps, device=device, max_grad_norm=args.max_grad_norm or 0.0,
        budget=budget if budget is not None else budget_bytes(device, module.model), find_largest=find_largest)
    overridden = module.overrides() if hasattr(module, "overrides") else set()
    if overridden & {"create_optimizer", "create_optimizer_and_scheduler"}:
        note = "create_optimizer is overridden: the plan traced the optimizer args.optim names"
        plan = replace(plan, notes=(*plan.notes, note))
    return plan


def print_memory_plan_line(module: TransformerModule, datamodule: TransformerDataModule, args: TrainingArguments,
                           trainer_kwargs: dict[str, Any], stream: TextIO | None = None) -> MemoryPlan | None:
    """Print the plan's line at the start of `train()` (with the warning line when it does not fit), on the
    global-zero process only (stderr by default); returns the plan (None on the other processes, or when the model
    cannot be traced).

    A model the trace cannot run (an operation without a fake-tensor implementation, a forward that raises) does
    not stop the run: the line says the plan is not available and why, and training goes on.
    """
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    out = stream if stream is not None else sys.stderr
    try:
        plan = build_memory_plan(module, datamodule, args, trainer_kwargs, find_largest=True)
    except Exception as error:  # noqa: BLE001 - reported on the line; the plan is advice, the run goes on
        print(f"memory plan: not available, the update could not be traced ({type(error).__name__}: "
              f"{' '.join(str(error).split())[:300]}); training goes on without it", file=out, flush=True)
        return None
    print(memory_plan_line(plan), file=out, flush=True)
    return plan
