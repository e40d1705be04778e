"""The default FSDP2 sharding of a transformers model: each layer, then the root (`fully_shard`).

This is what accelerate does for `fsdp_config["version"] = 2` (accelerate `utils/fsdp_utils.py`,
`fsdp2_prepare_model` / `fsdp2_prepare_auto_wrap_policy` / `fsdp2_apply_ac`), so an HF user's `fsdp` settings shard
the same modules:

- `TRANSFORMER_BASED_WRAP` (the default): every module whose class is named in `transformer_layer_cls_to_wrap`, or
  else in the model's `_no_split_modules` (the decoder / encoder layers of a transformers model);
  `SIZE_BASED_WRAP`: every module with more than `min_num_params` parameters; `NO_WRAP`: the root only.
- `reshard_after_forward` (`full_shard` True, `shard_grad_op` False) and `cpu_offload` (`CPUOffloadPolicy`) go to
  every `fully_shard` call; the root keeps torch's own default for `reshard_after_forward`, as accelerate does.
- `activation_checkpointing` wraps the matched layers in torch's `checkpoint_wrapper` before sharding (the RNG
  state is preserved, so dropout is identical in the recomputation; accelerate turns that off for speed).
- `cpu_ram_efficient_loading`: rank 0's weights are broadcast into every rank's shards after sharding.
- mixed precision (`bf16` / `fp16`): accelerate's `MixedPrecisionPolicy` on every group, float32 master weights
  (`parallel/precision.py`).

`generate` is registered as an FSDP forward method of the root (`register_fsdp_forward_method`): an
encoder-decoder's `generate` calls the encoder directly, outside the root's `forward`, and would meet the root's
still-sharded shared embeddings; registered, the root's weights are gathered for the whole `generate` call.

Accelerate's extra groups for the embeddings and the final norm + head only change when parameters are gathered,
not the numbers; here they stay in the root's group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hf_lightning.args.parallel import FSDPSettings

__all__ = ["layer_classes", "wrap_policy", "shard_model", "fsdp2_policy", "upcast_trainable_to_fp32"]


def fsdp2_policy(dtype: torch.dtype) -> Any:
    """Accelerate's FSDP2 `MixedPrecisionPolicy` for `dtype`: parameters, gradient reduction and the root's outputs in
    it (accelerate `FullyShardedDataParallelPlugin.set_mixed_precision`, `fsdp_version=2`)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)


def upcast_trainable_to_fp32(model: torch.nn.Module) -> list[str]:
    """Trainable parameters of another dtype become float32 (the master weights), as accelerate does before
    `fully_shard` under mixed precision; returns their names."""
    names = []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.to(torch.float32)
            names.append(name)
    return names


def layer_classes(model: nn.Module, names: tuple[str, ...] | list[str] | None) -> tuple[type[nn.Module], ...]:
    """The module classes named `names` (default: the model's `_no_split_modules`), found in `model`.

    Raises:
        ValueError: a name that is no class of the model's modules (accelerate's message, with the names present).
    """
    wanted = list(names) if names is not None else list(getattr(model, "_no_split_modules", None) or [])
    present = {type(m).__name__: type(m) for m in model.modules()}
    missing = [name for name in wanted if name not in present]
    if missing:
        raise ValueError(
            f"Could not find the transformer layer class {missing[0]} in the model (fsdp_config "
            f"`transformer_layer_cls_to_wrap`, or the model's `_no_split_modules`); its module classes: "
            f"{sorted(present)}."
        )
    return tuple(present[name] for name in wanted)


def wrap_policy(model: nn.Module, settings: FSDPSettings) -> Callable[[nn.Module], bool] | None:
    """Which modules below the root get their own `fully_shard` group; None: the root only."""
    if settings.auto_wrap_policy == "TRANSFORMER_BASED_WRAP":
        classes = layer_classes(model, settings.layer_classes)
        if not classes:
            return None

        def is_layer(module: nn.Module) -> bool:
            # an activation-checkpointed layer is wrapped in a CheckpointWrapper: look through it
            return isinstance(getattr(module, "_checkpoint_wrapped_module", module), classes)

        return is_layer
    if settings.auto_wrap_policy == "SIZE_BASED_WRAP":
        return lambda module: sum(p.numel() for p in module.parameters()) > settings.min_num_params
    return None


def _children_bottom_up(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every submodule below the root with its name, children before their parents."""
    return list(reversed([(name, m) for name, m in model.named_modules() if name]))


def _apply_activation_checkpointing(model: nn.Module, policy: Callable[[nn.Module], bool]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, module in _children_bottom_up(model):
        if policy(module) and not hasattr(module, "_checkpoint_wrapped_module"):
            model.set_submodule(name, checkpoint_wrapper(module))


def shard_model(model: nn.Module, mesh: Any, settings: FSDPSettings,
                compute_dtype: torch.dtype | None = None) -> None:
    """Shard `model` in place with FSDP2 over `mesh` (a 1-D data-parallel `DeviceMesh`), as the module docstring says.

    `compute_dtype` (bfloat16 / float16 under mixed precision): every group gets accelerate's `MixedPrecisionPolicy`
    for it, and trainable parameters are float32 masters (`parallel/precision.py`).

    Raises:
        ValueError: `activation_checkpointing` with `NO_WRAP` (no layer to checkpoint), or an unknown layer class.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard, register_fsdp_forward_method

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": settings.reshard_after_forward}
    if settings.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if compute_dtype is not None:
        upcast_trainable_to_fp32(model)  # before the full state is read: the broadcast must match the shards' dtype
        kwargs["mp_policy"] = fsdp2_policy(compute_dtype)
    full_state = model.state_dict() if settings.cpu_ram_efficient_loading else None
    policy = wrap_policy(model, settings)
    if settings.activation_checkpointing:
        if policy is None:
            raise ValueError("fsdp_config['activation_checkpointing'] needs layers to checkpoint: an auto wrap policy "
                             "other than NO_WRAP, and layer classes (`transformer_layer_cls_to_wrap`).")
        _apply_activation_checkpointing(model, policy)
    if policy is not None:
        for _, module in _children_bottom_up(model):
            if policy(module) and not isinstance(module, FSDPModule):
                fully_shard(module, **kwargs)
    fully_shard(model, **{k: v for k, v in kwargs.items() if k != "reshard_after_forward"})
    if callable(getattr(model, "generate", None)):
        register_fsdp_forward_method(model, "generate")
    if full_state is not None:
        _broadcast_from_rank0(model, full_state, mesh)


def _broadcast_from_rank0(model: nn.Module, full_state: dict[str, Any], mesh: Any) -> None:
    """Every rank's shards take global rank 0's weights (HF's `cpu_ram_efficient_loading`, accelerate
    `fsdp2_load_full_state_dict`)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    is_rank0 = mesh.get_rank() == 0
    set_model_state_dict(model, full_state if is_rank0 else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
