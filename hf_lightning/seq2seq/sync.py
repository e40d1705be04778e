"""Equal `generate` call counts across processes, for generation with `synced_gpus=True`.

With sharded parameters (FSDP, DeepSpeed ZeRO-3) `generate(synced_gpus=True)` runs collective operations at every
decoding step, so every process must call it the same number of times. Evaluation shards are contiguous and
unpadded (a 5-sample set on 2 processes gives 3 and 2 samples), so a process may have fewer batches. Before the
results are gathered, `GenerationAccumulator.finish` makes the processes agree on the largest call count; the ones
behind run that many extra `generate` calls on a one-row template batch and discard the outputs. Without
`synced_gpus`, `generate` has no collective and nothing is done.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from hf_lightning.evaluation import EvalAccumulator, EvalResult

if TYPE_CHECKING:
    from hf_lightning.seq2seq.module import Seq2SeqTransformerModule

__all__ = ["GenerationAccumulator", "extra_calls_needed"]


def extra_calls_needed(counts: list[int]) -> list[int]:
    """How many padding calls each process makes so that all reach the largest count."""
    top = max(counts, default=0)
    return [top - c for c in counts]


class GenerationAccumulator(EvalAccumulator):
    """An `EvalAccumulator` that counts this dataset's `generate` calls and evens them out before gathering.

    Args:
        module: the module being evaluated.
        prediction_loss_only: keep only losses.
        dataloader_idx: the eval dataset this accumulator belongs to.
    """

    def __init__(self, module: Seq2SeqTransformerModule, prediction_loss_only: bool, dataloader_idx: int = 0) -> None:
        super().__init__(module, prediction_loss_only)
        self.dataloader_idx = dataloader_idx
        self.generate_calls = 0
        self.template: dict[str, torch.Tensor] | None = None

    def record_generate(self, generation_inputs: dict[str, Any]) -> None:
        """Count one `generate` call; keep a one-row CPU copy of the first inputs as the padding template."""
        self.generate_calls += 1
        if self.template is None:
            self.template = {k: v[:1].detach().cpu() for k, v in generation_inputs.items() if torch.is_tensor(v)}

    def even_out_generate_calls(self) -> int:
        """Run the padding `generate` calls this process owes; returns how many were run."""
        module = self.module
        trainer = module.trainer
        if trainer is None or trainer.world_size < 2 or not module.generation_is_synced():
            return 0
        parts: list[Any] = [None] * trainer.world_size
        torch.distributed.all_gather_object(parts, (self.generate_calls, self.template))
        owed = extra_calls_needed([count for count, _ in parts])[trainer.global_rank]
        template = next((t for _, t in parts if t is not None), None)
        if owed and template is not None:
            inputs = {k: v.to(module.device) for k, v in template.items()}
            for _ in range(owed):
                module.run_generate(inputs, dict(module.gen_kwargs))
        self.generate_calls += owed
        return owed

    def finish(self, prefix: str, num_samples: int | None = None) -> EvalResult:
        """Even out the `generate` calls (collective), then gather and compute metrics as `EvalAccumulator`."""
        if not self.prediction_loss_only:
            self.even_out_generate_calls()
        return super().finish(prefix, num_samples=num_samples)
