"""Which strategies need every process to run the same number of evaluation forwards ("lock-step").

Under a sharded strategy every forward is a collective: FSDP2 (`ModelParallelStrategy`) and FSDP1 (`FSDPStrategy`)
all-gather each layer's weights in its forward, DeepSpeed ZeRO-3 gathers each module's partitions. Evaluation shards
differ by up to one batch (`ContiguousShardSampler`), so the rank with fewer batches must run padding steps whose
outputs are dropped (`eval_run.EvalAccumulator.pad_to_busiest_rank`), or the others' last forwards have no partner
(gloo: "collective mismatch"; NCCL: a hang). DDP's evaluation forward is local (its buffer broadcast runs only on
the first forward after a training step, which every rank makes), ZeRO-1/2 keep whole weights on every rank:
neither needs it. `forwards_are_collective` is the rule, on plain facts; `needs_lockstep_forwards` reads them from
a Lightning strategy and model.
"""

from __future__ import annotations

from typing import Literal

from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy, Strategy
from torch import nn

from hf_lightning.checkpoint.distributed import is_sharded

__all__ = ["StrategyKind", "forwards_are_collective", "needs_lockstep_forwards", "strategy_kind"]

StrategyKind = Literal["fsdp2", "fsdp1", "deepspeed", "other"]
"""The strategy families the rule tells apart (`other`: DDP, single device, or any strategy we do not know)."""


def forwards_are_collective(kind: StrategyKind, world_size: int, zero_stage: int | None = None,
                            params_sharded: bool = False) -> bool:
    """Whether each evaluation forward is a collective, so every rank must run as many.

    Args:
        kind: the strategy family.
        world_size: the number of processes (one process has nobody to wait for).
        zero_stage: DeepSpeed's ZeRO stage (only stage 3 partitions the weights).
        params_sharded: the model's parameters are FSDP2 `DTensor` shards (e.g. sharded by a user's
            `configure_model` under another strategy).
    """
    if world_size < 2:
        return False
    if kind in ("fsdp2", "fsdp1") or params_sharded:
        return True
    return kind == "deepspeed" and zero_stage == 3


def strategy_kind(strategy: Strategy) -> StrategyKind:
    """The family of a Lightning strategy (HF's `fsdp=` gives `HFFSDP2Strategy`, a `ModelParallelStrategy`)."""
    if isinstance(strategy, ModelParallelStrategy):
        return "fsdp2"
    if isinstance(strategy, FSDPStrategy):
        return "fsdp1"
    if isinstance(strategy, DeepSpeedStrategy):
        return "deepspeed"
    return "other"


def needs_lockstep_forwards(strategy: Strategy, world_size: int, model: nn.Module) -> bool:
    """`forwards_are_collective` for a Lightning strategy and the model it runs."""
    zero_stage = None
    if isinstance(strategy, DeepSpeedStrategy):
        zero_stage = (strategy.config or {}).get("zero_optimization", {}).get("stage")
    return forwards_are_collective(strategy_kind(strategy), world_size, zero_stage, is_sharded(model))
