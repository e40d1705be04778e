"""Streaming `compute_metrics` (torchmetrics): the same numbers as the equivalent HF-style function, per-batch updates
with the documented rule, no predictions kept during evaluation, and the adapter's options."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics import MetricCollection, SumMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity

import hf_lightning
from hf_lightning.module.metrics import EvalBatch, StreamingMetrics, as_streaming_metrics, is_streaming_metric
from helpers import classification_dataset, tiny_bert, tiny_gpt2
from test_eval_parity import accuracy, pad_collator, tiny_token_bert, token_rows


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


def _trainer(tmp_path, model, compute_metrics, eval_dataset, **kwargs):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to="none",
                                          disable_tqdm=True)
    return hf_lightning.Trainer(model=model, args=args, compute_metrics=compute_metrics, eval_dataset=eval_dataset,
                                **kwargs)


class KeptArrays(hf_lightning.TransformerModule):
    """Records, per evaluation, how many prediction batches its accumulators kept."""

    kept: list[int] = []
    accumulators: list = []

    def new_eval_accumulator(self, is_prediction, world_size, loader):
        accumulator = super().new_eval_accumulator(is_prediction, world_size, loader)
        KeptArrays.accumulators.append(accumulator)
        return accumulator

    def on_validation_epoch_end(self) -> None:
        KeptArrays.kept.append(sum(len(acc.preds) for acc in KeptArrays.accumulators))
        KeptArrays.accumulators = []


def test_collection_equals_the_function_and_keeps_no_predictions(tmp_path):
    data = classification_dataset(13, seed=1)
    expected = _trainer(tmp_path, tiny_bert(), accuracy, data).evaluate()

    class Recording(hf_lightning.Trainer):
        module_class = KeptArrays

    KeptArrays.kept, KeptArrays.accumulators = [], []
    trainer = Recording(model=tiny_bert(), args=hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to="none"), eval_dataset=data,
        compute_metrics=MetricCollection({"accuracy": MulticlassAccuracy(2, average="micro")}))
    result = trainer.evaluate()
    assert list(result)[:2] == ["eval_loss", "eval_accuracy"]
    assert result["eval_loss"] == expected["eval_loss"]
    assert result["eval_accuracy"] == pytest.approx(expected["eval_accuracy"], abs=1e-7)
    assert KeptArrays.kept == [0]  # the evaluation kept no prediction batch
    assert trainer.evaluate()["eval_accuracy"] == result["eval_accuracy"]  # state reset between evaluations
    prediction = trainer.predict(data)  # predict keeps predictions and still reports the metric
    assert prediction.predictions.shape == (13, 2)
    assert prediction.metrics["test_accuracy"] == result["eval_accuracy"]


def test_single_metric_is_named_by_class_or_name(tmp_path):
    data = classification_dataset(8, seed=2)
    assert "eval_MulticlassAccuracy" in _trainer(tmp_path, tiny_bert(), MulticlassAccuracy(2), data).evaluate()
    named = StreamingMetrics(MulticlassAccuracy(2), name="acc")
    assert "eval_acc" in _trainer(tmp_path, tiny_bert(), named, data).evaluate()


def test_token_classification_with_argmax(tmp_path):
    """Token labels with -100: `argmax=True` feeds class ids; `ignore_index=-100` skips padding and ignored tokens."""
    rows = token_rows(10, seed=3)

    def token_accuracy(pred):
        mask = pred.label_ids != -100
        return {"accuracy": float((pred.predictions.argmax(-1)[mask] == pred.label_ids[mask]).mean())}

    expected = _trainer(tmp_path, tiny_token_bert(), token_accuracy, rows, data_collator=pad_collator).evaluate()
    streaming = StreamingMetrics(MulticlassAccuracy(3, average="micro", ignore_index=-100), argmax=True,
                                 name="accuracy")
    result = _trainer(tmp_path, tiny_token_bert(), streaming, rows, data_collator=pad_collator).evaluate()
    assert result["eval_accuracy"] == pytest.approx(expected["eval_accuracy"], abs=1e-7)


def test_causal_lm_perplexity_with_shift(tmp_path):
    """`shift_labels=True`: position t scores token t + 1; exp of the token-weighted eval_loss."""
    rows = token_rows(9, seed=4, causal=True)
    perplexity = StreamingMetrics(Perplexity(ignore_index=-100), shift_labels=True, name="perplexity")
    result = _trainer(tmp_path, tiny_gpt2(), perplexity, rows, data_collator=pad_collator,
                      eval_loss_weighting="tokens").evaluate()
    assert result["eval_perplexity"] == pytest.approx(math.exp(result["eval_loss"]), rel=1e-5)


def test_prepare_receives_the_batch_and_loss(tmp_path):
    seen: list[EvalBatch] = []

    def prepare(batch: EvalBatch):
        seen.append(batch)
        return {"value": batch.loss.reshape(1)}

    from torchmetrics import MeanMetric

    result = _trainer(tmp_path, tiny_bert(), StreamingMetrics(MeanMetric(), prepare=prepare, name="mean_batch_loss"),
                      classification_dataset(8, seed=5)).evaluate()
    assert len(seen) == 2 and set(seen[0].inputs) == {"input_ids", "attention_mask", "labels"}
    assert result["eval_mean_batch_loss"] == pytest.approx(result["eval_loss"], rel=1e-6)  # two equal batches


def test_non_scalar_metric_result_names_the_key(tmp_path):
    per_class = MetricCollection({"per_class": MulticlassAccuracy(2, average=None)})
    with pytest.raises(TypeError, match=r"'per_class'.*Tensor of shape \(2,\)"):
        _trainer(tmp_path, tiny_bert(), per_class, classification_dataset(8)).evaluate()


def test_detection_helpers():
    assert is_streaming_metric(MulticlassAccuracy(2)) and is_streaming_metric(MetricCollection([SumMetric()]))
    assert not is_streaming_metric(accuracy) and as_streaming_metrics(accuracy) is None
    wrapped = StreamingMetrics(SumMetric())
    assert as_streaming_metrics(wrapped) is wrapped
    with pytest.raises(TypeError, match="torchmetrics Metric"):
        StreamingMetrics(accuracy)
    metric = StreamingMetrics(MulticlassAccuracy(2, average="micro"), argmax=True)
    metric.update(EvalBatch(preds=torch.tensor([[0.1, 0.9], [0.8, 0.2]]), labels=torch.tensor([1, 1]), inputs={},
                            loss=None))
    assert {k: float(v) for k, v in metric.compute().items()} == {"MulticlassAccuracy": 0.5}
    assert metric.metric.update_count == 0  # `compute` resets: the next evaluation starts empty
