"""FSDP1 (`fsdp_config={"version": 1}`: `HFFSDPStrategy`) against DDP / one process, for tests/test_fsdp1.py.

Usage: python fsdp1_train.py STRATEGY ACCELERATOR DEVICES RESULT_JSON
    STRATEGY "fsdp1" or "reference" (DDP on several devices, one device alone); ACCELERATOR "cpu" (gloo) or "gpu".
    Trains the tiny GPT-2 of checkpoint_train.py for 3 updates of 2 micro-batches (gradient accumulation 2, the
    window FSDP1 once ran inside its root's forward), without checkpoints; rank 0 writes the log history (loss, grad
    norm and learning rate of each update) and the trained weights, gathered, to RESULT_JSON.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from checkpoint_train import make_trainer  # noqa: E402
from helpers import tiny_gpt2  # noqa: E402


def main(strategy: str, accelerator: str, devices: int, result_json: str) -> None:
    torch.set_num_threads(1)
    hf_args = {"fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 1}} if strategy == "fsdp1" else {}
    out = os.path.join(os.path.dirname(result_json), strategy)
    trainer = make_trainer(out, {"accelerator": accelerator, "devices": devices}, max_steps=3, save_strategy="no",
                           **hf_args)
    trainer.train()
    lightning = trainer.lightning_trainer
    names = [name for name, _ in tiny_gpt2().named_parameters()]

    def read(name: str) -> list:
        value = trainer.model  # FSDP1's wrappers pass attribute reads on to the module they wrap
        for part in name.split("."):
            value = getattr(value, part)
        return value.detach().cpu().tolist()

    if strategy == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(lightning.strategy.model, writeback=False):
            weights = {name: read(name) for name in names}
    else:
        weights = {name: read(name) for name in names}
    if lightning.is_global_zero:
        with open(result_json, "w") as f:
            json.dump({"strategy": type(lightning.strategy).__name__, "world_size": lightning.world_size,
                       "history": trainer.state.log_history, "weights": weights}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
