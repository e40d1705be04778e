"""`evaluate()` / `predict()` equal the real `transformers.Trainer`'s on tiny models (the oracle).

Each case builds the same model twice (same seed) and runs the same evaluation through both trainers: the metric
dicts must have the same keys in the same order and values within 1e-6 (runtime keys excluded, see `RUNTIME`),
`predict()` must give the same arrays (including the -100 padding across batches of different widths), and the
log history must hold the same entries (one per eval dataset, none for `predict`).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from datasets import Dataset

import hf_lightning
from helpers import VOCAB, classification_dataset, tiny_bert, tiny_gpt2

# Wall-clock keys, and HF's `model_preparation_time` (the time accelerate took to wrap the model on a first
# `evaluate()` before any `train()`; hf_lightning has no such step, see README "Evaluation and prediction").
RUNTIME = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


def strip_runtime(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not k.endswith(RUNTIME)}


def assert_same_metrics(ours: dict[str, Any], hf: dict[str, Any]) -> None:
    ours, hf = strip_runtime(ours), strip_runtime(hf)
    assert list(ours) == list(hf)
    for key, value in hf.items():
        assert ours[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key


def assert_same_arrays(ours: Any, hf: Any) -> None:
    if hf is None:
        assert ours is None
        return
    if isinstance(hf, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(hf)
        for a, b in zip(ours, hf):
            assert_same_arrays(a, b)
        return
    assert isinstance(ours, np.ndarray) and ours.shape == hf.shape and ours.dtype == hf.dtype
    np.testing.assert_allclose(ours, hf, rtol=1e-6, atol=1e-6)


def token_rows(n: int, seed: int, num_labels: int = 3, causal: bool = False) -> Dataset:
    """Unpadded rows of 3..12 tokens; token labels (classification) or the ids themselves (causal LM)."""
    rng = random.Random(seed)
    rows: dict[str, list] = {"input_ids": [], "labels": []}
    for _ in range(n):
        ids = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 13))]
        rows["input_ids"].append(ids)
        labels = list(ids) if causal else [i % num_labels for i in ids]
        if not causal:
            labels[0] = -100  # an ignored position inside the sequence, as a word-piece continuation would be
        rows["labels"].append(labels)
    return Dataset.from_dict(rows)


def pad_collator(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pads each batch to its own longest row: batches of different widths, as a tokenizer collator gives."""
    width = max(len(f["input_ids"]) for f in features)
    batch: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": []}
    for f in features:
        pad = width - len(f["input_ids"])
        batch["input_ids"].append(list(f["input_ids"]) + [0] * pad)
        batch["attention_mask"].append([1] * len(f["input_ids"]) + [0] * pad)
        batch["labels"].append(list(f["labels"]) + [-100] * pad)
    return {k: torch.tensor(v) for k, v in batch.items()}


def tiny_token_bert(num_labels: int = 3):
    from transformers import BertConfig, BertForTokenClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=num_labels, pad_token_id=0)
    return BertForTokenClassification(config)


def both(model_fn, output_dir, eval_dataset=None, args_kwargs=None, **trainer_kwargs) -> tuple[Any, Any]:
    """(ours, hf) trainers over the same model weights and arguments."""
    common = dict(output_dir=str(output_dir), use_cpu=True, disable_tqdm=True, report_to="none",
                  per_device_eval_batch_size=4, **(args_kwargs or {}))
    ours = hf_lightning.Trainer(model=model_fn(), args=hf_lightning.TrainingArguments(**common),
                                eval_dataset=eval_dataset, **trainer_kwargs)
    hf = transformers.Trainer(model=model_fn(), args=transformers.TrainingArguments(**common),
                              eval_dataset=eval_dataset, **trainer_kwargs)
    return ours, hf


def accuracy(pred) -> dict[str, float]:
    logits = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
    return {"accuracy": float((logits.argmax(-1) == pred.label_ids).mean())}


def test_sequence_classification_two_eval_datasets_and_predict(tmp_path):
    """A dict of two named eval sets (10 and 7 rows: a short last batch each): `eval_<name>_*` keys, one log entry
    per set at the same step, then `predict()` arrays and `test_` metrics, no log entry added."""
    evals = {"alpha": classification_dataset(10, seed=1), "beta": classification_dataset(7, seed=2)}
    ours, hf = both(tiny_bert, tmp_path, evals, compute_metrics=accuracy)
    ours_metrics, hf_metrics = ours.evaluate(), hf.evaluate()
    assert "eval_alpha_accuracy" in ours_metrics and "eval_beta_loss" in ours_metrics
    assert_same_metrics(ours_metrics, hf_metrics)
    assert len(ours.state.log_history) == len(hf.state.log_history) == 2
    for a, b in zip(ours.state.log_history, hf.state.log_history):
        assert_same_metrics(a, b)
    ours_pred, hf_pred = ours.predict(evals["beta"]), hf.predict(evals["beta"])
    assert_same_arrays(ours_pred.predictions, hf_pred.predictions)
    assert_same_arrays(ours_pred.label_ids, hf_pred.label_ids)
    assert_same_metrics(ours_pred.metrics, hf_pred.metrics)
    assert "epoch" not in ours_pred.metrics and len(ours.state.log_history) == 2  # predict() logs nothing


def test_prefix_inputs_losses_and_accumulation_steps(tmp_path):
    """`metric_key_prefix`, `include_for_metrics=["inputs", "loss"]`, `eval_accumulation_steps` and a metric key
    already carrying the prefix (kept in front, as HF's renaming does)."""
    seen: dict[str, Any] = {}

    def metrics(pred):
        seen.setdefault("shapes", []).append((pred.inputs.shape, pred.losses.shape))
        return {"dev_first": 1.0, "mean_input": float(pred.inputs.mean()), "mean_loss": float(pred.losses.mean()),
                **accuracy(pred)}

    data = classification_dataset(11, seed=3)
    ours, hf = both(tiny_bert, tmp_path, data, compute_metrics=metrics,
                    args_kwargs=dict(include_for_metrics=["inputs", "loss"], eval_accumulation_steps=2))
    assert_same_metrics(ours.evaluate(metric_key_prefix="dev"), hf.evaluate(metric_key_prefix="dev"))
    assert seen["shapes"][0] == seen["shapes"][1] == ((11, 12), (11,))
    assert_same_metrics(ours.predict(data, metric_key_prefix="pred").metrics,
                        hf.predict(data, metric_key_prefix="pred").metrics)


def test_token_classification_pads_across_batches(tmp_path):
    """Batches of different widths: predictions and labels are concatenated with -100 padding on dim 1."""

    def token_accuracy(pred):
        mask = pred.label_ids != -100
        return {"accuracy": float((pred.predictions.argmax(-1)[mask] == pred.label_ids[mask]).mean())}

    data = token_rows(13, seed=4)
    ours, hf = both(tiny_token_bert, tmp_path, data, compute_metrics=token_accuracy, data_collator=pad_collator)
    assert_same_metrics(ours.evaluate(), hf.evaluate())
    ours_pred, hf_pred = ours.predict(data), hf.predict(data)
    assert (hf_pred.predictions == -100).any()  # the case really pads
    assert_same_arrays(ours_pred.predictions, hf_pred.predictions)
    assert_same_arrays(ours_pred.label_ids, hf_pred.label_ids)


def causal_gpt2():
    """GPT-2 with `loss_type="ForCausalLM"`: without it HF 5.23 divides the eval loss by a count that includes label
    position 0 (see tests/test_train_parity.py `gpt2_hf_counts_correctly` and README "Differences")."""
    model = tiny_gpt2()
    model.loss_type = "ForCausalLM"
    return model


def shifted_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`preprocess_logits_for_metrics` for a causal LM: each position's NLL of the next token (0 where ignored)."""
    logits, targets = logits[:, :-1], labels[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets.clamp(min=0), reduction="none")
    return torch.where(targets == -100, torch.zeros_like(nll), nll)


def perplexity(pred) -> dict[str, float]:
    mask = pred.label_ids[:, 1:] != -100
    nll = pred.predictions[:, : mask.shape[1]]
    return {"perplexity": float(np.exp(nll[mask].sum() / mask.sum())), "tokens": int(mask.sum())}


def test_causal_lm_perplexity_with_preprocess_logits(tmp_path):
    """Causal LM on two eval sets with `preprocess_logits_for_metrics` reducing logits to per-token NLL."""
    evals = {"x": token_rows(9, seed=5, causal=True), "y": token_rows(6, seed=6, causal=True)}
    ours, hf = both(causal_gpt2, tmp_path, evals, compute_metrics=perplexity, data_collator=pad_collator,
                    preprocess_logits_for_metrics=shifted_nll)
    ours_metrics, hf_metrics = ours.evaluate(), hf.evaluate()
    assert_same_metrics(ours_metrics, hf_metrics)
    assert ours_metrics["eval_x_perplexity"] > 1.0
    ours_pred, hf_pred = ours.predict(evals["x"]), hf.predict(evals["x"])
    assert ours_pred.predictions.ndim == 2  # the preprocessed values, not the logits
    assert_same_arrays(ours_pred.predictions, hf_pred.predictions)


def test_batch_eval_metrics(tmp_path):
    """`batch_eval_metrics`: called per batch, `compute_result` True on the last one; predict still returns arrays."""

    class Running:
        def __init__(self) -> None:
            self.correct = self.total = 0
            self.calls: list[bool] = []

        def __call__(self, pred, compute_result: bool) -> dict[str, float]:
            self.calls.append(compute_result)
            preds, labels = np.asarray(pred.predictions), np.asarray(pred.label_ids)
            self.correct += int((preds.argmax(-1) == labels).sum())
            self.total += len(labels)
            result = {"accuracy": self.correct / self.total}
            if compute_result:
                self.correct = self.total = 0
            return result

    data = classification_dataset(10, seed=7)
    ours_fn, hf_fn = Running(), Running()
    common = dict(output_dir=str(tmp_path), use_cpu=True, disable_tqdm=True, report_to="none",
                  per_device_eval_batch_size=4, batch_eval_metrics=True)
    ours = hf_lightning.Trainer(model=tiny_bert(), args=hf_lightning.TrainingArguments(**common), eval_dataset=data,
                                compute_metrics=ours_fn)
    hf = transformers.Trainer(model=tiny_bert(), args=transformers.TrainingArguments(**common), eval_dataset=data,
                              compute_metrics=hf_fn)
    assert_same_metrics(ours.evaluate(), hf.evaluate())
    assert ours_fn.calls == hf_fn.calls == [False, False, True]
    ours_pred, hf_pred = ours.predict(data), hf.predict(data)
    assert_same_arrays(ours_pred.predictions, hf_pred.predictions)
    assert_same_metrics(ours_pred.metrics, hf_pred.metrics)


def test_prediction_loss_only_ignore_keys_and_label_names(tmp_path):
    """`prediction_loss_only` gives no arrays and no metrics; `ignore_keys` drops outputs; explicit `label_names`."""

    def bert_with_hidden_states():
        model = tiny_bert()
        model.config.output_hidden_states = True
        return model

    data = classification_dataset(9, seed=8)
    ours, hf = both(bert_with_hidden_states, tmp_path, data, compute_metrics=accuracy,
                    args_kwargs=dict(label_names=["labels"]))
    ours_pred, hf_pred = ours.predict(data), hf.predict(data)
    assert isinstance(hf_pred.predictions, tuple)  # logits plus the hidden states
    assert_same_arrays(ours_pred.predictions, hf_pred.predictions)
    ignore = ["hidden_states"]
    ours_pred, hf_pred = ours.predict(data, ignore_keys=ignore), hf.predict(data, ignore_keys=ignore)
    assert_same_arrays(ours_pred.predictions, hf_pred.predictions)
    assert_same_metrics(ours.evaluate(ignore_keys=["hidden_states"]), hf.evaluate(ignore_keys=["hidden_states"]))

    ours, hf = both(tiny_bert, tmp_path, data, compute_metrics=accuracy, args_kwargs=dict(prediction_loss_only=True))
    ours_pred, hf_pred = ours.predict(data), hf.predict(data)
    assert ours_pred.predictions is None and ours_pred.label_ids is None
    assert_same_metrics(ours_pred.metrics, hf_pred.metrics)
    assert_same_metrics(ours.evaluate(), hf.evaluate())


def test_no_labels_gives_predictions_without_loss(tmp_path):
    """A test set without labels: predictions only, `label_ids` None, no `test_loss`, no metrics."""
    data = classification_dataset(6, seed=9).remove_columns("label")
    ours, hf = both(tiny_bert, tmp_path, compute_metrics=accuracy)
    ours_pred, hf_pred = ours.predict(data), hf.predict(data)
    assert ours_pred.label_ids is None and hf_pred.label_ids is None
    assert_same_arrays(ours_pred.predictions, hf_pred.predictions)
    assert_same_metrics(ours_pred.metrics, hf_pred.metrics)


def test_after_training_the_eval_entries_match(tmp_path):
    """Evaluation during training (2 updates, eval every update) gives the same entries, with `epoch` and `step`."""
    common = dict(output_dir=str(tmp_path), use_cpu=True, disable_tqdm=True, report_to="none",
                  per_device_eval_batch_size=4, per_device_train_batch_size=4, max_steps=2, eval_strategy="steps",
                  eval_steps=1, save_strategy="no", learning_rate=1e-3)
    train, evals = classification_dataset(8), {"a": classification_dataset(5, seed=1), "b": classification_dataset(6)}
    ours = hf_lightning.Trainer(model=tiny_bert(), args=hf_lightning.TrainingArguments(**common), train_dataset=train,
                                eval_dataset=evals, compute_metrics=accuracy)
    hf = transformers.Trainer(model=tiny_bert(), args=transformers.TrainingArguments(**common), train_dataset=train,
                              eval_dataset=evals, compute_metrics=accuracy)
    hf.model_accepts_loss_kwargs = False  # see tests/test_flow.py: BERT's loss ignores num_items_in_batch
    ours.train()
    hf.train()
    ours_evals = [e for e in ours.state.log_history if any(k.startswith("eval_") for k in e)]
    hf_evals = [e for e in hf.state.log_history if any(k.startswith("eval_") for k in e)]
    assert len(ours_evals) == len(hf_evals) == 4
    for a, b in zip(ours_evals, hf_evals):
        assert_same_metrics(a, b)


def test_eval_do_concat_batches_false(tmp_path):
    """`eval_do_concat_batches=False`: per-batch arrays in a list, for predictions and labels (token widths differ)."""
    data = token_rows(7, seed=10)
    ours, hf = both(tiny_token_bert, tmp_path, data, data_collator=pad_collator,
                    args_kwargs=dict(eval_do_concat_batches=False))
    ours_pred, hf_pred = ours.predict(data), hf.predict(data)
    assert isinstance(hf_pred.predictions, list) and len(hf_pred.predictions) == 2
    assert_same_arrays(ours_pred.predictions, hf_pred.predictions)
    assert_same_arrays(ours_pred.label_ids, hf_pred.label_ids)
    assert_same_metrics(ours_pred.metrics, hf_pred.metrics)
