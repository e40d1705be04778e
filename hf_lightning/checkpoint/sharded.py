"""Checkpoint state under FSDP1 and DeepSpeed: the strategies whose state only their Lightning wrapper can gather.

FSDP2 and plain models need only the model (`checkpoint/distributed.py`); these functions add the two strategies
where the model alone is not enough, and fall back to it otherwise:

- FSDP1 (`FSDPStrategy`): Lightning wraps the whole LightningModule in the FSDP root, which owns the parameters
  outside the wrapped layers. Full weights are gathered, and loaded, through that root (names relative to the
  LightningModule: `model.` is stripped / added); the optimizer state is sharded with `torch.distributed.checkpoint`
  through the root too (`optimizer_sharded/`).
- DeepSpeed: full weights loaded into a running engine reach every rank and the optimizer's fp32 master weights
  (`load_into_engine`), else the next step would bring the old weights back.
- DeepSpeed: the engine's own checkpoint (`global_step<N>/` and `latest`, as HF's DeepSpeed checkpoints) holds the
  partitioned optimizer and the fp32 master weights for an exact resume; the HF weights file holds the full weights
  (ZeRO-3: gathered from the partitions with the engine's consolidation, HF's way to save 16-bit weights, but
  always, so every checkpoint has loadable weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, Strategy
from torch import nn

from hf_lightning.checkpoint import distributed as dist_state
from hf_lightning.checkpoint.io import write_file

__all__ = ["ENGINE_LATEST", "full_shapes", "gather_full_weights", "load_full_weights", "optimizer_shard_owner",
           "save_engine_state", "load_engine_state", "is_deepspeed", "load_into_engine"]

ENGINE_LATEST = "latest"
"""The file DeepSpeed's `save_checkpoint` writes next to `global_step<N>/` (its presence marks engine state)."""

_PREFIX = "model."  # the HF model's name inside TransformerModule


def is_deepspeed(strategy: Strategy | None) -> bool:
    """Whether the run uses DeepSpeed (its engine holds the optimizer and, under ZeRO-3, the weights)."""
    return isinstance(strategy, DeepSpeedStrategy)


def _strip(state: dict[str, Any]) -> dict[str, Any]:
    return {k[len(_PREFIX):]: v for k, v in state.items() if k.startswith(_PREFIX)}


def full_shapes(strategy: Strategy | None, model: nn.Module) -> dict[str, tuple[int, ...]] | None:
    """The full shape of each weight of the model, sharded or not (to check that saved weights belong to it).

    FSDP2 parameters are DTensors with the full shape; ZeRO-3 partitions keep it in `ds_shape`. FSDP1's original
    parameters are flat views of the local shard: their shapes are unknown here (None: nothing to check).
    """
    if isinstance(strategy, FSDPStrategy):
        return None
    if isinstance(strategy, DeepSpeedStrategy) and strategy.zero_stage_3:
        return {k: tuple(getattr(p, "ds_shape", p.shape)) for k, p in model.named_parameters()}
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _fsdp_root(strategy: FSDPStrategy) -> nn.Module:
    """The FullyShardedDataParallel root Lightning wrapped around the LightningModule (set once the run is set up)."""
    assert strategy.model is not None
    return strategy.model


def gather_full_weights(strategy: Strategy | None, model: nn.Module) -> dict[str, Any] | None:
    """The model's full weights for `save_pretrained` (a collective: call it on every rank), or None when the model's
    own `state_dict()` is complete (no sharding)."""
    if isinstance(strategy, FSDPStrategy):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        root = _fsdp_root(strategy)
        # torch's FSDP1 full state dict with `cpu_offload` crashes (SIGSEGV, torch 2.13) on CPU processes, where the
        # tensors are on the CPU already
        offload = strategy.root_device.type != "cpu"
        state = get_model_state_dict(root, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
        return dist_state.alias_tied_weights(_strip(state), model)  # tied weights saved once, as HF saves them
    if isinstance(strategy, DeepSpeedStrategy) and strategy.zero_stage_3:
        # the engine gathers parameter by parameter onto rank 0 (transformers / accelerate `get_state_dict` use it)
        state = _strip(strategy.deepspeed_engine._zero3_consolidated_16bit_state_dict())
        return dist_state.alias_tied_weights(state, model)
    return dist_state.full_model_state_dict(model)


def load_full_weights(strategy: Strategy | None, model: nn.Module, state_dict: dict[str, Any]) -> None:
    """Load full weights (every rank passes the whole dict) into a plain, FSDP1-, FSDP2- or ZeRO-sharded model."""
    if isinstance(strategy, FSDPStrategy):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        prefixed = {_PREFIX + k: v for k, v in state_dict.items()}
        set_model_state_dict(_fsdp_root(strategy), prefixed, options=StateDictOptions(full_state_dict=True,
                                                                                      strict=False))
        return
    if isinstance(strategy, DeepSpeedStrategy):
        load_into_engine(strategy.deepspeed_engine, model, state_dict, strategy.zero_stage_3)
        return
    dist_state.load_model_state(model, state_dict)


def load_into_engine(engine: Any, model: nn.Module, state_dict: dict[str, Any], zero3: bool) -> None:
    """Full weights into a model trained by a DeepSpeed engine, on every rank (a collective under ZeRO-3).

    The engine's optimizer keeps fp32 master weights (ZeRO-1/2/3, bf16, fp16) that its next step copies back into
    the model: writing the model alone would be undone by that step (or by a checkpoint of the engine). So after the
    model's weights (ZeRO-3: its partitions, written under `GatheredParameters(modifier_rank=0)`, which rank 0's
    values reach on every rank) the masters are refreshed from them on every rank (`refresh_fp32_params`,
    DeepSpeed's own "weights changed outside the optimizer" call).

    Args:
        engine: the `DeepSpeedEngine` (its `optimizer` holds the masters; a plain torch optimizer has none).
        model: the model inside the engine (`flow_model` of the LightningModule).
        state_dict: the full weights, the same on every rank.
        zero3: whether the parameters are ZeRO-3 partitions.
    """
    if zero3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            # every rank loads (its buffers are not partitioned); the parameters are rank 0's on exit
            model.load_state_dict(state_dict, strict=False)
    else:
        dist_state.load_model_state(model, state_dict)
    refresh = getattr(engine.optimizer, "refresh_fp32_params", None)
    if callable(refresh):
        refresh()


def optimizer_shard_owner(strategy: Strategy | None, model: nn.Module) -> nn.Module | None:
    """The module whose optimizer state is sharded (`torch.distributed.checkpoint`): the FSDP1 root, an FSDP2
    model; None when the optimizer state is whole (`optimizer.pt`) or the engine's (DeepSpeed)."""
    if isinstance(strategy, FSDPStrategy):
        return _fsdp_root(strategy)
    if isinstance(strategy, DeepSpeedStrategy):
        return None
    return model if dist_state.is_sharded(model) else None


def save_engine_state(strategy: Strategy | None, folder: str | Path, step: int) -> bool:
    """DeepSpeed: every rank writes its part of the engine checkpoint into `folder` (`global_step<step>/`, `latest`);
    False (nothing written) for the other strategies."""
    if not isinstance(strategy, DeepSpeedStrategy):
        return False
    engine, tag = strategy.deepspeed_engine, f"global_step{step}"
    # through the checkpoint writer: a failed write (a full disk) is named and the unfinished folder removed
    write_file(Path(folder) / tag, lambda _: engine.save_checkpoint(str(folder), tag=tag),
               what=f"DeepSpeed's engine checkpoint ({tag}/) in {folder}")
    return True


def load_engine_state(strategy: Strategy | None, folder: str | Path, module_only: bool = False) -> bool:
    """DeepSpeed: load the engine checkpoint of `folder` (weights, and unless `module_only` the optimizer with its
    fp32 master weights; the scheduler is Lightning's, restored from `scheduler.pt`). False when there is none."""
    if not isinstance(strategy, DeepSpeedStrategy) or not (Path(folder) / ENGINE_LATEST).is_file():
        return False
    path, _ = strategy.deepspeed_engine.load_checkpoint(
        str(folder), load_module_strict=False, load_optimizer_states=not module_only,
        load_lr_scheduler_states=False, load_module_only=module_only,
    )
    if path is None:
        raise ValueError(f"[deepspeed] failed to resume from checkpoint {folder}")  # HF's words
    return True
