#!/usr/bin/env python
"""Fine-tune a sequence-to-sequence model (summarisation, translation) on JSON lines of source / target texts, in
the shape of HF's `examples/pytorch/summarization/run_summarization.py`, on `hf_lightning.Seq2SeqTrainer`.

    python examples/run_summarization.py --model_name_or_path <model folder> \
        --train_file configs/data/reverse_train.jsonl --validation_file configs/data/reverse_validation.jsonl \
        --text_column source --summary_column target --do_train --do_eval --predict_with_generate \
        --output_dir out/summarization

Evaluation and prediction generate text (`predict_with_generate`) scored with ROUGE, SacreBLEU and exact match by
`hf_lightning.tasks.text_metrics.build_text_metrics` (torchmetrics, offline; HF's script uses `evaluate.load("rouge")`,
which needs the hub). `EXAMPLES_TRAINER=transformers` runs the same script on `transformers.Seq2SeqTrainer`.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

import numpy as np
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    set_seed,
)

from hf_lightning.tasks.text_metrics import build_text_metrics

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ModelArguments, detect_last_checkpoint, resume_point, setup_logging  # noqa: E402

if os.environ.get("EXAMPLES_TRAINER") == "transformers":  # the oracle of tests/test_examples.py
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
else:
    from hf_lightning import Seq2SeqTrainer, Seq2SeqTrainingArguments  # the one line that changes when porting

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    """Which files hold the source / target texts, and the lengths used to tokenise and generate."""

    train_file: str | None = field(default=None, metadata={"help": "A json / jsonl / csv file of text pairs."})
    validation_file: str | None = field(default=None, metadata={"help": "Pairs to evaluate on."})
    test_file: str | None = field(default=None, metadata={"help": "Pairs to predict on."})
    text_column: str = field(default="text", metadata={"help": "The source text column."})
    summary_column: str = field(default="summary", metadata={"help": "The target text column."})
    max_source_length: int = field(default=64, metadata={"help": "Source tokens kept."})
    max_target_length: int = field(default=32, metadata={"help": "Target tokens kept for training."})
    val_max_target_length: int | None = field(default=None, metadata={
        "help": "Generation length for evaluation / prediction (default: max_target_length)."})
    num_beams: int | None = field(default=None, metadata={"help": "Beams for evaluation / prediction."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first n training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first n evaluation rows."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first n prediction rows."})

    def __post_init__(self):
        if self.val_max_target_length is None:
            self.val_max_target_length = self.max_target_length


def main():
    """Parse the arguments, prepare the data, then train / evaluate / predict as asked."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)

    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    files = {split: path for split, path in files.items() if path is not None}
    extension = next(iter(files.values())).rsplit(".", 1)[-1]
    raw = load_dataset("json" if extension == "jsonl" else extension, data_files=files, cache_dir=model_args.cache_dir)

    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, config=config)
    if model.config.decoder_start_token_id is None:
        raise ValueError("Make sure that `config.decoder_start_token_id` is correctly defined")

    def preprocess(examples):
        model_inputs = tokenizer(examples[data_args.text_column], max_length=data_args.max_source_length,
                                 truncation=True)
        labels = tokenizer(text_target=examples[data_args.summary_column], max_length=data_args.max_target_length,
                           truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    def prepared(split: str, max_samples: int | None):
        dataset = raw[split]
        if max_samples is not None:
            dataset = dataset.select(range(min(max_samples, len(dataset))))
        with training_args.main_process_first(desc=f"{split} dataset map pre-processing"):
            return dataset.map(preprocess, batched=True, remove_columns=dataset.column_names,
                               desc=f"Running tokenizer on the {split} dataset")

    train_dataset = prepared("train", data_args.max_train_samples) if training_args.do_train else None
    eval_dataset = prepared("validation", data_args.max_eval_samples) if training_args.do_eval else None
    predict_dataset = prepared("test", data_args.max_predict_samples) if training_args.do_predict else None

    text_metrics = build_text_metrics(tokenizer)

    def compute_metrics(prediction):
        return {key: round(float(value), 4) for key, value in text_metrics(prediction).items()}

    trainer = Seq2SeqTrainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        processing_class=tokenizer, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=resume_point(training_args, last_checkpoint))
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    generation = {"max_length": data_args.val_max_target_length, "num_beams": data_args.num_beams}
    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(metric_key_prefix="eval", **generation)
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        results = trainer.predict(predict_dataset, metric_key_prefix="predict", **generation)
        metrics = results.metrics
        metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            ids = np.where(results.predictions != -100, results.predictions, tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)
            with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w") as writer:
                writer.write("\n".join(text.strip() for text in texts))

    trainer.create_model_card(finetuned_from=model_args.model_name_or_path, tasks="summarization")


if __name__ == "__main__":
    main()
