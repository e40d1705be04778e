"""`activation_checkpointing` (`gradient_checkpointing`) with its `*_kwargs`, enabled on the model as HF does.

HF (T:1503-1527) pops `every_n_layers` and `offload` from `activation_checkpointing_kwargs` and passes the rest to
`torch.utils.checkpoint.checkpoint` through `model.activation_checkpointing_enable(...)` (the deprecated
`gradient_checkpointing_enable` for models that only have that one). transformers then defaults the kwargs to
`{"use_reentrant": False}` and calls `enable_input_require_grads()` for text models, so a PEFT model (frozen
embeddings) also trains with `use_reentrant=True` (transformers `modeling_utils.py`,
`PreTrainedModel._activation_checkpointing_enable`). A `PeftModel` forwards the call to its base model.
"""

from __future__ import annotations

from typing import Any, cast

from torch import nn

from hf_lightning.args import TrainingArguments

__all__ = ["enable_activation_checkpointing"]


def enable_activation_checkpointing(model: nn.Module, args: TrainingArguments) -> None:
    """Enable activation checkpointing on `model` when `args.activation_checkpointing` asks for it.

    Raises:
        ValueError: the model has no `activation_checkpointing_enable` / `gradient_checkpointing_enable`.
    """
    if not args.activation_checkpointing:
        return
    # a JSON string was parsed into a dict when the arguments were built (args/hf_fields.py)
    kwargs = dict(cast("dict[str, Any] | None", args.activation_checkpointing_kwargs) or {})
    layer_options = {"every_n_layers": kwargs.pop("every_n_layers", 1), "offload": kwargs.pop("offload", False)}
    enable = getattr(model, "activation_checkpointing_enable", None)  # a PreTrainedModel's (a PeftModel forwards)
    if callable(enable):
        enable(activation_checkpointing_kwargs=kwargs or None, **layer_options)
        return
    legacy = getattr(model, "gradient_checkpointing_enable", None)
    if not callable(legacy):
        raise ValueError(
            f"`gradient_checkpointing`=True needs a model with `gradient_checkpointing_enable()` (a transformers "
            f"PreTrainedModel); {type(model).__name__} has none. Set gradient_checkpointing=False or enable "
            "checkpointing in the model yourself."
        )
    legacy(gradient_checkpointing_kwargs=kwargs or None, **layer_options)
