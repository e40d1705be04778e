"""Equal `generate` call counts across processes, for generation with `synced_gpus=True`.

With sharded parameters (FSDP, DeepSpeed ZeRO-3) `generate(synced_gpus=True)` runs a collective operation at every
decoding step, so every process must call it the same number of times, at the same point. Evaluation shards are
contiguous and unpadded (`ContiguousShardSampler`: a 5-sample set on 2 processes gives 3 and 2 samples), so with a
batch of 2 rank 0 has 2 batches and rank 1 only 1. Each process can compute every shard size from the dataset
length alone, so the count to reach is known locally, without a collective (one would be paired with the other
rank's pending `generate`). Before the results are gathered, `GenerationAccumulator.finish` runs the missing calls
on a one-row dummy batch and discards the outputs: they pair with the other ranks' last real batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hf_lightning.data.sampling import ContiguousShardSampler
from hf_lightning.eval_run import EvalAccumulator
from hf_lightning.evaluation import EvalResult, EvalSettings, EvalStep

__all__ = ["GenerationAccumulator", "expected_generate_calls", "max_batches_over_ranks"]


def max_batches_over_ranks(num_samples: int, world_size: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches of the largest contiguous shard (block sizes differ by at most one; rank 0's is the largest)."""
    base, extra = divmod(num_samples, world_size)
    largest = base + (1 if extra else 0)
    return largest // batch_size if drop_last else math.ceil(largest / batch_size)


def expected_generate_calls(loader: Any, world_size: int) -> int | None:
    """The `generate` calls of the busiest rank for this loader, or None when its sharding is not ours."""
    sampler = getattr(loader, "sampler", None)  # any Lightning eval loader may come here, not only ours
    dataset = getattr(loader, "dataset", None)
    batch_size = getattr(loader, "batch_size", None)
    if not isinstance(sampler, ContiguousShardSampler) or dataset is None or not batch_size:
        return None  # e.g. a DistributedSampler pads every shard to the same number of batches
    return max_batches_over_ranks(len(dataset), world_size, batch_size, bool(getattr(loader, "drop_last", False)))


class GenerationAccumulator(EvalAccumulator):
    """An `EvalAccumulator` that counts this dataset's `generate` calls and evens them out before gathering.

    Args:
        settings, prediction_loss_only, is_prediction, world_size, device: as `EvalAccumulator`.
        loader: the dataset's loader (its sharding gives every rank's number of batches).
        generate: runs one `generate` call on the given inputs with the module's current `generate` kwargs.
        is_synced: whether `generate` runs with `synced_gpus` (then the call counts must match across ranks).
    """

    def __init__(
        self,
        settings: EvalSettings,
        prediction_loss_only: bool,
        is_prediction: bool = False,
        world_size: int = 1,
        device: torch.device | None = None,
        *,
        loader: Any = None,
        generate: Callable[[dict[str, Any]], Any],
        is_synced: Callable[[], bool],
    ) -> None:
        super().__init__(settings, prediction_loss_only, is_prediction, world_size, device)
        self.loader = loader
        self._generate = generate
        self._is_synced = is_synced
        self.generate_calls = 0
        self.template: dict[str, torch.Tensor] | None = None

    def add(self, batch: Mapping[str, Any], step: EvalStep) -> None:
        """Count the step's `generate` calls (keeping a one-row copy of the first inputs), then accumulate."""
        for generation_inputs in step.generate_inputs:
            self.generate_calls += 1
            if self.template is None:
                self.template = {k: v[:1].detach().clone() for k, v in generation_inputs.items() if torch.is_tensor(v)}
        super().add(batch, step)

    def even_out_generate_calls(self) -> int:
        """Run the dummy `generate` calls this process owes; returns how many were run."""
        if self.world_size < 2 or self.template is None or not self._is_synced():
            return 0
        target = expected_generate_calls(self.loader, self.world_size)
        owed = 0 if target is None else max(target - self.generate_calls, 0)
        for _ in range(owed):
            self._generate(dict(self.template))
        self.generate_calls += owed
        return owed

    def finish(self, prefix: str, num_samples: int | None = None) -> EvalResult:
        """Even out the `generate` calls, then gather and compute metrics as `EvalAccumulator`."""
        if not self.prediction_loss_only:
            self.even_out_generate_calls()
        return super().finish(prefix, num_samples=num_samples)
