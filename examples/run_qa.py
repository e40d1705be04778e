#!/usr/bin/env python
"""Fine-tune an extractive question-answering model on SQuAD-layout JSON, in the shape of HF's
`examples/pytorch/question-answering/run_qa.py` (with its `trainer_qa.py` and `utils_qa.py` essentials), on
`hf_lightning.Trainer`.

    python examples/run_qa.py --model_name_or_path <model folder> \
        --train_file configs/data/squad_train.jsonl --validation_file configs/data/squad_validation.jsonl \
        --test_file configs/data/squad_validation.jsonl --do_train --do_eval --do_predict \
        --output_dir out/qa --max_steps 200 --eval_strategy steps --eval_steps 100

`QuestionAnsweringTrainer` is HF's pattern: `evaluate` / `predict` call `self.evaluation_loop(...)` with
`compute_metrics` set to None, turn the start / end logits into answer texts (`postprocess_qa_predictions`), then
compute exact match and F1 on those texts. Porting an HF script is the import below; `EXAMPLES_TRAINER=transformers`
runs the same script on `transformers.Trainer` (tests/test_examples.py compares the two).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import re
import string
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForQuestionAnswering,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
    HfArgumentParser,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import PredictionOutput, speed_metrics

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ModelArguments, detect_last_checkpoint, resume_point, setup_logging  # noqa: E402

if os.environ.get("EXAMPLES_TRAINER") == "transformers":  # the oracle of tests/test_examples.py
    from transformers import Trainer, TrainingArguments
else:
    from hf_lightning import Trainer, TrainingArguments  # the one line that changes when porting an HF script

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    """Which data to train, evaluate and predict on, and how to cut contexts into features."""

    train_file: str | None = field(default=None, metadata={"help": "A json / jsonl file in SQuAD's layout."})
    validation_file: str | None = field(default=None, metadata={"help": "The same, for evaluation."})
    test_file: str | None = field(default=None, metadata={"help": "The same, for prediction."})
    max_seq_length: int = field(default=64, metadata={"help": "Question + context tokens per feature."})
    doc_stride: int = field(default=16, metadata={"help": "Overlap of the features a long context is cut into."})
    pad_to_max_length: bool = field(default=False, metadata={"help": "Pad to max_seq_length (else per batch)."})
    n_best_size: int = field(default=5, metadata={"help": "Start / end candidates looked at per feature."})
    max_answer_length: int = field(default=10, metadata={"help": "Longest answer, in tokens."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first n training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first n evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first n prediction examples."})


# ----- trainer_qa.py -----
class QuestionAnsweringTrainer(Trainer):
    """A trainer whose metrics are computed on answer texts: the loop predicts logits, `post_process_function`
    turns them into answers, `compute_metrics` scores those."""

    def __init__(self, *args, eval_examples=None, post_process_function=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_process_function = post_process_function

    def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix="eval"):
        eval_dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        eval_dataloader = self.get_eval_dataloader(eval_dataset)
        eval_examples = self.eval_examples if eval_examples is None else eval_examples
        compute_metrics, self.compute_metrics = self.compute_metrics, None  # the loop keeps the logits only
        start_time = time.time()
        try:
            output = self.evaluation_loop(eval_dataloader, description="Evaluation",
                                          prediction_loss_only=True if compute_metrics is None else None,
                                          ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        finally:
            self.compute_metrics = compute_metrics
        total_batch_size = self.args.eval_batch_size * self.args.world_size
        output.metrics.update(speed_metrics(metric_key_prefix, start_time, num_samples=output.num_samples,
                                            num_steps=math.ceil(output.num_samples / total_batch_size)))
        if self.post_process_function is not None and self.compute_metrics is not None and self.args.should_save:
            predictions = self.post_process_function(eval_examples, eval_dataset, output.predictions)
            metrics = {key if key.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{key}": value
                       for key, value in self.compute_metrics(predictions).items()}
            metrics.update(output.metrics)
        else:
            metrics = output.metrics
        if self.args.should_log:
            self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, predict_dataset, predict_examples, ignore_keys=None, metric_key_prefix="test"):
        predict_dataloader = self.get_test_dataloader(predict_dataset)
        compute_metrics, self.compute_metrics = self.compute_metrics, None
        start_time = time.time()
        try:
            output = self.evaluation_loop(predict_dataloader, description="Prediction",
                                          prediction_loss_only=True if compute_metrics is None else None,
                                          ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        finally:
            self.compute_metrics = compute_metrics
        total_batch_size = self.args.eval_batch_size * self.args.world_size
        output.metrics.update(speed_metrics(metric_key_prefix, start_time, num_samples=output.num_samples,
                                            num_steps=math.ceil(output.num_samples / total_batch_size)))
        if self.post_process_function is None or self.compute_metrics is None:
            return output
        predictions = self.post_process_function(predict_examples, predict_dataset, output.predictions, "predict")
        metrics = {key if key.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{key}": value
                   for key, value in self.compute_metrics(predictions).items()}
        metrics.update(output.metrics)
        return PredictionOutput(predictions=predictions.predictions, label_ids=predictions.label_ids,
                                metrics=metrics)


# ----- utils_qa.py -----
def postprocess_qa_predictions(examples, features, predictions, n_best_size: int, max_answer_length: int
                               ) -> dict[str, str]:
    """Each example's answer text: over its features, the best-scoring (start + end logit) valid span inside the
    context, at most `max_answer_length` tokens long."""
    all_start_logits, all_end_logits = predictions[:2]
    features_per_example = collections.defaultdict(list)
    for index, example_id in enumerate(features["example_id"]):
        features_per_example[example_id].append(index)
    answers = {}
    for example in examples:
        best_score, best_text = None, ""
        for index in features_per_example[example["id"]]:
            start_logits, end_logits = all_start_logits[index], all_end_logits[index]
            offsets = features[index]["offset_mapping"]
            starts = np.argsort(start_logits)[-1:-n_best_size - 1:-1].tolist()
            ends = np.argsort(end_logits)[-1:-n_best_size - 1:-1].tolist()
            for start in starts:
                for end in ends:
                    if start >= len(offsets) or end >= len(offsets) or offsets[start] is None or offsets[end] is None:
                        continue  # outside the context (the question, special or padding tokens)
                    if end < start or end - start + 1 > max_answer_length:
                        continue
                    score = start_logits[start] + end_logits[end]
                    if best_score is None or score > best_score:
                        best_score = score
                        best_text = example["context"][offsets[start][0]:offsets[end][1]]
        answers[example["id"]] = best_text
    return answers


# ----- the squad metric, locally -----
def _normalize(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def squad_metrics(p: EvalPrediction) -> dict[str, float]:
    """SQuAD's exact match and token F1 (in %), each prediction against its best-matching reference answer."""
    exact, f1 = [], []
    for prediction, reference in zip(p.predictions, p.label_ids):
        got = _normalize(prediction["prediction_text"])
        candidates = [_normalize(text) for text in reference["answers"]["text"]]
        exact.append(max(float(got == want) for want in candidates))
        scores = []
        for want in candidates:
            common = collections.Counter(got.split()) & collections.Counter(want.split())
            same = sum(common.values())
            if same == 0:
                scores.append(0.0)
                continue
            precision, recall = same / len(got.split()), same / len(want.split())
            scores.append(2 * precision * recall / (precision + recall))
        f1.append(max(scores))
    return {"exact_match": 100.0 * float(np.mean(exact)), "f1": 100.0 * float(np.mean(f1))}


def main() -> None:
    """Parse the arguments, prepare the features, then train / evaluate / predict as asked."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)

    data_files = {split: path for split, path in (("train", data_args.train_file),
                                                  ("validation", data_args.validation_file),
                                                  ("test", data_args.test_file)) if path}
    raw = load_dataset("json", data_files=data_files, cache_dir=model_args.cache_dir)
    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path)
    model = AutoModelForQuestionAnswering.from_pretrained(model_args.model_name_or_path, config=config)
    pad_right = tokenizer.padding_side == "right"
    max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)
    padding = "max_length" if data_args.pad_to_max_length else False

    def tokenize(examples):
        questions = [q.lstrip() for q in examples["question"]]
        return tokenizer(questions if pad_right else examples["context"],
                         examples["context"] if pad_right else questions,
                         truncation="only_second" if pad_right else "only_first", max_length=max_seq_length,
                         stride=data_args.doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                         padding=padding)

    def prepare_train_features(examples):
        tokenized = tokenize(examples)
        sample_mapping = tokenized.pop("overflow_to_sample_mapping")
        offset_mapping = tokenized.pop("offset_mapping")
        tokenized["start_positions"], tokenized["end_positions"] = [], []
        for i, offsets in enumerate(offset_mapping):
            input_ids = tokenized["input_ids"][i]
            cls_index = input_ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in input_ids else 0
            sequence_ids = tokenized.sequence_ids(i)
            answers = examples["answers"][sample_mapping[i]]
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            context_id = 1 if pad_right else 0
            token_start = sequence_ids.index(context_id)
            token_end = len(sequence_ids) - 1 - sequence_ids[::-1].index(context_id)
            if not (offsets[token_start][0] <= start_char and offsets[token_end][1] >= end_char):
                tokenized["start_positions"].append(cls_index)  # the answer is not in this feature
                tokenized["end_positions"].append(cls_index)
                continue
            while token_start < len(offsets) and offsets[token_start][0] <= start_char:
                token_start += 1
            tokenized["start_positions"].append(token_start - 1)
            while offsets[token_end][1] >= end_char:
                token_end -= 1
            tokenized["end_positions"].append(token_end + 1)
        return tokenized

    def prepare_validation_features(examples):
        tokenized = tokenize(examples)
        sample_mapping = tokenized.pop("overflow_to_sample_mapping")
        tokenized["example_id"] = []
        context_id = 1 if pad_right else 0
        for i in range(len(tokenized["input_ids"])):
            sequence_ids = tokenized.sequence_ids(i)
            tokenized["example_id"].append(examples["id"][sample_mapping[i]])
            tokenized["offset_mapping"][i] = [offset if sequence_ids[k] == context_id else None
                                              for k, offset in enumerate(tokenized["offset_mapping"][i])]
        return tokenized

    train_dataset = eval_examples = eval_dataset = predict_examples = predict_dataset = None
    columns = raw["train" if "train" in raw else "validation"].column_names
    if training_args.do_train:
        train_examples = raw["train"]
        if data_args.max_train_samples is not None:
            train_examples = train_examples.select(range(min(len(train_examples), data_args.max_train_samples)))
        with training_args.main_process_first(desc="train dataset map pre-processing"):
            train_dataset = train_examples.map(prepare_train_features, batched=True, remove_columns=columns)
    if training_args.do_eval:
        eval_examples = raw["validation"]
        if data_args.max_eval_samples is not None:
            eval_examples = eval_examples.select(range(min(len(eval_examples), data_args.max_eval_samples)))
        with training_args.main_process_first(desc="validation dataset map pre-processing"):
            eval_dataset = eval_examples.map(prepare_validation_features, batched=True, remove_columns=columns)
    if training_args.do_predict:
        predict_examples = raw["test"]
        if data_args.max_predict_samples is not None:
            predict_examples = predict_examples.select(range(min(len(predict_examples),
                                                                 data_args.max_predict_samples)))
        with training_args.main_process_first(desc="prediction dataset map pre-processing"):
            predict_dataset = predict_examples.map(prepare_validation_features, batched=True, remove_columns=columns)

    data_collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)

    def post_processing_function(examples, features, predictions, stage="eval"):
        answers = postprocess_qa_predictions(examples, features, predictions, data_args.n_best_size,
                                             data_args.max_answer_length)
        if training_args.should_save:  # as utils_qa.py, the answers are written for the user
            with open(os.path.join(training_args.output_dir, f"{stage}_predictions.json"), "w") as f:
                json.dump(answers, f, indent=2)
        formatted = [{"id": k, "prediction_text": v} for k, v in answers.items()]
        references = [{"id": ex["id"], "answers": ex["answers"]} for ex in examples]
        return EvalPrediction(predictions=formatted, label_ids=references)

    trainer = QuestionAnsweringTrainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        eval_examples=eval_examples, processing_class=tokenizer, data_collator=data_collator,
        post_process_function=post_processing_function, compute_metrics=squad_metrics,
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
        results = trainer.predict(predict_dataset, predict_examples)
        metrics = results.metrics
        metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
    trainer.create_model_card(model_name=model_args.model_name_or_path, tasks="question-answering")


if __name__ == "__main__":
    main()
