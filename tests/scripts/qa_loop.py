"""A question-answering trainer written as HF's examples write it, on `hf_lightning.Trainer` or `transformers.Trainer`.

`qa_trainer_class(base)` is the pattern of HF's `examples/pytorch/question-answering/trainer_qa.py` (written here, not
copied): `evaluate` / `predict` overridden, `self.evaluation_loop(...)` called with `compute_metrics` set to None,
the predictions post-processed into answer spans, then the metrics computed on those. The task is tiny and
generated: each feature is a random token sequence whose answer is the span between two marker tokens.

Run by tests/test_eval_loop.py in-process (`collect(base, 1, ...)` on both trainers) and by
tests/test_eval_loop_ddp.py as a 2-process launch (Lightning's `ddp` launcher re-executes this script for rank 1),
which also checks the accelerate surface (`gather`, `gather_for_metrics`, `pad_across_processes`, `reduce`,
`wait_for_everyone`) under 2 processes. Usage: python qa_loop.py OUT_PREFIX DEVICES
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from helpers import VOCAB  # noqa: E402
from transformers.trainer_utils import EvalPrediction, PredictionOutput, speed_metrics  # noqa: E402

LENGTH, START_MARK, END_MARK = 16, 3, 4
TIMING = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


def qa_model(seed: int = 0) -> Any:
    """A 2-layer BERT with a span-extraction head, from a config."""
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, pad_token_id=0)
    return BertForQuestionAnswering(config)


def qa_features(n: int, seed: int) -> Dataset:
    """Features: `input_ids`, `attention_mask`, gold `start_positions` / `end_positions` (the tokens between the
    two markers), and an `example_id` the model does not take (removed from the batches, kept for post-processing)."""
    rng = random.Random(seed)
    rows: dict[str, list] = {"input_ids": [], "attention_mask": [], "start_positions": [], "end_positions": [],
                             "example_id": []}
    for i in range(n):
        ids = [rng.randrange(5, VOCAB) for _ in range(LENGTH)]
        start = rng.randrange(1, LENGTH - 4)
        end = start + 1 + rng.randrange(0, 2)
        ids[start - 1], ids[end + 1] = START_MARK, END_MARK
        rows["input_ids"].append(ids)
        rows["attention_mask"].append([1] * LENGTH)
        rows["start_positions"].append(start)
        rows["end_positions"].append(end)
        rows["example_id"].append(f"q{i}")
    return Dataset.from_dict(rows)


def post_process(examples: Dataset, features: Dataset, predictions: Any, stage: str = "eval") -> EvalPrediction:
    """Predicted spans (best start, then best end at or after it) against the gold spans, per example."""
    start_logits, end_logits = predictions[:2]
    spans, gold = [], []
    for row, starts, ends in zip(features, start_logits, end_logits):
        start = int(np.argmax(starts))
        end = start + int(np.argmax(ends[start:]))
        spans.append({"id": row["example_id"], "span": [start, end]})
        gold.append({"id": row["example_id"], "span": [row["start_positions"], row["end_positions"]]})
    return EvalPrediction(predictions=spans, label_ids=gold)


def span_metrics(pred: EvalPrediction) -> dict[str, float]:
    """Exact match and token-overlap F1 of the spans (the SQuAD metrics on positions)."""
    exact, f1 = [], []
    for got, want in zip(pred.predictions, pred.label_ids):
        (a, b), (c, d) = got["span"], want["span"]
        exact.append(float((a, b) == (c, d)))
        overlap = max(0, min(b, d) - max(a, c) + 1)
        f1.append(0.0 if not overlap else 2 * overlap / ((b - a + 1) + (d - c + 1)))
    return {"exact_match": 100 * float(np.mean(exact)), "f1": 100 * float(np.mean(f1))}


def qa_trainer_class(base: type) -> type:
    """HF's QuestionAnsweringTrainer pattern on `base` (`transformers.Trainer` or `hf_lightning.Trainer`)."""

    class QATrainer(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, eval_examples: Any = None, post_process_function: Any = None, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.eval_examples = eval_examples
            self.post_process_function = post_process_function

        def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix="eval"):
            eval_dataset = self.eval_dataset if eval_dataset is None else eval_dataset
            loader = self.get_eval_dataloader(eval_dataset)
            eval_examples = self.eval_examples if eval_examples is None else eval_examples
            compute_metrics, self.compute_metrics = self.compute_metrics, None  # the loop only predicts
            start = time.time()
            try:
                output = self.evaluation_loop(loader, description="Evaluation",
                                              prediction_loss_only=True if compute_metrics is None else None,
                                              ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
            finally:
                self.compute_metrics = compute_metrics
            total = self.args.eval_batch_size * self.args.world_size
            output.metrics.update(speed_metrics(metric_key_prefix, start, num_samples=output.num_samples,
                                                num_steps=math.ceil(output.num_samples / total)))
            metrics = self.compute_metrics(self.post_process_function(eval_examples, eval_dataset,
                                                                      output.predictions))
            metrics = {k if k.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{k}": v
                       for k, v in metrics.items()}
            metrics.update(output.metrics)
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

        def predict(self, predict_dataset, predict_examples=None, ignore_keys=None, metric_key_prefix="test"):
            loader = self.get_test_dataloader(predict_dataset)
            compute_metrics, self.compute_metrics = self.compute_metrics, None
            try:
                output = self.evaluation_loop(loader, description="Prediction", ignore_keys=ignore_keys,
                                              metric_key_prefix=metric_key_prefix)
            finally:
                self.compute_metrics = compute_metrics
            spans = self.post_process_function(predict_examples, predict_dataset, output.predictions, "predict")
            metrics = {f"{metric_key_prefix}_{k}": v for k, v in self.compute_metrics(spans).items()}
            metrics.update(output.metrics)
            return PredictionOutput(predictions=spans.predictions, label_ids=spans.label_ids, metrics=metrics)

    return QATrainer


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not k.endswith(TIMING)}


def build(base: type, out_dir: str, devices: int = 1, learning_rate: float = 5e-3) -> Any:
    """The QA trainer on `base`: 8 updates of batch 4 on 32 features, evaluated every 4 on 10 (batch 4: uneven
    over 2 processes). With `learning_rate=0` the weights stay the initial ones, so runs on 1 and 2 processes
    (whose updates see other batches) must evaluate alike."""
    train, evaluation = qa_features(32, seed=1), qa_features(10, seed=2)
    kwargs: dict[str, Any] = dict(output_dir=out_dir, max_steps=8, per_device_train_batch_size=4,
                                  per_device_eval_batch_size=4, learning_rate=learning_rate, eval_strategy="steps",
                                  eval_steps=4, logging_steps=4, save_strategy="no", report_to="none",
                                  disable_tqdm=True, seed=3, use_cpu=True)
    extra: dict[str, Any] = {}
    if base.__module__.startswith("hf_lightning"):
        import hf_lightning

        args: Any = hf_lightning.TrainingArguments(**kwargs)
        lightning_kwargs: dict[str, Any] = {"accelerator": "cpu", "devices": devices}
        if devices > 1:
            lightning_kwargs["strategy"] = "ddp"
        extra["lightning_kwargs"] = lightning_kwargs
    else:
        from transformers import TrainingArguments

        args = TrainingArguments(**kwargs)
    return qa_trainer_class(base)(model=qa_model(), args=args, train_dataset=train, eval_dataset=evaluation,
                                  eval_examples=evaluation, post_process_function=post_process,
                                  compute_metrics=span_metrics, **extra)


def collect(base: type, out_dir: str, devices: int = 1, learning_rate: float = 5e-3) -> dict[str, Any]:
    """Train (evaluating at steps 4 and 8), evaluate, predict; the results as plain JSON values."""
    trainer = build(base, out_dir, devices, learning_rate)
    trainer.train()
    evaluation = trainer.evaluate()
    test = qa_features(9, seed=4)
    predicted = trainer.predict(test, predict_examples=test)
    return {
        "eval_logs": [_plain(e) for e in trainer.state.log_history if "eval_exact_match" in e],
        "evaluate": _plain(evaluation),
        "predict_metrics": _plain(predicted.metrics),
        "spans": [p["span"] for p in predicted.predictions],
        "ids": [p["id"] for p in predicted.predictions],
        "weights": float(sum(p.detach().double().sum() for p in trainer.model.parameters())),
    }


def accelerate_surface(trainer: Any) -> dict[str, Any]:
    """What the accelerate members return on this process (after a run: the Lightning trainer is attached)."""
    acc = trainer.accelerator
    rank = acc.process_index
    row = torch.full((rank + 1, 2), float(rank))  # rank r: r + 1 rows, so shapes differ across processes
    padded = acc.pad_across_processes(row, dim=0, pad_index=-1)
    acc.wait_for_everyone()
    # 4 rows in batches of 2 over 2 processes: accelerate gives each rank one batch (rank r: batch r)
    prepared = [batch.tolist() for batch in acc.prepare(torch.utils.data.DataLoader(list(range(4)), batch_size=2))]
    refusals = []
    for attempt in (lambda: acc.prepare_model(torch.nn.Linear(2, 2)),):
        try:
            attempt()
        except NotImplementedError as refused:
            refusals.append(str(refused).split(":")[0])
    return {
        "refusals": refusals, "prepared": prepared,
        "process_index": rank, "num_processes": acc.num_processes, "is_main_process": acc.is_main_process,
        "is_local_main_process": acc.is_local_main_process, "use_distributed": acc.use_distributed,
        "gather": acc.gather(torch.tensor([rank, 10 + rank])).tolist(),
        "gather_scalar": acc.gather(torch.tensor(float(rank))).tolist(),
        "gather_for_metrics": acc.gather_for_metrics(torch.tensor([[rank]])).tolist(),
        "gather_for_metrics_object": acc.gather_for_metrics([f"r{rank}"], use_gather_object=True),
        "padded": padded.tolist(),
        "reduce_sum": acc.reduce(torch.tensor([1.0 + rank])).tolist(),
        "reduce_mean": acc.reduce(torch.tensor([1.0 + rank]), reduction="mean").tolist(),
        "device": str(acc.device), "split_batches": acc.split_batches, "even_batches": acc.even_batches,
    }


if __name__ == "__main__":
    import hf_lightning

    prefix, devices = sys.argv[1], int(sys.argv[2])
    result = collect(hf_lightning.Trainer, prefix + ".out", devices, learning_rate=0.0)
    trainer_for_surface = build(hf_lightning.Trainer, prefix + ".surface", devices)
    trainer_for_surface.evaluate()  # a run attaches the Lightning trainer (and its process group)
    result["surface"] = accelerate_surface(trainer_for_surface)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    with open(f"{prefix}.rank{rank}.json", "w") as f:
        json.dump(result, f)
