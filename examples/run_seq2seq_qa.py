#!/usr/bin/env python
"""Fine-tune a sequence-to-sequence model to generate answers to questions on SQuAD-layout JSON, in the shape of HF's
`examples/pytorch/question-answering/run_seq2seq_qa.py` (with its `trainer_seq2seq_qa.py`), on
`hf_lightning.Seq2SeqTrainer`.

    python examples/run_seq2seq_qa.py --model_name_or_path <model folder> \
        --train_file configs/data/squad_train.jsonl --validation_file configs/data/squad_validation.jsonl \
        --test_file configs/data/squad_validation.jsonl --do_train --do_eval --do_predict --predict_with_generate \
        --output_dir out/seq2seq_qa --max_steps 200 --eval_strategy steps --eval_steps 100

`QuestionAnsweringSeq2SeqTrainer` is HF's pattern: its `evaluate` / `predict` set `self._gen_kwargs` and call
`self.evaluation_loop(...)` themselves with `compute_metrics` set to None (so, as in HF, the eval loss is weighted
by sample, not per batch as `Seq2SeqTrainer.evaluate` weights it), decode the generated answers, then compute exact
match and F1 on the texts. `EXAMPLES_TRAINER=transformers` runs the same script on `transformers.Seq2SeqTrainer`
(tests/test_examples.py compares the two).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    HfArgumentParser,
    set_seed,
)
from transformers.trainer_utils import PredictionOutput, speed_metrics

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ModelArguments, detect_last_checkpoint, resume_point, setup_logging  # noqa: E402
from run_qa import squad_metrics  # noqa: E402  (the SQuAD exact match / F1, computed locally)

if os.environ.get("EXAMPLES_TRAINER") == "transformers":  # the oracle of tests/test_examples.py
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
else:
    from hf_lightning import Seq2SeqTrainer, Seq2SeqTrainingArguments  # the one line that changes when porting

logger = logging.getLogger(__name__)


@dataclass
class DataTrainingArguments:
    """Which data to train, evaluate and predict on, and the lengths of questions and answers."""

    train_file: str | None = field(default=None, metadata={"help": "A json / jsonl file in SQuAD's layout."})
    validation_file: str | None = field(default=None, metadata={"help": "The same, for evaluation."})
    test_file: str | None = field(default=None, metadata={"help": "The same, for prediction."})
    max_seq_length: int = field(default=64, metadata={"help": "Question + context tokens."})
    max_answer_length: int = field(default=12, metadata={"help": "Answer tokens (targets and generation)."})
    num_beams: int | None = field(default=None, metadata={"help": "Beams for evaluate / predict generation."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first n training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first n evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first n prediction examples."})


# ----- trainer_seq2seq_qa.py -----
class QuestionAnsweringSeq2SeqTrainer(Seq2SeqTrainer):
    """A Seq2Seq trainer whose metrics are computed on decoded answer texts by `post_process_function`."""

    def __init__(self, *args, eval_examples=None, post_process_function=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_process_function = post_process_function

    def _generation_kwargs(self, gen_kwargs: dict) -> dict:
        gen_kwargs = gen_kwargs.copy()
        if gen_kwargs.get("max_length") is None and self.args.generation_max_length is not None:
            gen_kwargs["max_length"] = self.args.generation_max_length
        if gen_kwargs.get("num_beams") is None and self.args.generation_num_beams is not None:
            gen_kwargs["num_beams"] = self.args.generation_num_beams
        return gen_kwargs

    def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix="eval",
                 **gen_kwargs):
        self._gen_kwargs = self._generation_kwargs(gen_kwargs)
        eval_dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        eval_dataloader = self.get_eval_dataloader(eval_dataset)
        eval_examples = self.eval_examples if eval_examples is None else eval_examples
        compute_metrics, self.compute_metrics = self.compute_metrics, None  # the loop keeps the generations only
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
            predictions = self.post_process_function(eval_examples, eval_dataset, output)
            metrics = {key if key.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{key}": value
                       for key, value in self.compute_metrics(predictions).items()}
            metrics.update(output.metrics)
        else:
            metrics = output.metrics
        if self.args.should_log:
            self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, predict_dataset, predict_examples, ignore_keys=None, metric_key_prefix="test", **gen_kwargs):
        self._gen_kwargs = self._generation_kwargs(gen_kwargs)
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
        predictions = self.post_process_function(predict_examples, predict_dataset, output, "predict")
        metrics = {key if key.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{key}": value
                   for key, value in self.compute_metrics(predictions).items()}
        metrics.update(output.metrics)
        return PredictionOutput(predictions=predictions.predictions, label_ids=predictions.label_ids,
                                metrics=metrics)


def main() -> None:
    """Parse the arguments, prepare question / answer pairs, then train / evaluate / predict as asked."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
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
    model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, config=config)

    def preprocess(examples):
        inputs = [f"question: {q.lstrip()} context: {c.lstrip()}"
                  for q, c in zip(examples["question"], examples["context"])]
        targets = [answers["text"][0] if answers["text"] else "" for answers in examples["answers"]]
        model_inputs = tokenizer(inputs, max_length=data_args.max_seq_length, truncation=True)
        labels = tokenizer(text_target=targets, max_length=data_args.max_answer_length, truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        model_inputs["example_id"] = list(examples["id"])
        return model_inputs

    columns = raw["train" if "train" in raw else "validation"].column_names

    def prepared(split: str, max_samples: int | None):
        examples = raw[split]
        if max_samples is not None:
            examples = examples.select(range(min(max_samples, len(examples))))
        with training_args.main_process_first(desc=f"{split} dataset map pre-processing"):
            return examples, examples.map(preprocess, batched=True, remove_columns=columns)

    train_dataset = eval_examples = eval_dataset = predict_examples = predict_dataset = None
    if training_args.do_train:
        _, train_dataset = prepared("train", data_args.max_train_samples)
    if training_args.do_eval:
        eval_examples, eval_dataset = prepared("validation", data_args.max_eval_samples)
    if training_args.do_predict:
        predict_examples, predict_dataset = prepared("test", data_args.max_predict_samples)

    def post_processing_function(examples, features, outputs, stage="eval"):
        preds = outputs.predictions[0] if isinstance(outputs.predictions, tuple) else outputs.predictions
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        decoded = tokenizer.batch_decode(preds, skip_special_tokens=True)
        by_id = {example_id: i for i, example_id in enumerate(features["example_id"])}
        answers = {ex["id"]: decoded[by_id[ex["id"]]].strip() for ex in examples}
        if training_args.should_save:  # as HF's script, the answers are written for the user
            with open(os.path.join(training_args.output_dir, f"{stage}_predictions.json"), "w") as f:
                json.dump(answers, f, indent=2)
        formatted = [{"id": k, "prediction_text": v} for k, v in answers.items()]
        references = [{"id": ex["id"], "answers": ex["answers"]} for ex in examples]
        return EvalPrediction(predictions=formatted, label_ids=references)

    trainer = QuestionAnsweringSeq2SeqTrainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        eval_examples=eval_examples, processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=squad_metrics if training_args.predict_with_generate else None,
        post_process_function=post_processing_function,
    )

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=resume_point(training_args, last_checkpoint))
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
    generation = {"max_length": data_args.max_answer_length, "num_beams": data_args.num_beams}
    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate(metric_key_prefix="eval", **generation)
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    if training_args.do_predict:
        logger.info("*** Predict ***")
        results = trainer.predict(predict_dataset, predict_examples, **generation)
        metrics = results.metrics
        metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
    trainer.create_model_card(model_name=model_args.model_name_or_path, tasks="question-answering")


if __name__ == "__main__":
    main()
