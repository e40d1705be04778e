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
from typing import TYPE_CHECKING, Any

import torch

from hf_lightning.evaluation import EvalAccumulator, EvalResult

if TYPE_CHECKING:
    from hf_lightning.seq2seq.module import Seq2SeqTransformerModule

__all__ = ["GenerationAccumulator", "max_batches_over_ranks"]


def max_batches_over_ranks(num_samples: int, world_size: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches of the largest contiguous shard (block sizes differ by at most one; rank 0's is the largest)."""
    base, extra = divmod(num_samples, world_size)
    largest = base + (1 if extra else 0)
    return largest // batch_size if drop_last else math.ceil(largest / batch_size)


def expected_generate_calls(loader: Any, world_size: int) -> int | None:
    """The `generate` calls of the busiest rank for this loader, or None when its sharding is not ours."""
    from hf_lightning.data.datamodule import ContiguousShardSampler

    sampler = getattr(loader, "sampler", None)
    dataset = getattr(loader, "dataset", None)
    batch_size = getattr(loader, "batch_size", None)
    if not isinstance(sampler, ContiguousShardSampler) or dataset is None or not batch_size:
        return None  # e.g. a DistributedSampler pads every shard to the same number of batches
    return max_batches_over_ranks(len(dataset), world_size, batch_size, bool(getattr(loader, "drop_last", False)))


class GenerationAccumulator(EvalAccumulator):
    """An `EvalAccumulator` that counts this dataset's `generate` calls and evens them out before gathering.

    Args:
        module: the module being evaluated.
        prediction_loss_only: keep only losses.
        dataloader_idx: the eval dataset this accumulator belongs to.
        is_prediction: a `predict()` run (see `EvalAccumulator`).
    """

    def __init__(
        self,
        module: Seq2SeqTransformerModule,
        prediction_loss_only: bool,
        dataloader_idx: int = 0,
        is_prediction: bool = False,
    ) -> None:
        super().__init__(module, prediction_loss_only, is_prediction)
        self.dataloader_idx = dataloader_idx
        self.generate_calls = 0
        self.loader: Any = None
        self.template: dict[str, torch.Tensor] | None = None

    def record_generate(self, generation_inputs: dict[str, Any], loader: Any) -> None:
        """Count one `generate` call; keep the loader and a one-row copy of the first inputs (the dummy batch)."""
        self.generate_calls += 1
        self.loader = loader
        if self.template is None:
            self.template = {k: v[:1].detach().clone() for k, v in generation_inputs.items() if torch.is_tensor(v)}

    def even_out_generate_calls(self) -> int:
        """Run the dummy `generate` calls this process owes; returns how many were run."""
        module = self.module
        trainer = module.trainer
        if trainer is None or trainer.world_size < 2 or not module.generation_is_synced() or self.template is None:
            return 0
        target = expected_generate_calls(self.loader, trainer.world_size)
        owed = 0 if target is None else max(target - self.generate_calls, 0)
        for _ in range(owed):
            module.run_generate(dict(self.template), dict(module.gen_kwargs))
        self.generate_calls += owed
        return owed

    def finish(self, prefix: str, num_samples: int | None = None) -> EvalResult:
        """Even out the `generate` calls, then gather and compute metrics as `EvalAccumulator`."""
        if not self.prediction_loss_only:
            self.even_out_generate_calls()
        return super().finish(prefix, num_samples=num_samples)
