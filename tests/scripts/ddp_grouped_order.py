"""Train a tiny GPT-2 with `train_sampling_strategy="group_by_length"` on 2 CPU processes; every rank writes the rows
of each micro-batch it trained on (JSON), in order, and the generator state each epoch's order was drawn from
(`draws<rank>.pt`).

Run by tests/test_length_grouping.py as a subprocess (Lightning's `ddp` launcher re-executes it for rank 1).
Usage: python ddp_grouped_order.py OUT_DIR
"""

import json
import os
import sys

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from test_length_grouping import token_rows, train  # noqa: E402


class RecordDraws(pl.Callback):
    """Keeps each epoch's `group_by_length` draw (the generator state its order came from)."""

    def __init__(self) -> None:
        self.states: list[torch.Tensor] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.states.append(trainer.datamodule.train_loader().batch_sampler.grouping_draw.rng_state)


def main() -> None:
    out_dir = sys.argv[1]
    draws = RecordDraws()
    trainer, seen = train(os.path.join(out_dir, "run"), token_rows(n=30), save_strategy="no", dropout=0.1,
                          lightning_kwargs={"devices": 2, "strategy": "ddp", "callbacks": [draws]})
    rank = trainer.lightning_trainer.global_rank
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    torch.save(draws.states, os.path.join(out_dir, f"draws{rank}.pt"))


if __name__ == "__main__":
    main()
