"""What one optimizer update does differently under each strategy (called by `TransformerModule`).

- `configure_model_for_strategy`: under a `ModelParallelStrategy` (ours from `fsdp=...`, or a plain one the user
  chose), shard the model with FSDP2 per layer (`parallel/fsdp2.py`), with HF's mixed-precision policy for the run's
  precision (`parallel/precision.py`): no `configure_model` of one's own is needed.
- `micro_batch_context`: the gradient sync of a micro-batch. DDP / FSDP on several processes skip it on every
  micro-batch but the last (`block_backward_sync`); DeepSpeed is told the accumulation boundary instead, as
  accelerate does for HF (`engine.set_gradient_accumulation_boundary`), because its engine reduces and steps by
  that flag. DDP with `static_graph` (`ddp_static_graph`) syncs every micro-batch: Lightning 2.6 flushes the static
  graph's first reduction after the first backward of a manual-optimisation step (`DDPStrategy.post_backward`),
  which fails when that backward ran without sync (a reducer assertion); the gradients are the same, with more
  communication.
  `accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}` syncs every micro-batch under
  every strategy but DeepSpeed, as HF's loop does then (less gradient memory, more communication).
- `clip_by_strategy`: FSDP1 clips with the root's `clip_grad_norm_` (the norm over every shard); DeepSpeed clips
  inside `engine.step()` with the config's `gradient_clipping` (HF's `max_grad_norm`), so the norm is read after
  the step (`deepspeed_step_report`), as HF reads `get_global_grad_norm()`.
- `steps_like_a_scheduler`: DeepSpeed's own schedulers (a `scheduler` section) are stepped like torch's.
- `generation_context`: FSDP1 runs `generate` inside `summon_full_params` of the root, as HF's
  `Seq2SeqTrainer.prediction_step` does (`generate` calls submodules outside the root's forward, where the root's
  flat parameters are still sharded). FSDP2 registers `generate` as a forward method instead (`fsdp2.py`).
- `step_model`: the model a micro-batch's HF `training_step` gets. Under FSDP1 (`HFFSDPStrategy`) its calls are
  forwards of the FSDP root, which wraps the LightningModule (whose `forward` calls the model): FSDP1 unshards the
  root's parameters, and hooks the backward that finalises the gradient shards, only around a root forward. A plain
  `FSDPStrategy` calls the whole update from inside one root forward, which FSDP1 cannot run: refused
  (`check_update_strategy`).
- `auto_micro_batch` (`module/micro_batching.py`): an update that may be retried after an out-of-memory error runs
  no collective inside any forward or backward, so a process that fails anywhere in them reaches the same next
  collective as the others: the agreement (`any_process_failed`, one all-reduce per update try, after its last
  micro-batch). Under DDP, `hold_gradient_sync` keeps every backward of the update local (DDP's own reduction in the
  last backward, and the reducer preparation at the end of DDP's forward, are both off) and `reduce_gradients`
  averages the gradients after the agreement, as DDP would (bucketed all-reduces of the gradients divided by the
  world size). Under FSDP2, whose forwards and backwards all-gather and reduce-scatter, `failure_agreement` puts a
  flag all-reduce before each of FSDP's collectives instead (`parallel/oom_agreement.py`: a failing process joins
  the next one from the end of its try), and `reset_sharded_state` resets FSDP's iteration state after a failed try.
  FSDP1 and DeepSpeed, whose collectives have no such seam, are refused (`check_micro_batch_strategy`).
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    ParallelStrategy,
    Strategy,
)
from torch import distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from transformers.optimization import GreedyLR

from hf_lightning.args.parallel import FSDPSettings
from hf_lightning.checkpoint.distributed import is_sharded
from hf_lightning.parallel.fsdp2 import shard_model
from hf_lightning.parallel.precision import policy_dtype
from hf_lightning.parallel.strategies import HFFSDP2Strategy, HFFSDPStrategy

if TYPE_CHECKING:
    from hf_lightning.parallel.oom_agreement import FailureAgreement

__all__ = ["configure_model_for_strategy", "micro_batch_context", "clip_by_strategy", "deepspeed_step_report",
           "generation_context", "steps_like_a_scheduler",
           "steps_on_metrics", "step_model", "check_update_strategy", "FSDPRootCall", "check_micro_batch_strategy",
           "hold_gradient_sync", "any_process_failed", "reduce_gradients", "failure_agreement",
           "reset_sharded_state"]


def configure_model_for_strategy(module: pl.LightningModule, model: nn.Module) -> None:
    """FSDP2 per-layer sharding of `model` under a `ModelParallelStrategy` (once: a sharded model is left alone).

    Raises:
        ValueError: a `ModelParallelStrategy` with a tensor-parallel axis (that needs a `configure_model` of its own).
    """
    strategy = module.trainer.strategy
    if not isinstance(strategy, ModelParallelStrategy) or is_sharded(model):
        return
    mesh = strategy.device_mesh
    if mesh["tensor_parallel"].size() > 1:
        raise ValueError(
            f"ModelParallelStrategy with tensor_parallel_size={mesh['tensor_parallel'].size()}: the default sharding "
            "is FSDP2 only. Pass `ModelParallelStrategy(data_parallel_size=<processes>, tensor_parallel_size=1)`, "
            "or subclass TransformerModule and apply tensor parallelism in `configure_model`."
        )
    # ours carries HF's fsdp_config; a plain ModelParallelStrategy gets the defaults
    settings = strategy.fsdp_settings if isinstance(strategy, HFFSDP2Strategy) else FSDPSettings()
    # the precision plugin decides the policy: "bf16-mixed" / the "16-mixed" plugin gather in bf16 / fp16, as HF
    shard_model(model, mesh["data_parallel"], settings, policy_dtype(module.trainer.precision_plugin))


def micro_batch_context(strategy: Strategy, last: bool, sync_each_batch: bool = False) -> AbstractContextManager[Any]:
    """The context of one micro-batch's backward pass; `last`: the window's last micro-batch (gradients sync).

    One process has nothing to synchronise: no context, as accelerate's `no_sync` only applies with several processes
    (`use_distributed`). FSDP1 runs a one-process group as `NO_SHARD`, whose `no_sync` keeps a mixed-precision run's
    bf16 / fp16 gradients on float32 parameters, which torch refuses at the next forward (`grad_dtype`).

    `sync_each_batch` (HF's `gradient_accumulation_kwargs["sync_each_batch"]`): every micro-batch syncs, as HF's
    loop enters no `no_sync` then (T:1904-1909); DeepSpeed is told the boundary all the same (HF's too).
    """
    if isinstance(strategy, DeepSpeedStrategy):
        strategy.deepspeed_engine.set_gradient_accumulation_boundary(last)
        return nullcontext()
    if sync_each_batch:
        return nullcontext()
    if isinstance(strategy, ParallelStrategy) and not last and strategy.world_size > 1 \
            and not getattr(strategy.model, "static_graph", False):
        return strategy.block_backward_sync()
    return nullcontext()


def clip_by_strategy(strategy: Strategy, max_grad_norm: float | None) -> tuple[bool, torch.Tensor | None]:
    """`(handled, grad_norm)`: whether the strategy clips itself, and the pre-clip norm when it is known now."""
    if isinstance(strategy, DeepSpeedStrategy):
        return True, None  # inside engine.step(); see deepspeed_step_report
    if isinstance(strategy, FSDPStrategy):
        # FSDP1's flat shards: only the root knows the total norm (an infinite limit measures without clipping)
        limit = max_grad_norm if max_grad_norm is not None and max_grad_norm > 0 else math.inf
        root: Any = strategy.model  # the FullyShardedDataParallel root (Lightning types it as a plain Module)
        return True, root.clip_grad_norm_(limit)
    return False, None


def deepspeed_step_report(strategy: Strategy) -> tuple[torch.Tensor | float | None, bool] | None:
    """After `optimizer.step()` under DeepSpeed: `(grad_norm, step_skipped)` (fp16 overflow); None elsewhere."""
    if not isinstance(strategy, DeepSpeedStrategy):
        return None
    engine = strategy.deepspeed_engine
    return engine.get_global_grad_norm(), not engine.was_step_applied()


def steps_on_metrics(scheduler: Any) -> bool:
    """HF's rule (T:1951, T:3324): a `ReduceLROnPlateau` or a `GreedyLR` (subclasses included) is stepped with the
    best-model metric after each training-time evaluation, not after each update; any other scheduler, a user's
    included, is stepped after each update without arguments."""
    return isinstance(scheduler, (ReduceLROnPlateau, GreedyLR))


def steps_like_a_scheduler(scheduler: Any) -> bool:
    """Whether the module steps `scheduler` after each update: torch's (not those stepped on metrics,
    `steps_on_metrics`) and DeepSpeed's own (`step()` and `get_last_lr()` without the torch base class)."""
    if scheduler is None or steps_on_metrics(scheduler):
        return False
    return isinstance(scheduler, LRScheduler) or (callable(getattr(scheduler, "step", None))
                                                   and callable(getattr(scheduler, "get_last_lr", None)))


def generation_context(strategy: Strategy | None) -> AbstractContextManager[Any]:
    """The context of one `generate` call: FSDP1's full parameters for its length (HF's; a collective on every
    rank, paired by the lock-step padding of `module/eval_run.py`), nothing elsewhere."""
    if isinstance(strategy, FSDPStrategy) and strategy.model is not None:
        return FullyShardedDataParallel.summon_full_params(strategy.model, writeback=False)
    return nullcontext()


class FSDPRootCall:
    """The model as HF's `training_step` sees it under FSDP1: each call is a forward of the FSDP root.

    HF's steps get accelerate's FSDP wrapper of the model (`model_wrapped`); here the root wraps the LightningModule,
    whose `forward(**inputs)` calls the model. Every attribute is the model's (`config`, `_get_name()`, `training`...),
    `module` is the model (as on torch's wrappers). Not an `nn.Module` itself: it owns nothing, and a module's own
    methods (`_get_name`, which HF's label smoother checks) would answer for it instead of the model's.

    Args:
        root: the FullyShardedDataParallel root (`strategy.model`).
        model: the model the LightningModule's `forward` calls (`model_wrapped`).
    """

    def __init__(self, root: nn.Module, model: nn.Module) -> None:
        self._root = root
        self.module = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._root(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


def step_model(strategy: Strategy, model: nn.Module) -> nn.Module:
    """The model a micro-batch's HF `training_step` calls: `model` itself, or under FSDP1 its `FSDPRootCall` (typed
    as the module it stands for: HF's hooks call it and read its attributes, which are the model's)."""
    if isinstance(strategy, HFFSDPStrategy) and strategy.model is not None:
        return cast(nn.Module, FSDPRootCall(strategy.model, model))
    return model


def check_update_strategy(strategy: Strategy) -> None:
    """Refuse a strategy that runs `TransformerModule.training_step` (a whole update) where it cannot work.

    Raises:
        ValueError: Lightning's own `FSDPStrategy` (it calls the step from inside the FSDP root's forward, see
            `HFFSDPStrategy`), naming what to use instead.
    """
    if isinstance(strategy, FSDPStrategy) and not isinstance(strategy, HFFSDPStrategy):
        raise ValueError(
            "Lightning's FSDPStrategy runs training_step inside the FSDP root's forward, where FSDP1 cannot run a "
            "whole update (backward and optimizer step included). Use HF's `fsdp=\"full_shard auto_wrap\"` with "
            "`fsdp_config={\"version\": 1}`, or `hf_lightning.parallel.strategies.HFFSDPStrategy` (the same "
            "arguments as FSDPStrategy) in place of FSDPStrategy.")


def check_micro_batch_strategy(strategy: Strategy) -> None:
    """Refuse `auto_micro_batch` under a strategy whose forwards or backwards run collectives that no agreement
    precedes (module docstring).

    Raises:
        ValueError: FSDP1, DeepSpeed, DDP with a static graph, a `ModelParallelStrategy` with a tensor-parallel axis,
            or another strategy of several processes that is not DDP or FSDP2, naming it.
    """
    if not isinstance(strategy, ParallelStrategy):
        return  # one device
    static = bool(getattr(getattr(strategy, "model", None), "static_graph", False))  # wrapped before on_fit_start
    if isinstance(strategy, DDPStrategy) and not isinstance(strategy, DeepSpeedStrategy) and not static:
        return
    if isinstance(strategy, ModelParallelStrategy) and strategy.device_mesh["tensor_parallel"].size() == 1:
        return  # FSDP2: each of its collectives is preceded by an agreement (`parallel/oom_agreement.py`)
    if isinstance(strategy, (DDPStrategy, FSDPStrategy, ModelParallelStrategy)) or strategy.world_size > 1:
        raise ValueError(
            f"auto_micro_batch=True under {type(strategy).__name__}: not supported. A retried update must run no "
            "collective inside a forward or backward that the processes have not agreed on first (a process out of "
            "memory there would leave the others waiting), which holds on one process, under DDP (without "
            "`static_graph`) and under FSDP2 (ModelParallelStrategy without tensor parallelism) only. Drop "
            "auto_micro_batch, or use DDP or FSDP2.")


def failure_agreement(strategy: Strategy, model: nn.Module) -> FailureAgreement | None:
    """Under FSDP2 on several processes: the flag agreement installed on every FSDP group of `model` (before each
    of FSDP's collectives, `parallel/oom_agreement.py`); None elsewhere (DDP's reduction is held instead)."""
    if not isinstance(strategy, ModelParallelStrategy) or strategy.world_size <= 1 or not is_sharded(model):
        return None
    from hf_lightning.parallel.oom_agreement import install_agreement  # FSDP2's communication objects

    return install_agreement(model, strategy.device_mesh["data_parallel"].get_group(), strategy.root_device)


def reset_sharded_state(model: nn.Module, drop_grads: bool) -> None:
    """After a try that failed on some process: FSDP2's per-iteration state reset on the root (no collective:
    unsharded parameters freed, hooks' trackers cleared), so the retry starts as a new iteration; `drop_grads`: the
    try's gradients dropped too. Nothing elsewhere.

    FSDP's reset keeps the gradients of the parameters still unsharded (the root's, whose post-backward runs at the
    end of the backward): they are dropped while those parameters are the module's, before the reset, or the retry
    would add its gradients to them."""
    reset = getattr(model, "reset_iter_state", None)
    if not is_sharded(model) or not callable(reset):
        if drop_grads:
            model.zero_grad(set_to_none=True)
        return
    if drop_grads:
        model.zero_grad(set_to_none=True)  # the unsharded parameters registered now, and the sharded ones
    reset()
    if drop_grads:
        model.zero_grad(set_to_none=True)  # the sharded parameters registered again by the reset


def hold_gradient_sync(strategy: Strategy, hold: bool) -> None:
    """Under DDP, keep every backward of the update local (`hold=True`, at its start) or give DDP its own sync back
    (`hold=False`, once the update's forward has returned; the next forward broadcasts the buffers, as after a
    synchronised update). Nothing elsewhere."""
    model = getattr(strategy, "model", None)
    if not isinstance(model, DistributedDataParallel):
        return
    # `no_sync()` sets this flag too; held for the whole of DDP's forward (Lightning runs the update inside it), so
    # that neither Lightning's `pre_backward` nor the end of DDP's forward prepares the reducer for a backward:
    # nothing inside the update can start DDP's reduction
    model.require_backward_grad_sync = not hold
    if not hold:
        model.require_forward_param_sync = True


def _group(strategy: Strategy) -> Any:
    model = getattr(strategy, "model", None)
    return model.process_group if isinstance(model, DistributedDataParallel) else None


def any_process_failed(strategy: Strategy, failed: bool, agreement: FailureAgreement | None = None) -> bool:
    """Whether any process's try of the update failed: one all-reduce (max) of a flag on several processes (under
    FSDP2 `agreement`'s, which knows when a hook has agreed already)."""
    if agreement is not None:
        return agreement.any_failed(failed)
    if not isinstance(strategy, ParallelStrategy) or strategy.world_size <= 1 or not dist.is_initialized():
        return failed
    flag = torch.tensor([1 if failed else 0], dtype=torch.int32, device=strategy.root_device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_group(strategy))
    return bool(flag.item())


_BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket size


def reduce_gradients(strategy: Strategy, params: list[nn.Parameter]) -> None:
    """Under DDP held by `hold_gradient_sync`: the gradients averaged over the processes, as DDP's reducer does (each
    divided by the world size, then summed), in buckets of DDP's default size. A parameter without a gradient on
    this process joins with zeros, and keeps no gradient when no process has one."""
    model = getattr(strategy, "model", None)
    if not isinstance(model, DistributedDataParallel) or not isinstance(strategy, ParallelStrategy) or \
            strategy.world_size <= 1:
        return
    group = model.process_group
    world = dist.get_world_size(group)
    missing = [p.grad is None for p in params]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    buckets: dict[tuple[torch.dtype, torch.device], list[list[torch.Tensor]]] = {}
    filled: dict[tuple[torch.dtype, torch.device], int] = {}
    for grad in grads:
        key = (grad.dtype, grad.device)
        chunks = buckets.setdefault(key, [[]])
        if chunks[-1] and filled[key] >= _BUCKET_BYTES:
            chunks.append([])
            filled[key] = 0
        chunks[-1].append(grad)
        filled[key] = filled.get(key, 0) + grad.numel() * grad.element_size()
    for chunks in buckets.values():
        for chunk in chunks:
            flat = torch.cat([g.reshape(-1) for g in chunk]).div_(world)
            dist.all_reduce(flat, group=group)
            offset = 0
            for grad in chunk:
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()
    for param, grad, was_missing in zip(params, grads, missing):
        if was_missing and bool(grad.any()):
            param.grad = grad
