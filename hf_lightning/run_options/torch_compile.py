"""`torch_compile` / `torch_compile_backend` / `torch_compile_mode`: the model the steps call, compiled as HF does.

HF hands the arguments to accelerate's `TorchDynamoPlugin` (T:792-802), whose `prepare_model` calls
`torch.compile(model, backend=..., mode=...)` (accelerate `accelerator.py`, mode only when not "default") and keeps
the user's model as `Trainer.model`: the compiled wrapper (`Trainer.model_wrapped`) is what runs, the plain model is
what is saved, so checkpoint keys carry no `_orig_mod.` prefix. A model the user compiled before passing it is
handled the same way: its inner module is the model, the user's wrapper what runs.

Differences from HF (README "Compiling the model"): evaluation and prediction also run the compiled model (HF runs
its evaluations during and after `train()` uncompiled, T:2925-2941: the compiled wrapper is only used by an
`evaluate()` before any `train()`), and `remove_unused_columns` inspects the inner model's `forward`.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from hf_lightning.args import TrainingArguments
from hf_lightning.model_wrappers import is_compiled, without_compile

__all__ = ["compile_kwargs", "model_to_call"]


def compile_kwargs(args: TrainingArguments) -> dict[str, Any]:
    """`torch.compile` keyword arguments for the arguments, as accelerate's `TorchDynamoPlugin.to_kwargs` gives them
    (`dynamic=False` for HF's `neuron` backend only, T:799-800)."""
    kwargs: dict[str, Any] = {"backend": args.torch_compile_backend or "inductor"}
    if args.torch_compile_mode not in (None, "default"):
        kwargs["mode"] = args.torch_compile_mode
    if kwargs["backend"] == "neuron":
        kwargs["dynamic"] = False
    return kwargs


def model_to_call(model: nn.Module, args: TrainingArguments) -> nn.Module | None:
    """The compiled wrapper the steps call for `model`, or None to call the model itself.

    A model the user compiled is called as given; otherwise `args.torch_compile` compiles the plain model (a
    PEFT model too: compiling is lazy, the first call traces it).

    Raises:
        ValueError: an unknown `torch_compile_backend` (the message lists torch's backends).
    """
    if is_compiled(model):
        return model
    if not args.torch_compile:
        return None
    kwargs = compile_kwargs(args)
    try:
        return cast(nn.Module, torch.compile(without_compile(model), **kwargs))
    except Exception as err:  # torch raises its own `InvalidBackend` (a RuntimeError subclass) at this call
        backends = ", ".join(torch._dynamo.list_backends())
        raise ValueError(f"`torch_compile_backend`={kwargs['backend']!r} cannot compile: {err} Available backends: "
                         f"{backends}.") from None
