"""`auto_micro_batch` runs of a tiny GPT-2 (dropout on) that fails like a GPU out of memory above a micro-batch size.

Imported by tests/test_auto_micro_batch.py (one process), and run by tests/test_auto_micro_batch_ddp.py under
`torchrun --nproc_per_node 2` (gloo): ONE launch runs every scenario of `SCENARIOS` in turn (the processes and the
process group are shared) and each rank writes `OUT_DIR/rank<r>.json`: per scenario its log (loss, grad_norm,
eval_loss per step), how often the model raised, the split in effect at the end, and the largest weight difference
from the last reference scenario before it (DDP's, FSDP2's).
Usage: python auto_micro_batch.py OUT_DIR [SCENARIO,...]  (default: every scenario)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from transformers import GPT2LMHeadModel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from helpers import lm_dataset, tiny_gpt2  # noqa: E402

import hf_lightning  # noqa: E402

SETTINGS = dict(max_steps=4, logging_steps=1, learning_rate=1e-3, seed=3, optim="adamw_torch", report_to="none",
                disable_tqdm=True, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=8,
                save_strategy="no")
CPU = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False, "enable_model_summary": False}


class OutOfMemoryModel(GPT2LMHeadModel):
    """A tiny GPT-2 that raises `torch.OutOfMemoryError` for a batch of more than `limit` rows (None: never), on
    process `rank` only (None: on every one): in its forward (`where="forward"`, before computing anything), or in
    its backward (`where="backward"`, once the last block's gradients are accumulated). `raised` counts the errors."""

    limit: int | None = None
    where = "forward"
    rank: int | None = None
    raised = 0
    after = 0
    """Training forwards that never fail (`after=1`: the first update runs at the size asked for)."""
    forwards = 0

    @classmethod
    def build(cls, limit: int | None, where: str = "forward", rank: int | None = None, dropout: float = 0.1
              ) -> OutOfMemoryModel:
        reference = tiny_gpt2(dropout=dropout, seed=5)
        model = cls(reference.config)
        model.load_state_dict(reference.state_dict())
        model.limit, model.where, model.rank = limit, where, rank
        model.loss_type = "ForCausalLM"  # a subclass's name is not a registered causal LM: its loss shifts labels
        model.transformer.h[0].register_forward_hook(model._fail_in_backward)
        return model

    def _fails(self, rows: int) -> bool:
        here = self.rank is None or int(os.environ.get("RANK", "0")) == self.rank
        late = not self.training or self.forwards > self.after
        return self.limit is not None and rows > self.limit and here and late

    def _raise(self, rows: int) -> None:
        self.raised += 1
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {rows} GiB ({self.where}).")

    def _fail_in_backward(self, module: Any, inputs: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        if self.where == "backward" and torch.is_grad_enabled() and self._fails(hidden.shape[0]):
            hidden.register_hook(lambda grad: self._raise(grad.shape[0]))

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        self.forwards += int(self.training)
        if self.where == "forward" and input_ids is not None and self._fails(input_ids.shape[0]):
            self._raise(input_ids.shape[0])
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)


def train(out_dir: str, per_device: int, accumulation: int, limit: int | None = None, where: str = "forward",
          rank: int | None = None, auto: bool = True, resume: str | None = None, dropout: float = 0.1,
          after: int = 0, fsdp2: bool = False, eval_rows: float = 8, **overrides: Any
          ) -> tuple[hf_lightning.Trainer, OutOfMemoryModel]:
    """One run: `per_device` x `accumulation` (x the processes) rows per update, 4 updates, an evaluation every 2;
    `fsdp2`: HF's `fsdp="full_shard auto_wrap"` (FSDP2, each GPT-2 block and the root sharded) instead of DDP;
    `eval_rows`: evaluation rows per process (on average: the last process may hold fewer)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = OutOfMemoryModel.build(limit, where, rank, dropout)
    model.after = after
    extra: dict[str, Any] = {"ddp_backend": "gloo"} if world > 1 else {}
    if fsdp2:
        extra.update(fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"]})
    args = hf_lightning.TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
        auto_micro_batch=auto, **{**SETTINGS, **extra, **overrides})
    kwargs = {**CPU, "devices": world} if fsdp2 else {**CPU, "strategy": "ddp", "devices": world} if world > 1 \
        else dict(CPU)
    trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=lm_dataset(n=32 * world, seed=2),
                                   eval_dataset=lm_dataset(n=int(eval_rows * world), seed=1), lightning_kwargs=kwargs)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, model


def log_of(trainer: hf_lightning.Trainer) -> list[dict[str, float]]:
    """Per step: loss and grad_norm of the update, eval_loss of an evaluation."""
    keys = ("loss", "grad_norm", "eval_loss")
    return [{"step": e["step"], **{k: e[k] for k in keys if k in e}} for e in trainer.state.log_history
            if any(k in e for k in keys)]


def weights_of(trainer: hf_lightning.Trainer) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    # FSDP2's shards gathered (a collective, in the same order on every process)
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in trainer.model.state_dict().items()}


def split_of(trainer: hf_lightning.Trainer) -> tuple[int, int]:
    guard = trainer.module.micro_batch_guard
    return (guard.split.train, guard.split.eval) if guard is not None else (1, 1)


FSDP2_EVAL = dict(dropout=0.0, eval_rows=6.5, per_device_eval_batch_size=4)

SCENARIOS = {
    "reference": dict(per_device=2, accumulation=4, auto=False, dropout=0.0),
    "forward": dict(per_device=8, accumulation=1, limit=2, where="forward", rank=1, dropout=0.0),
    "backward": dict(per_device=8, accumulation=1, limit=2, where="backward", rank=1, dropout=0.0),
    # from the second update on: DDP has run one whole update (its forward, its reducer) before the failure
    "later": dict(per_device=8, accumulation=1, limit=2, where="forward", rank=1, dropout=0.0, after=1),
    # FSDP2: all-gathers in every block's forward and backward, reduce-scatters in every backward. Evaluation: 13
    # rows in batches of 4 (rank 0: 4 + 4, rank 1: 4 + 1), so that once pieces are 2 rows rank 1's last batch, one
    # piece, repeats it to run as many forwards as rank 0's two pieces
    "fsdp2-reference": dict(per_device=2, accumulation=4, auto=False, fsdp2=True, **FSDP2_EVAL),
    "fsdp2-forward": dict(per_device=8, accumulation=1, limit=2, where="forward", rank=1, fsdp2=True, **FSDP2_EVAL),
    "fsdp2-backward": dict(per_device=8, accumulation=1, limit=2, where="backward", rank=1, fsdp2=True, **FSDP2_EVAL),
}
"""Under 2 processes: the reference at micro-batch 2 x 4, then 8 x 1 where only rank 1 runs out of memory. Without
dropout: the update's 16 samples are the same, but each process holds other ones of them (accelerate shards each
global micro-batch: rows 0-7 / 8-15 at 8 x 1, rows 0-1 / 2-3 of every 4 at 2 x 4), so dropout masks would fall on
other samples (the one-process test, tests/test_auto_micro_batch.py, checks the RNG with dropout on)."""


def main(out_dir: str, only: list[str] | None = None) -> None:
    rank = int(os.environ.get("RANK", "0"))
    report: dict[str, Any] = {}
    reference: dict[str, torch.Tensor] | None = None
    for name, scenario in SCENARIOS.items():
        if only is not None and name not in only:
            continue
        trainer, model = train(os.path.join(out_dir, name), **scenario)  # type: ignore[arg-type]
        weights = weights_of(trainer)
        reference = weights if reference is None or name.endswith("reference") else reference
        report[name] = {"log": log_of(trainer), "raised": model.raised, "split": split_of(trainer),
                        "weight_diff": max((weights[k] - reference[k]).abs().max().item() for k in weights)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else None)
