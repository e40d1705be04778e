#!/usr/bin/env python
"""Fine-tune a token classifier (NER, POS...) on JSON lines of words and tags, in the shape of HF's
`examples/pytorch/token-classification/run_ner.py`, on `hf_lightning.Trainer`.

    python examples/run_ner.py --model_name_or_path <model folder> \
        --train_file configs/data/tags_train.jsonl --validation_file configs/data/tags_validation.jsonl \
        --text_column_name tokens --label_column_name tags --do_train --do_eval --output_dir out/ner

Each word's tag goes to its first sub-word token, -100 to the others (`label_all_tokens` tags them all). The metrics
are entity-level precision / recall / F1 (an entity: a maximal run of one non-`O` tag) and token accuracy, computed
here with numpy (HF's script uses `evaluate.load("seqeval")`, which needs the hub). `EXAMPLES_TRAINER=transformers`
runs the same script on `transformers.Trainer`.
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
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
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
    """Which files hold the words and tags, and how to align tags with sub-words."""

    train_file: str | None = field(default=None, metadata={"help": "A json / jsonl file of word lists and tags."})
    validation_file: str | None = field(default=None, metadata={"help": "Data to evaluate on."})
    test_file: str | None = field(default=None, metadata={"help": "Data to predict on."})
    text_column_name: str = field(default="tokens", metadata={"help": "The column of word lists."})
    label_column_name: str = field(default="ner_tags", metadata={"help": "The column of tag lists."})
    max_seq_length: int = field(default=128, metadata={"help": "Longer sequences are truncated."})
    label_all_tokens: bool = field(default=False, metadata={"help": "Tag every sub-word, not only the first."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first n training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first n evaluation rows."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first n prediction rows."})


def entities(tags: list[str]) -> set[tuple[int, int, str]]:
    """The `(start, end, tag)` runs of one non-`O` tag."""
    found, start = set(), None
    for i, tag in enumerate([*tags, "O"]):
        if start is not None and tag != tags[start]:
            found.add((start, i, tags[start]))
            start = None
        if start is None and tag != "O" and i < len(tags):
            start = i
    return found


def main():
    """Parse the arguments, prepare the data, then train / evaluate / predict as asked."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)

    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    raw = load_dataset("json", data_files={k: v for k, v in files.items() if v is not None},
                       cache_dir=model_args.cache_dir)
    reference = raw["train"] if "train" in raw else raw["validation"]
    label_list = sorted({tag for tags in reference[data_args.label_column_name] for tag in tags})
    label_to_id = {label: i for i, label in enumerate(label_list)}

    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path,
                                        num_labels=len(label_list), label2id=label_to_id,
                                        id2label=dict(enumerate(label_list)))
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    model = AutoModelForTokenClassification.from_pretrained(model_args.model_name_or_path, config=config)

    def tokenize_and_align_labels(examples):
        tokenized = tokenizer(examples[data_args.text_column_name], truncation=True,
                              max_length=data_args.max_seq_length, is_split_into_words=True)
        labels = []
        for row, tags in enumerate(examples[data_args.label_column_name]):
            previous, row_labels = None, []
            for word in tokenized.word_ids(batch_index=row):
                if word is None:
                    row_labels.append(-100)  # special tokens
                elif word != previous or data_args.label_all_tokens:
                    row_labels.append(label_to_id[tags[word]])
                else:
                    row_labels.append(-100)
                previous = word
            labels.append(row_labels)
        tokenized["labels"] = labels
        return tokenized

    def prepared(split: str, max_samples: int | None):
        dataset = raw[split]
        if max_samples is not None:
            dataset = dataset.select(range(min(max_samples, len(dataset))))
        with training_args.main_process_first(desc=f"{split} dataset map pre-processing"):
            return dataset.map(tokenize_and_align_labels, batched=True, remove_columns=dataset.column_names,
                               desc=f"Running tokenizer on the {split} dataset")

    train_dataset = prepared("train", data_args.max_train_samples) if training_args.do_train else None
    eval_dataset = prepared("validation", data_args.max_eval_samples) if training_args.do_eval else None
    predict_dataset = prepared("test", data_args.max_predict_samples) if training_args.do_predict else None

    def tag_lists(predictions, labels):
        """The predicted and true tags of each row, at the positions that carry a label."""
        predicted, true = [], []
        for row_predictions, row_labels in zip(predictions, labels):
            keep = row_labels != -100
            predicted.append([label_list[p] for p in row_predictions[keep]])
            true.append([label_list[t] for t in row_labels[keep]])
        return predicted, true

    def compute_metrics(prediction):
        predicted, true = tag_lists(np.argmax(prediction.predictions, axis=2), prediction.label_ids)
        hits = guessed = gold = 0
        for row_predicted, row_true in zip(predicted, true):
            found, wanted = entities(row_predicted), entities(row_true)
            hits, guessed, gold = hits + len(found & wanted), guessed + len(found), gold + len(wanted)
        precision, recall = hits / max(guessed, 1), hits / max(gold, 1)
        tokens = sum(len(row) for row in true)
        return {"precision": precision, "recall": recall,
                "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
                "accuracy": sum(p == t for r, s in zip(predicted, true) for p, t in zip(r, s)) / max(tokens, 1)}

    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        processing_class=tokenizer, data_collator=DataCollatorForTokenClassification(tokenizer),
        compute_metrics=compute_metrics,
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
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    if training_args.do_predict:
        logger.info("*** Predict ***")
        predictions, labels, metrics = trainer.predict(predict_dataset, metric_key_prefix="predict")
        predicted, _ = tag_lists(np.argmax(predictions, axis=2), labels)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        if trainer.is_world_process_zero():
            with open(os.path.join(training_args.output_dir, "predictions.txt"), "w") as writer:
                writer.writelines(" ".join(row) + "\n" for row in predicted)

    trainer.create_model_card(finetuned_from=model_args.model_name_or_path, tasks="token-classification")


if __name__ == "__main__":
    main()
