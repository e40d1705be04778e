"""HF's `bf16_full_eval` / `fp16_full_eval`: evaluate with the model itself cast to that dtype (T:2949-2953).

HF casts the model (`model.to(dtype)`, in place) when `evaluate()` or `predict()` runs outside training; evaluations
during `train()` keep the training dtype. The cast stays after the call, as in HF (the model object is the same).
On a CPU, HF casts to float16 all the same (torch runs float16 on CPUs, slowly): so do we.
"""

from __future__ import annotations

import torch
from torch import nn

from hf_lightning.args import TrainingArguments

__all__ = ["full_eval_dtype", "cast_for_full_eval"]


def full_eval_dtype(args: TrainingArguments) -> torch.dtype | None:
    """The dtype `evaluate()` / `predict()` cast the model to, or None."""
    if args.fp16_full_eval:
        return torch.float16
    if args.bf16_full_eval:
        return torch.bfloat16
    return None


def cast_for_full_eval(model: nn.Module, args: TrainingArguments) -> None:
    """Cast `model` in place for an evaluation or prediction outside training (nothing without a full-eval flag)."""
    dtype = full_eval_dtype(args)
    if dtype is not None:
        model.to(dtype=dtype)
