"""Whether a model's weights are all finite, checked at every save so that no checkpoint holds NaN or inf.

One NaN in the data (a regression label, a bad feature) or a diverging run can turn every weight into NaN in one
update; HF's Trainer then writes the poisoned weights into the next `checkpoint-<n>`, `resume_from_checkpoint=True`
picks it and `save_total_limit` rotates the good ones away. hf_lightning stops at such a save instead
(`NonFiniteWeightsError`, raised by `checkpoint/write.py`) unless `save_nonfinite_checkpoints=True`.

The check is one fused pass: `torch._foreach_norm` (2-norm, accumulated in float32) over every floating parameter
(not the buffers: some models keep `-inf` masks there on purpose), whose results are finite exactly when the tensor
is (a float32 overflow of a finite tensor's norm is confirmed per tensor with `isfinite`, so a huge but finite
weight is not mistaken for inf). Under sharding each process checks its own shards (a `DTensor`'s local tensor,
DeepSpeed ZeRO-3's partition) and the processes agree through one sum of the per-tensor flags (`reduce`), so all of
them name the same first non-finite tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["NonFiniteWeightsError", "first_nonfinite", "nonfinite_flags"]


class NonFiniteWeightsError(FloatingPointError):
    """A save found a NaN or inf in the model's weights (the message names the step and the first such tensor); no
    checkpoint was written for it. `save_nonfinite_checkpoints=True` saves such weights, as HF does."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of a parameter: a DTensor's local shard, a ZeRO-3 partition, else the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    if callable(to_local):
        return to_local()
    partition = getattr(tensor, "ds_tensor", None)
    return partition if isinstance(partition, torch.Tensor) else tensor


def _named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The floating parameters of `model` (each shared tensor once), in the model's order."""
    return [(name, _local(t).detach()) for name, t in model.named_parameters() if t.is_floating_point()]


def nonfinite_flags(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A float32 CPU tensor with 1.0 for each of `tensors` that holds a NaN or inf, else 0.0 (one fused pass)."""
    flags = torch.zeros(len(tensors), dtype=torch.float32)
    indices = [i for i, t in enumerate(tensors) if t.numel() > 0]
    if not indices:
        return flags
    norms = torch._foreach_norm([tensors[i] for i in indices], 2, dtype=torch.float32)
    finite = torch.stack([n.to("cpu", non_blocking=False) for n in norms]).isfinite()  # one device sync per device
    for position in (~finite).nonzero().flatten().tolist():
        index = indices[position]
        # the norm overflowed or the tensor holds a non-finite value: decide exactly for this tensor only
        flags[index] = float(not bool(tensors[index].isfinite().all()))
    return flags


def first_nonfinite(model: nn.Module, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
                    ) -> tuple[str, str] | None:
    """`(name, "NaN" | "inf" | "NaN or inf")` of the first parameter of `model` that is not finite, or None.

    Args:
        model: the model (plain, or sharded: each process checks its shards).
        reduce: sums a tensor over the processes (a collective every process must call), or None for one process.
    """
    named = _named_tensors(model)
    local = nonfinite_flags([tensor for _, tensor in named])
    flags = reduce(local.clone()).to("cpu") if reduce is not None else local
    bad = (flags > 0).nonzero().flatten().tolist()
    if not bad:
        return None
    name, tensor = named[bad[0]]
    if not local[bad[0]]:  # another process holds the bad shard
        return name, "NaN or inf"
    return name, "NaN" if bool(tensor.isnan().any()) else "inf"
