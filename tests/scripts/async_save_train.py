"""A run with `save_async=True` (tiny GPT-2, a checkpoint every update, 5 updates) for tests/test_async_save.py.

Usage: python async_save_train.py OUTPUT_DIR hang-at-3|resume
- `hang-at-3`: the background write of checkpoint-3 prints `WRITING 3` and then never finishes (the test kills the
  process there);
- `resume`: `resume_from_checkpoint=True`, then prints `RESUMED FROM <step>, ENDED AT <global_step>`.
"""

import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from helpers import lm_dataset, tiny_gpt2  # noqa: E402

import hf_lightning  # noqa: E402
from hf_lightning.checkpoint.find import last_checkpoint  # noqa: E402


class HangingTokenizer:
    def save_pretrained(self, directory) -> None:
        if "tmp-checkpoint-3-" in str(directory):
            print("WRITING 3", flush=True)
            threading.Event().wait()


def main() -> None:
    output_dir, mode = sys.argv[1], sys.argv[2]
    args = hf_lightning.TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=2, max_steps=5, learning_rate=1e-2, logging_steps=1,
        save_steps=1, seed=7, report_to="none", disable_tqdm=True, save_async=True,
    )
    resume = mode == "resume"
    start = os.path.basename(last_checkpoint(output_dir) or "none") if resume else None
    trainer = hf_lightning.Trainer(
        model=tiny_gpt2(), args=args, train_dataset=lm_dataset(n=40),
        processing_class=None if resume else HangingTokenizer(),
        lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False},
    )
    trainer.train(resume_from_checkpoint=True if resume else None)
    if resume:
        print(f"RESUMED FROM {start.rpartition('-')[2]}, ENDED AT {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
