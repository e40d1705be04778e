"""Train a tiny GPT-2 with `train_sampling_strategy="group_by_length"` on 2 CPU processes; every rank writes the rows
of each micro-batch it trained on (JSON), in order.

Run by tests/test_length_grouping.py as a subprocess (Lightning's `ddp` launcher re-executes it for rank 1).
Usage: python ddp_grouped_order.py OUT_DIR
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from test_length_grouping import token_rows, train  # noqa: E402


def main() -> None:
    out_dir = sys.argv[1]
    trainer, seen = train(os.path.join(out_dir, "run"), token_rows(n=30), save_strategy="no",
                          lightning_kwargs={"devices": 2, "strategy": "ddp"})
    with open(os.path.join(out_dir, f"rank{trainer.lightning_trainer.global_rank}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
