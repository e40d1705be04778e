"""`hf-lightning fit` under FSDP2 on 2 CPU processes (gloo), for tests/test_final_save.py.

Usage: python cli_fsdp2_fit.py fit --config ... (the arguments of `hf-lightning`)

`RecordSharding` (a Lightning callback for `trainer.callbacks`) writes `sharded.txt` into `output_dir` at the end of
training: whether the model's parameters were FSDP2 shards. Lightning starts rank 1 by running this script again.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `cli_fsdp2_fit.RecordSharding` resolves on both ranks

import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402


class RecordSharding(Callback):
    """Record that the weights were sharded during training (rank 0), next to the final model."""

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            sharded = any(isinstance(p, DTensor) for p in pl_module.model.parameters())
            os.makedirs(pl_module.args.resolved_output_dir, exist_ok=True)
            with open(os.path.join(pl_module.args.resolved_output_dir, "sharded.txt"), "w") as f:
                f.write(f"{sharded} {type(trainer.strategy).__name__}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    from hf_lightning.cli import main

    main(sys.argv[1:])
