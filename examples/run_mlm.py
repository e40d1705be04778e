#!/usr/bin/env python
"""Train or fine-tune a masked language model on text files, in the shape of HF's
`examples/pytorch/language-modeling/run_mlm.py`, on `hf_lightning.Trainer`.

    python examples/run_mlm.py --model_name_or_path <model folder> \
        --train_file configs/data/sentiment_train.csv --validation_file configs/data/sentiment_validation.csv \
        --do_train --do_eval --output_dir out/mlm --max_seq_length 32 --num_train_epochs 2

Each line is one example (`line_by_line`) or the texts are concatenated into `max_seq_length` blocks; 15% of the
tokens are masked at random by `DataCollatorForLanguageModeling`. `EXAMPLES_TRAINER=transformers` runs the same
script on `transformers.Trainer`.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    set_seed,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ModelArguments, detect_last_checkpoint, resume_point, setup_logging  # noqa: E402

if os.environ.get("EXAMPLES_TRAINER") == "transformers":  # the oracle of tests/test_examples.py
    from transformers import Trainer, TrainingArguments
else:
    from hf_lightning import Trainer, TrainingArguments  # the one line that changes when porting an HF script

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    """Which text files to use, the sequence length and the masking rate."""

    train_file: str | None = field(default=None, metadata={"help": "A csv, json or txt file with the texts."})
    validation_file: str | None = field(default=None, metadata={"help": "Texts to evaluate on."})
    test_file: str | None = field(default=None, metadata={"help": "Texts to predict on (loss and perplexity)."})
    text_column_name: str = field(default="text", metadata={"help": "The text column (csv / json)."})
    max_seq_length: int = field(default=64, metadata={"help": "Tokens per example."})
    line_by_line: bool = field(default=False, metadata={"help": "One example per line instead of packed blocks."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of the tokens to mask."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first n training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first n evaluation examples."})


def main():
    """Parse the arguments, prepare the data, then train / evaluate / predict as asked."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)

    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    files = {split: path for split, path in files.items() if path is not None}
    extension = next(iter(files.values())).rsplit(".", 1)[-1]
    extension = {"txt": "text", "jsonl": "json"}.get(extension, extension)
    raw = load_dataset(extension, data_files=files, cache_dir=model_args.cache_dir)

    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    model = AutoModelForMaskedLM.from_pretrained(model_args.model_name_or_path, config=config)
    length = data_args.max_seq_length
    columns = raw[next(iter(raw))].column_names

    if data_args.line_by_line:
        def tokenize(examples):
            return tokenizer(examples[data_args.text_column_name], truncation=True, max_length=length,
                             return_special_tokens_mask=True)

        with training_args.main_process_first(desc="dataset map tokenization"):
            prepared = raw.map(tokenize, batched=True, remove_columns=columns, desc="Running tokenizer on lines")
    else:
        def tokenize(examples):
            return tokenizer(examples[data_args.text_column_name], return_special_tokens_mask=True)

        def group_texts(examples):
            joined = {key: list(chain(*examples[key])) for key in examples}
            total = (len(joined["input_ids"]) // length) * length
            return {key: [ids[i: i + length] for i in range(0, total, length)] for key, ids in joined.items()}

        with training_args.main_process_first(desc="dataset map tokenization"):
            tokenized = raw.map(tokenize, batched=True, remove_columns=columns, desc="Running tokenizer on texts")
        with training_args.main_process_first(desc="grouping texts together"):
            prepared = tokenized.map(group_texts, batched=True, desc=f"Grouping texts in chunks of {length}")

    def limited(split: str, max_samples: int | None):
        dataset = prepared[split]
        return dataset.select(range(min(max_samples, len(dataset)))) if max_samples is not None else dataset

    train_dataset = limited("train", data_args.max_train_samples) if training_args.do_train else None
    eval_dataset = limited("validation", data_args.max_eval_samples) if training_args.do_eval else None

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(prediction):
        predictions, labels = prediction.predictions.reshape(-1), prediction.label_ids.reshape(-1)
        masked = labels != -100  # only the masked tokens are scored
        return {"accuracy": float((predictions[masked] == labels[masked]).astype(np.float32).mean())}

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=data_args.mlm_probability)
    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        processing_class=tokenizer, data_collator=collator,
        compute_metrics=compute_metrics if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics if training_args.do_eval else None,
    )

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

    if training_args.do_predict:
        logger.info("*** Predict ***")
        metrics = trainer.predict(prepared["test"], metric_key_prefix="predict").metrics
        metrics["predict_samples"] = len(prepared["test"])
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)

    trainer.create_model_card(finetuned_from=model_args.model_name_or_path, tasks="fill-mask")


if __name__ == "__main__":
    main()
