#!/usr/bin/env python
"""Supervised fine-tuning of a causal language model with TRL's `SFTTrainer`, in the shape of HF's example scripts,
on hf_lightning: the one line `hf_lightning.use_as_transformers_trainer()` before `import trl` builds TRL's trainer
on `hf_lightning.Trainer` (README "TRL and sentence-transformers trainers").

    python examples/run_sft.py --model_name_or_path <model folder> \
        --train_file configs/data/sentiment_train.csv --validation_file configs/data/sentiment_validation.csv \
        --do_train --do_eval --output_dir out/sft --max_length 64 --num_train_epochs 1

Every `SFTConfig` option is a command-line flag (`--packing`, `--max_length`, `--completion_only_loss`...); the
`text` column is the training text (`--dataset_text_field`). `EXAMPLES_TRAINER=transformers` runs the same script on
`transformers.Trainer` (TRL's own base), as tests/test_examples.py does to compare the two.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
from dataclasses import dataclass, field

if importlib.util.find_spec("trl") is None:  # before the minutes of loading torch and transformers
    sys.exit('run_sft.py needs TRL, which is not installed: pip install "hf-lightning[trl]"')

if os.environ.get("EXAMPLES_TRAINER") != "transformers":  # the oracle of tests/test_examples.py keeps TRL's base
    import hf_lightning

    hf_lightning.use_as_transformers_trainer()  # the one line: before trl is imported

from datasets import load_dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, set_seed  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ModelArguments, detect_last_checkpoint, resume_point, setup_logging  # noqa: E402

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    """Which text files to train and evaluate on."""

    train_file: str | None = field(default=None, metadata={"help": "A csv, json or txt file with the texts."})
    validation_file: str | None = field(default=None, metadata={"help": "Texts to evaluate on."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first n training texts."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first n evaluation texts."})


def main():
    """Parse the arguments, load the texts, then train / evaluate as asked."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, SFTConfig))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    if training_args.do_predict:  # one error, not a flag silently ignored
        raise ValueError("run_sft.py does not predict (SFTTrainer prepares only its train and eval datasets): drop "
                         "--do_predict and evaluate with --do_eval --validation_file.")
    setup_logging(training_args)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)

    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    files = {split: path for split, path in files.items() if path is not None}
    extension = next(iter(files.values())).rsplit(".", 1)[-1]
    extension = {"txt": "text", "jsonl": "json"}.get(extension, extension)
    raw = load_dataset(extension, data_files=files, cache_dir=model_args.cache_dir)

    def limited(split: str, max_samples: int | None):
        dataset = raw[split]
        dataset = dataset.select_columns([training_args.dataset_text_field])  # the text (a csv's label is not SFT's)
        return dataset.select(range(min(max_samples, len(dataset)))) if max_samples is not None else dataset

    train_dataset = limited("train", data_args.max_train_samples) if training_args.do_train else None
    eval_dataset = limited("validation", data_args.max_eval_samples) if training_args.do_eval else None

    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    trainer = SFTTrainer(model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         processing_class=tokenizer)

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=resume_point(training_args, last_checkpoint))
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        metrics["perplexity"] = math.exp(metrics["eval_loss"]) if metrics["eval_loss"] < 700 else float("inf")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
