"""The process-layout properties HF scripts call on their arguments (`process_index`, `should_log`,
`main_process_first`...), answered from what is known at the time of the call.

HF's `TrainingArguments` learns the layout by initialising `torch.distributed` when it is built. Under Lightning the
layout comes from one of three places, in this order:

1. `torch.distributed` once it is initialised: inside and after `train()` / `evaluate()` / `predict()` of a
   multi-process run (Lightning initialises it when its strategy starts), or after `main_process_first` did.
2. The launcher's environment, from the first line of the script: `torchrun` (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`),
   SLURM's `srun` (`SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NTASKS`), or Lightning's own launcher in the processes it
   started (`LOCAL_RANK`, `NODE_RANK`, `WORLD_SIZE`).
3. Otherwise one process: rank 0 of 1. This includes rank 0 of a run whose other processes Lightning starts itself
   (`lightning_kwargs={"strategy": "ddp", "devices": 2}`, launched with plain `python`): they do not exist until
   `train()` starts them, so before that rank 0 is alone.

`main_process_first` is a real barrier whenever the other processes already exist (case 1 or 2 with `torchrun` /
SLURM): the main process runs the block first, the others wait, then run it. Under `torchrun` / SLURM it initialises
`torch.distributed` for that, as HF's arguments do (gloo on CPU, NCCL on CUDA); Lightning's strategy then uses that
group. In a process started by Lightning's launcher, before its own strategy has started, there is no partner to wait
for: rank 0 ran the block before it started the other processes, so the block already ran on the main process first,
and the call runs it at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hf_lightning.args.deepspeed_config import zero_stage

__all__ = ["DeepSpeedPlugin", "DistributedState", "ProcessLayout", "layout_from_env", "current_layout",
           "ProcessLayoutMixin", "check_process_group", "launcher_trainer_kwargs"]

_TIMEOUT_S = 1800  # HF's `ddp_timeout` default, also Lightning's default process-group timeout


@dataclass(frozen=True)
class ProcessLayout:
    """Where this process sits: global `rank`, `local_rank` on its node, `world_size`, and who says so.

    `source` is `torch.distributed`, `torchrun`, `slurm`, `lightning` (started by Lightning's launcher) or `single`.
    """

    rank: int
    local_rank: int
    world_size: int
    source: str


def layout_from_env(env: Mapping[str, str]) -> ProcessLayout:
    """The layout the launcher's environment variables describe (pure: `env` is `os.environ` or a test's dict)."""
    if env.get("TORCHELASTIC_RUN_ID") is not None and "WORLD_SIZE" in env:
        return ProcessLayout(int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"]), "torchrun")
    # Lightning's SLURMEnvironment.detect: srun was used, and not for an interactive shell
    if int(env.get("SLURM_NTASKS", "1")) > 1 and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return ProcessLayout(int(env["SLURM_PROCID"]), int(env["SLURM_LOCALID"]), int(env["SLURM_NTASKS"]), "slurm")
    if "LOCAL_RANK" in env and int(env.get("WORLD_SIZE", "1")) > 1:
        # Lightning's launcher sets LOCAL_RANK / NODE_RANK / WORLD_SIZE; RANK only when the user launched by hand
        local_rank = int(env["LOCAL_RANK"])
        rank = int(env["RANK"]) if "RANK" in env else local_rank
        source = "torchrun" if "RANK" in env else "lightning"  # RANK: every process was started together
        return ProcessLayout(rank, local_rank, int(env["WORLD_SIZE"]), source)
    return ProcessLayout(0, 0, 1, "single")


def _distributed() -> Any:
    """`torch.distributed` when it is initialised, else None (never imports torch for a single process)."""
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def current_layout() -> ProcessLayout:
    """The layout now: `torch.distributed` when initialised, else the launcher's environment (module docstring)."""
    dist = _distributed()
    env_layout = layout_from_env(os.environ)
    if dist is None:
        return env_layout
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = env_layout.local_rank if env_layout.world_size == world_size else rank
    return ProcessLayout(rank, local_rank, world_size, "torch.distributed")


_initialised_backend: str | None = None  # set when main_process_first initialised torch.distributed itself


def _init_process_group(layout: ProcessLayout, use_cpu: bool) -> None:
    """Initialise `torch.distributed` for a launcher that started every process (HF's arguments do it when built)."""
    global _initialised_backend
    import datetime

    import torch
    import torch.distributed as dist

    if layout.source == "slurm":  # the rendezvous Lightning's SLURMEnvironment would use
        from lightning.fabric.plugins.environments import SLURMEnvironment

        slurm = SLURMEnvironment()
        os.environ.setdefault("MASTER_ADDR", slurm.main_address)
        os.environ.setdefault("MASTER_PORT", str(slurm.main_port))
    backend = "nccl" if torch.cuda.is_available() and not use_cpu else "gloo"  # Lightning's default choice
    if backend == "nccl":
        torch.cuda.set_device(layout.local_rank)
    dist.init_process_group(backend, rank=layout.rank, world_size=layout.world_size,
                            timeout=datetime.timedelta(seconds=_TIMEOUT_S))
    _initialised_backend = backend


def launcher_trainer_kwargs(env: Mapping[str, str], user: Mapping[str, Any]) -> dict[str, Any]:
    """`lightning.Trainer` options for processes a launcher started (`torchrun`, SLURM's `srun`), as HF's scripts are
    run: every process joins one DDP run, as under HF's `TrainingArguments`.

    Without them Lightning would use one device per process, and each `torchrun` process would train alone on the
    whole data and write into the same `output_dir`. Options the user set in `lightning_kwargs` are kept; nothing is
    added for a single process or for Lightning's own launcher.
    """
    layout = layout_from_env(env)
    if layout.world_size <= 1 or layout.source not in ("torchrun", "slurm"):
        return {}
    per_node = int(env.get("LOCAL_WORLD_SIZE") or env.get("SLURM_NTASKS_PER_NODE") or layout.world_size)
    defaults = {"devices": per_node, "num_nodes": max(layout.world_size // per_node, 1), "strategy": "ddp"}
    return {key: value for key, value in defaults.items() if key not in user}


def check_process_group(lightning_kwargs: Mapping[str, Any]) -> None:
    """Refuse a strategy that would need another process group than the one `main_process_first` initialised.

    Raises:
        ValueError: the strategy's `process_group_backend`, or `accelerator="cpu"`, differs from that group's backend.
    """
    if _initialised_backend is None or _distributed() is None:
        return
    wanted = getattr(lightning_kwargs.get("strategy"), "_process_group_backend", None)
    if wanted is None and lightning_kwargs.get("accelerator") == "cpu":
        wanted = "gloo"
    if wanted is not None and wanted != _initialised_backend:
        raise ValueError(
            f"`main_process_first` initialised torch.distributed with the {_initialised_backend!r} backend (as HF's "
            f"TrainingArguments does under torchrun / SLURM), but the Lightning strategy wants {wanted!r}. Set "
            "`use_cpu=True` for a CPU (gloo) run, or leave the strategy's `process_group_backend` unset."
        )


@dataclass(frozen=True)
class DistributedState:
    """What library code reads of HF's `args.distributed_state` (accelerate's `PartialState`, which HF builds by
    initialising `torch.distributed`): the same values, from the process layout, without initialising anything."""

    distributed_type: str
    """accelerate's `DistributedType` value: `DEEPSPEED` with `deepspeed`; with several processes `MULTI_GPU` (CUDA)
    or `MULTI_CPU`; `NO` for one process (TRL compares it with these strings)."""
    num_processes: int
    process_index: int
    local_process_index: int


@dataclass(frozen=True)
class DeepSpeedPlugin:
    """What library code reads of HF's `args.deepspeed_plugin` (accelerate's `DeepSpeedPlugin`, set when `deepspeed`
    is): the ZeRO stage and the config."""

    zero_stage: int
    """`zero_optimization.stage` of the config (-1 without one, as HF)."""
    hf_ds_config: dict[str, Any]
    """The DeepSpeed config as given (`deepspeed` itself, or the JSON file it names, read)."""


class ProcessLayoutMixin:
    """HF's process-layout properties for a `TrainingArguments` (see the module docstring for when each is known)."""

    use_cpu: bool
    deepspeed: Any
    fsdp: Any
    ddp_timeout: int
    fp16: bool
    bf16: bool
    log_on_each_node: bool
    save_on_each_node: bool
    log_level: str
    log_level_replica: str
    per_device_train_batch_size: int
    per_device_eval_batch_size: int

    @property
    def process_index(self) -> int:
        """Global rank of this process (0 for a single process, and on rank 0 before Lightning starts the others)."""
        return current_layout().rank

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node."""
        return current_layout().local_rank

    @property
    def world_size(self) -> int:
        """Number of processes (1 until Lightning's own launcher has started the others, see module docstring)."""
        return current_layout().world_size

    @property
    def n_gpu(self) -> int:
        """GPUs this process uses: 1 with CUDA, 0 on CPU / `use_cpu` (Lightning never uses `DataParallel`)."""
        import torch

        return 0 if self.use_cpu or not torch.cuda.is_available() else 1

    @property
    def device(self) -> Any:
        """The device HF would pick for this process: `cuda:<local rank>`, else `mps`, else `cpu` (`use_cpu`: cpu).

        Lightning's `accelerator` / `devices` in `lightning_kwargs` decide where the model actually runs.
        """
        import torch

        if not self.use_cpu and torch.cuda.is_available():
            return torch.device("cuda", self.local_process_index)
        if not self.use_cpu and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")

    @property
    def distributed_state(self) -> DistributedState:
        """HF's `distributed_state` (see `DistributedState`): read by library trainers at construction (TRL)."""
        import torch

        layout = current_layout()
        if self.deepspeed:
            kind = "DEEPSPEED"
        elif layout.world_size > 1:
            kind = "MULTI_GPU" if not self.use_cpu and torch.cuda.is_available() else "MULTI_CPU"
        else:
            kind = "NO"
        return DistributedState(kind, layout.world_size, layout.rank, layout.local_rank)

    @property
    def deepspeed_plugin(self) -> DeepSpeedPlugin | None:
        """HF's `deepspeed_plugin`: None without `deepspeed`, else its ZeRO stage and config (`DeepSpeedPlugin`)."""
        if not self.deepspeed:
            return None
        config = self.deepspeed
        if isinstance(config, str):
            with open(config) as f:
                config = json.load(f)
        return DeepSpeedPlugin(zero_stage(dict(config)), dict(config))

    @property
    def mixed_precision(self) -> str:
        """HF's `mixed_precision` (TA:1601-1606): `fp16` / `bf16` from the flags, else `ACCELERATE_MIXED_PRECISION`
        (default `no`); read by `transformers.Trainer` built on these arguments."""
        if self.fp16:
            return "fp16"
        if self.bf16:
            return "bf16"
        return os.environ.get("ACCELERATE_MIXED_PRECISION", "no")

    @property
    def fsdp_plugin_args(self) -> dict[str, Any] | None:
        """HF's accelerate FSDP plugin arguments, read by `transformers.Trainer` built on these arguments: None
        without `fsdp`.

        Raises:
            NotImplementedError: `fsdp` is set (hf_lightning turns it into a Lightning strategy, not accelerate's
                plugin): build `transformers.TrainingArguments` for HF's own Trainer with FSDP.
        """
        if not self.fsdp:
            return None
        raise NotImplementedError(
            f"`fsdp`={self.fsdp!r}: hf_lightning's TrainingArguments turn FSDP into a Lightning strategy "
            "and hold no accelerate FSDP plugin; to run transformers.Trainer with FSDP, build "
            "transformers.TrainingArguments."
        )

    @property
    def _n_gpu(self) -> int:
        """HF's private `_n_gpu` (`n_gpu` is derived from it there); `transformers.Trainer` reads it, and sets it to
        1 for a model-parallel model, which is what `n_gpu` answers at most here (no `DataParallel`)."""
        return self.n_gpu

    @_n_gpu.setter
    def _n_gpu(self, value: int) -> None:
        if value > self.n_gpu:
            raise ValueError(f"`_n_gpu`={value}: hf_lightning never uses DataParallel (at most 1 GPU per process).")

    @property
    def _setup_devices(self) -> Any:
        """HF's private `_setup_devices` (`transformers.Trainer` touches it to set up devices): the `device`; there
        is nothing to set up before Lightning's strategy starts (accelerate's `Accelerator` makes its own state)."""
        return self.device

    @property
    def place_model_on_device(self) -> bool | None:
        """HF's hook for integrations (None: `transformers.Trainer` decides); Lightning places the model here."""
        return None

    @property
    def ddp_timeout_delta(self) -> Any:
        """`ddp_timeout` as a `datetime.timedelta` (HF's)."""
        import datetime

        return datetime.timedelta(seconds=self.ddp_timeout)

    @property
    def _no_sync_in_gradient_accumulation(self) -> bool:
        """HF's: skip gradient syncs inside an accumulation window unless DeepSpeed handles it."""
        return not self.deepspeed

    @property
    def parallel_mode(self) -> Any:
        """`transformers.training_args.ParallelMode`: `DISTRIBUTED` with several processes, else `NOT_PARALLEL`."""
        from transformers.training_args import ParallelMode

        return ParallelMode.DISTRIBUTED if self.world_size > 1 else ParallelMode.NOT_PARALLEL

    @property
    def train_batch_size(self) -> int:
        """Samples per process and micro-batch (HF multiplies by `n_gpu` for `DataParallel`, which is never used)."""
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        """Samples per process and evaluation batch."""
        return self.per_device_eval_batch_size

    @property
    def should_log(self) -> bool:
        """HF's rule: local rank 0 of each node with `log_on_each_node`, else global rank 0 only."""
        layout = current_layout()
        return (layout.local_rank if self.log_on_each_node else layout.rank) == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes files: global rank 0 (`save_on_each_node` is not supported)."""
        return current_layout().rank == 0

    def get_process_log_level(self) -> int:
        """HF's rule: `log_level` on a `should_log` process, `log_level_replica` elsewhere; `passive` keeps
        transformers' current verbosity."""
        from transformers.utils import logging as hf_logging

        levels = {**hf_logging.get_log_levels_dict(), "passive": -1}
        level = levels[self.log_level if self.should_log else self.log_level_replica]
        return hf_logging.get_verbosity() if level == -1 else level

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
        """Run the block on the main process first (local rank 0, or global rank 0 with `local=False`), then on the
        others, as HF's. `desc` is accepted for HF compatibility (HF only logs it at debug level).

        A real barrier whenever the other processes exist; in a process started by Lightning's own launcher, before
        its strategy has started, the main process already ran the block before this process existed, so the block
        runs at once (a barrier there would wait for a partner that never comes).
        """
        layout = current_layout()
        if layout.world_size <= 1 or layout.source == "lightning":
            yield
            return
        if layout.source != "torch.distributed":
            _init_process_group(layout, self.use_cpu)
        import torch.distributed as dist

        is_main = (layout.local_rank if local else layout.rank) == 0
        try:
            if not is_main:
                dist.barrier()  # wait until the main process has finished the block
            yield
        finally:
            if is_main:
                dist.barrier()  # release the others
