"""Train a tiny GPT-2 on a streaming dataset (`datasets.IterableDataset`: an Arrow dataset on disk streamed in 16
shards, shuffled with a 1,000-row buffer, tokenised on the fly by `map` with the bundled tokenizer), with
`transformers.Trainer` or `hf_lightning.Trainer`; optionally resume, and end the process at the first update.

    python bench/scripts/stream_train.py --trainer hf|ours --data DIR --output_dir DIR --max_steps N
        [--save_steps N] [--resume CHECKPOINT] [--exit_at_first_update]

Used by bench/bench_stream_resume.py. `--exit_at_first_update` prints `FIRST_UPDATE <time.time()>` at the end of
the first update the run makes (after a resume: the first resumed one) and exits at once.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

TOKENIZER = Path(__file__).resolve().parents[2] / "configs" / "data" / "tokenizer.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", choices=["hf", "ours"], required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, required=True)
    parser.add_argument("--save_steps", type=int, default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--exit_at_first_update", action="store_true")
    options = parser.parse_args()

    import datasets
    import transformers
    from transformers import DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    if options.trainer == "hf":
        from transformers import Trainer, TrainingArguments
    else:
        from hf_lightning import Trainer, TrainingArguments

    datasets.logging.set_verbosity_error()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), pad_token="[PAD]", unk_token="[UNK]")

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=64)

    stream = (datasets.load_from_disk(options.data).to_iterable_dataset(num_shards=16)
              .shuffle(seed=0, buffer_size=1000).map(tokenize, batched=True, remove_columns=["text"]))
    transformers.set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=2, n_positions=64,
                                       pad_token_id=tokenizer.pad_token_id))
    args = TrainingArguments(
        output_dir=options.output_dir, max_steps=options.max_steps, per_device_train_batch_size=8, learning_rate=1e-3,
        logging_steps=100, save_strategy="steps" if options.save_steps else "no", save_steps=options.save_steps or 500,
        report_to="none", disable_tqdm=True, use_cpu=True, seed=0,
    )
    callbacks = []
    if options.exit_at_first_update:
        class ExitAtFirstUpdate(transformers.TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                print(f"FIRST_UPDATE {time.time():.6f} step {state.global_step}", flush=True)
                sys.stdout.flush()
                os._exit(0)

        callbacks.append(ExitAtFirstUpdate())
    trainer = Trainer(model=model, args=args, train_dataset=stream,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=options.resume)


if __name__ == "__main__":
    main()
