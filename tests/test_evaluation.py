"""Evaluation beyond the HF parity tests: bad input gives clear errors, a failing `compute_metrics` leaves earlier
checkpoints intact, Lightning's own `validate` / `predict` run the same code, the token-weighted `eval_loss`, the
prediction files, and the padded concatenation against HF's `nested_concat`."""

from __future__ import annotations

import json
import os
import traceback

import lightning.pytorch as pl
import numpy as np
import pandas as pd
import pytest
import torch
from transformers.trainer_pt_utils import nested_concat

import hf_lightning
from hf_lightning.flow.flow import HFTrainerFlow
from hf_lightning.data.datamodule import TransformerDataModule
from hf_lightning.module.evaluation import check_metrics, concat_padded
from hf_lightning.cli.prediction_writer import write_predictions
from helpers import classification_dataset, tiny_bert, tiny_gpt2
from test_eval_parity import accuracy, pad_collator, token_rows


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


def _trainer(tmp_path, compute_metrics=None, eval_dataset=None, model=None, **kwargs):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to="none",
                                          disable_tqdm=True)
    return hf_lightning.Trainer(model=model or tiny_bert(), args=args, compute_metrics=compute_metrics,
                                eval_dataset=eval_dataset if eval_dataset is not None else classification_dataset(6),
                                **kwargs)


# ----- bad input -----
@pytest.mark.parametrize(("value", "message"), [
    (np.array([0.5, 0.7]), r"'per_class'.*ndarray of shape \(2,\)"),
    ("good", r"'per_class'.*str"),
    ([1, 2], r"'per_class'.*list"),
    (None, r"'per_class'.*NoneType"),
])
def test_non_scalar_or_non_numeric_metric_names_the_key(tmp_path, value, message):
    trainer = _trainer(tmp_path, lambda pred: {"accuracy": 0.5, "per_class": value})
    with pytest.raises(TypeError, match=message):
        trainer.evaluate()


@pytest.mark.parametrize("key", ["loss", "eval_loss", "runtime", "eval_samples_per_second", "steps_per_second",
                                 "model_preparation_time", "epoch", "step"])
def test_metric_colliding_with_a_built_in_key(key):
    with pytest.raises(ValueError, match=f"returned the key '{key}', which collides"):
        check_metrics({"accuracy": 1.0, key: 0.1}, "eval")


def test_metric_values_are_plain_numbers():
    metrics = check_metrics({"a": np.float32(0.5), "b": torch.tensor(3), "c": np.array([2.0]), "eval_d": True}, "eval")
    assert metrics == {"a": 0.5, "b": 3, "c": 2.0, "eval_d": True}
    assert type(metrics["a"]) is float and type(metrics["b"]) is int
    with pytest.raises(TypeError, match="must return a dict"):
        check_metrics([("a", 1.0)], "eval")


def test_labels_missing_when_metrics_need_them(tmp_path):
    trainer = _trainer(tmp_path, accuracy, eval_dataset=classification_dataset(6).remove_columns("label"))
    with pytest.raises(ValueError, match=r"needs labels.*\['labels'\].*columns \['attention_mask', 'input_ids'\]"):
        trainer.evaluate()
    assert trainer.predict(classification_dataset(6).remove_columns("label")).label_ids is None  # fine for predict


def test_eval_dataset_missing_the_model_input_column(tmp_path):
    data = classification_dataset(6).rename_column("input_ids", "tokens")
    trainer = _trainer(tmp_path, accuracy, eval_dataset=data)
    with pytest.raises(ValueError, match=r"no column 'input_ids'.*BertForSequenceClassification.*\['attention_mask', "
                                         r"'labels'\]"):
        trainer.evaluate()
    with pytest.raises(ValueError, match="no column 'input_ids'"):
        trainer.predict(data)


class MetricsFailure(RuntimeError):
    pass


def test_failing_compute_metrics_during_training_keeps_earlier_checkpoints(tmp_path):
    """Save at step 1, evaluate at step 2 with a crashing `compute_metrics`: the user's own exception and frame
    surface, and checkpoint-1 is complete and loadable."""

    def broken_metrics(pred):
        raise MetricsFailure("bad metric code")

    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, save_strategy="steps", save_steps=1, eval_strategy="steps",
        eval_steps=2, per_device_train_batch_size=4, report_to="none", disable_tqdm=True, learning_rate=1e-3)
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(16),
                                   eval_dataset=classification_dataset(4), compute_metrics=broken_metrics)
    with pytest.raises(MetricsFailure, match="bad metric code") as info:
        trainer.train()
    assert any(frame.name == "broken_metrics" for frame in traceback.extract_tb(info.tb))
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith(("checkpoint", "tmp"))) == ["checkpoint-1"]
    checkpoint = tmp_path / "checkpoint-1"
    with open(checkpoint / "trainer_state.json") as f:
        assert json.load(f)["global_step"] == 1
    from transformers import BertForSequenceClassification

    reloaded = BertForSequenceClassification.from_pretrained(checkpoint)
    assert isinstance(torch.load(checkpoint / "optimizer.pt", weights_only=False), dict)
    assert reloaded.config.num_labels == 2


# ----- Lightning's own entry points run the same code -----
def test_lightning_validate_and_predict_give_the_facade_results(tmp_path):
    evals = {"a": classification_dataset(9, seed=1), "b": classification_dataset(5, seed=2)}
    facade = _trainer(tmp_path, accuracy, eval_dataset=evals)
    expected = facade.evaluate()
    expected_pred = facade.predict(evals["a"])

    args = facade.args
    flow = HFTrainerFlow(args)
    module = hf_lightning.TransformerModule(tiny_bert(), args, compute_metrics=accuracy)
    trainer = pl.Trainer(callbacks=[flow], logger=False, enable_progress_bar=False, use_distributed_sampler=False,
                         accelerator="cpu")
    # a plain `validate` logs HF's entries; `flow.evaluate` runs the same and returns the results
    trainer.validate(module, datamodule=TransformerDataModule(eval_dataset=evals, args=args), verbose=False)
    strip = ("_runtime", "_samples_per_second", "_steps_per_second")
    logged = {k: v for entry in flow.state.log_history for k, v in entry.items() if k != "step"}
    assert {k: v for k, v in logged.items() if not k.endswith(strip)} == {
        k: v for k, v in expected.items() if not k.endswith(strip)}
    assert len(flow.state.log_history) == 2
    trainer = pl.Trainer(callbacks=[flow], logger=False, enable_progress_bar=False, use_distributed_sampler=False,
                         accelerator="cpu")
    output = flow.evaluate(trainer, module, TransformerDataModule(eval_dataset=evals, args=args))
    assert list(output.results) == ["a", "b"] and output.results["a"].num_samples == 9
    assert {k: v for k, v in output.metrics.items() if not k.endswith(strip)} == {
        k: v for k, v in expected.items() if not k.endswith(strip)}
    trainer.predict(module, datamodule=TransformerDataModule(predict_dataset=evals["a"], args=args),
                    return_predictions=False)  # a plain `predict` runs too (HF's `on_predict`, no log entry)
    assert len(flow.state.log_history) == 4
    result = flow.predict(trainer, module, TransformerDataModule(predict_dataset=evals["a"], args=args))
    np.testing.assert_array_equal(result.predictions, expected_pred.predictions)
    np.testing.assert_array_equal(result.label_ids, expected_pred.label_ids)
    assert result.metrics.keys() == expected_pred.metrics.keys()


# ----- token-weighted eval loss -----
def test_token_weighted_eval_loss_is_the_mean_over_label_tokens(tmp_path):
    """`eval_loss_weighting="tokens"`: the mean NLL over every label token, whatever the batch size; HF's sample
    weighting of batch means changes with it."""
    rows = token_rows(11, seed=3, causal=True)
    model = tiny_gpt2()
    with torch.no_grad():  # reference: one forward per row, NLL summed over its shifted label tokens
        total, tokens = 0.0, 0
        for ids in rows["input_ids"]:
            out = model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids]))
            total += out.loss.item() * (len(ids) - 1)
            tokens += len(ids) - 1
    losses = {}
    for weighting in ("tokens", "samples"):
        for batch in (2, 5):
            args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=batch,
                                                  report_to="none", disable_tqdm=True)
            trainer = hf_lightning.Trainer(model=model, args=args, eval_dataset=rows, data_collator=pad_collator,
                                           eval_loss_weighting=weighting)
            losses[weighting, batch] = trainer.evaluate()["eval_loss"]
    assert losses["tokens", 2] == pytest.approx(total / tokens, rel=1e-5)
    assert losses["tokens", 5] == pytest.approx(total / tokens, rel=1e-5)
    assert abs(losses["samples", 2] - losses["samples", 5]) > 1e-4
    with pytest.raises(ValueError, match="eval_loss_weighting"):
        hf_lightning.Trainer(model=model, args=args, eval_loss_weighting="words")


# ----- prediction files -----
def test_prediction_files_classification(tmp_path):
    trainer = _trainer(tmp_path, accuracy)
    output = trainer.predict(classification_dataset(7, seed=4))
    path = write_predictions(output, tmp_path / "out")
    assert path == tmp_path / "out" / "predictions.npz"
    arrays = np.load(path)
    assert sorted(arrays.files) == ["label_ids", "predictions"]
    np.testing.assert_array_equal(arrays["predictions"], output.predictions)
    np.testing.assert_array_equal(arrays["label_ids"], output.label_ids)
    rows = pd.read_parquet(path.with_suffix(".parquet"))
    assert list(rows.columns) == ["prediction", "predicted_class", "label"] and len(rows) == 7
    np.testing.assert_allclose(np.stack(rows["prediction"]), output.predictions)
    assert rows["predicted_class"].tolist() == output.predictions.argmax(-1).tolist()
    saved_metrics = json.loads((tmp_path / "out" / "predict_results.json").read_text())
    assert saved_metrics["test_loss"] == output.metrics["test_loss"]
    assert not [p for p in os.listdir(tmp_path / "out") if p.startswith(".")]  # no temporary file left


def test_prediction_files_padded_tuple_and_unlabelled(tmp_path):
    lm = hf_lightning.Trainer(model=tiny_gpt2(), args=hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to="none"), data_collator=pad_collator)
    output = lm.predict(token_rows(6, seed=5, causal=True))
    arrays = np.load(write_predictions(output, tmp_path / "lm", per_sample=False))
    assert arrays["predictions"].shape == output.predictions.shape and (arrays["label_ids"] == -100).any()
    assert not (tmp_path / "lm" / "predictions.parquet").exists()

    tuple_output = type(output)(predictions=(np.ones((3, 2)), np.zeros((3, 4, 5))), label_ids=None, metrics={})
    arrays = np.load(write_predictions(tuple_output, tmp_path / "tuple"))
    assert sorted(arrays.files) == ["predictions_0", "predictions_1"]
    columns = list(pd.read_parquet(tmp_path / "tuple" / "predictions.parquet").columns)
    assert columns == ["prediction", "predicted_class"]
    with pytest.raises(ValueError, match="prediction_loss_only"):
        write_predictions(type(output)(predictions=None, label_ids=None, metrics={}), tmp_path / "none")


# ----- padded concatenation -----
def test_concat_padded_equals_hf_nested_concat():
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(2, w, 3)).astype(np.float32) for w in (4, 6, 5)]
    expected = nested_concat(nested_concat(batches[0], batches[1], -100), batches[2], -100)
    np.testing.assert_array_equal(concat_padded(batches), expected)
    labels = [np.arange(2 * w).reshape(2, w) for w in (3, 1)]
    np.testing.assert_array_equal(concat_padded(labels), nested_concat(labels[0], labels[1], -100))
    pairs = concat_padded([(np.ones(2), np.zeros((2, 2))), (np.ones(1), np.zeros((1, 3)))])
    assert pairs[0].shape == (3,) and pairs[1].shape == (3, 3) and pairs[1][0, 2] == -100
    assert concat_padded([None, None]) is None
