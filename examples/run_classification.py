#!/usr/bin/env python
"""Fine-tune a sequence classifier on a CSV / JSON file (single sentences or pairs), in the shape of HF's
`examples/pytorch/text-classification/run_glue.py`, on `hf_lightning.Trainer`.

    python examples/run_classification.py --model_name_or_path <model folder> \
        --train_file configs/data/sentiment_train.csv --validation_file configs/data/sentiment_validation.csv \
        --test_file configs/data/sentiment_validation.csv --do_train --do_eval --do_predict \
        --output_dir out/classification --num_train_epochs 2 --eval_strategy epoch --save_strategy epoch

Porting an HF script is the import below; `EXAMPLES_TRAINER=transformers` runs the same script on
`transformers.Trainer` (tests/test_examples.py compares the two).
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
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
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
    """Which data to train, evaluate and predict on, and how to tokenise it."""

    train_file: str | None = field(default=None, metadata={"help": "A csv or json file with the training data."})
    validation_file: str | None = field(default=None, metadata={"help": "A csv or json file for evaluation."})
    test_file: str | None = field(default=None, metadata={"help": "A csv or json file for prediction."})
    text_column_names: str | None = field(default=None, metadata={
        "help": "Comma-separated text columns (one, or two for pairs); default: every column but the label."})
    label_column_name: str = field(default="label", metadata={"help": "The label column."})
    max_seq_length: int = field(default=128, metadata={"help": "Longer sequences are truncated."})
    pad_to_max_length: bool = field(default=False, metadata={"help": "Pad to max_seq_length (else per batch)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first n training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first n evaluation rows."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first n prediction rows."})

    def __post_init__(self):
        if self.train_file is None and self.validation_file is None:
            raise ValueError("Need a --train_file or a --validation_file.")


def main():
    """Parse the arguments, prepare the data, then train / evaluate / predict as asked."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)

    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    files = {split: path for split, path in files.items() if path is not None}
    extension = next(iter(files.values())).rsplit(".", 1)[-1]
    raw = load_dataset("json" if extension == "jsonl" else extension, data_files=files, cache_dir=model_args.cache_dir)
    reference = raw["train"] if "train" in raw else raw["validation"]
    label_list = sorted(set(reference[data_args.label_column_name]))
    label_to_id = {label: i for i, label in enumerate(label_list)}
    if data_args.text_column_names is not None:
        text_columns = data_args.text_column_names.split(",")
    else:
        text_columns = [c for c in reference.column_names if c != data_args.label_column_name][:2]

    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path,
                                        num_labels=len(label_list), cache_dir=model_args.cache_dir)
    config.label2id = {str(label): i for label, i in label_to_id.items()}
    config.id2label = {i: str(label) for label, i in label_to_id.items()}
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path,
                                              cache_dir=model_args.cache_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, config=config,
                                                               cache_dir=model_args.cache_dir)
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess(examples):
        texts = [examples[c] for c in text_columns]
        result = tokenizer(*texts, padding=padding, max_length=data_args.max_seq_length, truncation=True)
        if data_args.label_column_name in examples:
            result["labels"] = [label_to_id.get(label, -1) for label in examples[data_args.label_column_name]]
        return result

    def prepared(split: str, max_samples: int | None):
        dataset = raw[split]
        if max_samples is not None:
            dataset = dataset.select(range(min(max_samples, len(dataset))))
        with training_args.main_process_first(desc=f"{split} dataset map pre-processing"):
            return dataset.map(preprocess, batched=True, remove_columns=dataset.column_names,
                               desc=f"Running tokenizer on the {split} dataset")

    train_dataset = prepared("train", data_args.max_train_samples) if training_args.do_train else None
    eval_dataset = prepared("validation", data_args.max_eval_samples) if training_args.do_eval else None
    predict_dataset = None
    if training_args.do_predict:
        predict_dataset = prepared("test", data_args.max_predict_samples).remove_columns("labels")

    def compute_metrics(prediction: EvalPrediction):
        predicted = np.argmax(prediction.predictions, axis=1)
        return {"accuracy": float((predicted == prediction.label_ids).astype(np.float32).mean())}

    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        compute_metrics=compute_metrics, processing_class=tokenizer,
        data_collator=None if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer),
    )

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=resume_point(training_args, last_checkpoint))
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.save_model()  # also saves the tokenizer
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(eval_dataset=eval_dataset)
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        output = trainer.predict(predict_dataset, metric_key_prefix="predict")
        predictions = np.argmax(output.predictions, axis=1)
        if trainer.is_world_process_zero():
            with open(os.path.join(training_args.output_dir, "predict_results.txt"), "w") as writer:
                writer.write("index\tprediction\n")
                for index, item in enumerate(predictions):
                    writer.write(f"{index}\t{label_list[item]}\n")

    trainer.create_model_card(finetuned_from=model_args.model_name_or_path, tasks="text-classification")


if __name__ == "__main__":
    main()
