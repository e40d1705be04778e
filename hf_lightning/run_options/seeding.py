"""HF's seeding: `set_seed(seed)`, or `enable_full_determinism(seed)` with `full_determinism` (T:419, 1486).

`enable_full_determinism` also sets the environment variables that CUDA / cuBLAS / NPUs / flash attention read for
deterministic kernels, calls `torch.use_deterministic_algorithms(True)` and makes cuDNN deterministic. It changes the
whole process, as in HF. The `Trainer` facade and the CLI seed with this function where HF's `Trainer` does: when it
is built (before `model_init` builds the model) and again when `train()` re-creates the model with `model_init`.
"""

from __future__ import annotations

from transformers import enable_full_determinism, set_seed

from hf_lightning.args import TrainingArguments

__all__ = ["seed_as_hf"]


def seed_as_hf(args: TrainingArguments) -> None:
    """`enable_full_determinism(args.seed)` if `args.full_determinism`, else `set_seed(args.seed)`."""
    if args.full_determinism:
        enable_full_determinism(args.seed)
    else:
        set_seed(args.seed)
