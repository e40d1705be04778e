"""Train a tiny GPT-2 on a shuffled `datasets` stream with 2 CPU processes (gloo), a checkpoint every update; or
resume such a run from a checkpoint. Dumps the log history and each process's read count as JSON.

Run by tests/test_stream_resume_ddp.py (Lightning's `ddp` launcher re-executes this script for rank 1).
Usage: python stream_resume_ddp.py OUTPUT_DIR OUT_JSON WORKERS [CHECKPOINT]
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import datasets  # noqa: E402
from helpers import tiny_gpt2  # noqa: E402
from stream_helpers import counted_stream, reads  # noqa: E402

import hf_lightning  # noqa: E402


def main() -> None:
    output_dir, out_json, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    resume = sys.argv[4] if len(sys.argv) > 4 else None
    datasets.logging.set_verbosity_error()
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    log = Path(f"{out_json}.rank{rank}.log")
    args = hf_lightning.TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=10,
        learning_rate=1e-2, logging_steps=1, save_steps=1, seed=7, report_to="none", disable_tqdm=True,
        dataloader_num_workers=workers,
    )
    model = tiny_gpt2(dropout=0.1, seed=9 if resume else 0)
    trainer = hf_lightning.Trainer(
        model=model, args=args, train_dataset=counted_stream(log, shards=4, per_shard=40),
        lightning_kwargs={"accelerator": "cpu", "devices": 2, "strategy": "ddp", "logger": False,
                          "enable_progress_bar": False},
    )
    trainer.train(resume_from_checkpoint=resume)
    if trainer.lightning_trainer.is_global_zero:
        Path(out_json).write_text(json.dumps({"log_history": trainer.state.log_history}))


if __name__ == "__main__":
    main()
