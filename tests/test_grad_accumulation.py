"""Gradient accumulation is token-correct: GA=4 x batch 2 gives the gradients of GA=1 x batch 8, for every model.

Gradients are captured in a Lightning callback's `on_before_optimizer_step` (after the whole window's backward
passes, before clipping) inside a real `fit`, with `learning_rate=0` so every update sees the same weights and the
windows of both runs can be compared with a plain full-batch forward/backward of the same samples.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from lightning.pytorch.callbacks import Callback

import hf_lightning
from helpers import classification_dataset, lm_dataset, tiny_bert, tiny_gpt2

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


class GradCapture(Callback):
    """Records, per optimizer update, the number of micro-batches in the window and every parameter's gradient."""

    def __init__(self) -> None:
        self.window_sizes: list[int] = []
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.window_sizes.append(len(batch))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.grads.append(
            {n: p.grad.detach().clone() for n, p in pl_module.model.named_parameters() if p.grad is not None}
        )


def run_ours(model, dataset, tmp_path, batch_size: int, ga: int, **extra):
    capture = GradCapture()
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path / f"bs{batch_size}_ga{ga}"), per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=ga, num_train_epochs=1, learning_rate=0.0, logging_steps=1, save_strategy="no",
        train_sampling_strategy="sequential", optim="adamw_torch", **extra,
    )
    trainer = hf_lightning.Trainer(
        model=model, args=args, train_dataset=dataset, callbacks=[capture], lightning_kwargs=dict(LIGHTNING_KWARGS)
    )
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return capture, losses


def reference_window(model, dataset, start: int, stop: int):
    """Loss and gradients of one plain forward/backward over samples `start:stop` (the whole window at once)."""
    model = copy.deepcopy(model)
    model.train()
    rows = dataset[start:stop]
    batch = {k: torch.tensor(v) for k, v in rows.items()}
    if "label" in batch:
        batch["labels"] = batch.pop("label")
    loss = model(**batch).loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "make_model, make_data",
    [
        pytest.param(lambda: tiny_gpt2(dropout=0.0), lambda: lm_dataset(n=20, padded=True), id="gpt2-padded"),
        pytest.param(lambda: tiny_bert(dropout=0.0), lambda: classification_dataset(n=20), id="bert-classifier"),
    ],
)
def test_ga4_bs2_equals_ga1_bs8_including_short_last_window(make_model, make_data, tmp_path):
    model, dataset = make_model(), make_data()
    if "labels" in dataset.column_names:  # the LM rows really have different numbers of label tokens
        counts = {sum(t != -100 for t in row) for row in dataset["labels"]}
        assert len(counts) > 3
    small, small_losses = run_ours(copy.deepcopy(model), dataset, tmp_path, batch_size=2, ga=4)
    big, big_losses = run_ours(copy.deepcopy(model), dataset, tmp_path, batch_size=8, ga=1)

    # 20 samples: 10 micro-batches of 2 -> windows of 4, 4 and 2 micro-batches; batch 8 -> 8, 8, 4 samples
    assert small.window_sizes == [4, 4, 2]
    assert big.window_sizes == [1, 1, 1]
    assert len(small.grads) == len(big.grads) == 3
    for update, (start, stop) in enumerate([(0, 8), (8, 16), (16, 20)]):
        assert_grads_close(small.grads[update], big.grads[update])
        # both equal one plain backward of the whole window: the short last window is normalised by its real
        # size (classifier) / label-token count (LM), not by gradient_accumulation_steps
        ref_loss, ref_grads = reference_window(model, dataset, start, stop)
        assert_grads_close(small.grads[update], ref_grads)
        assert small_losses[update] == pytest.approx(ref_loss, rel=1e-5)
        assert big_losses[update] == pytest.approx(ref_loss, rel=1e-5)


def test_short_last_window_is_not_divided_by_ga(tmp_path):
    """The last window (2 of GA=4 micro-batches) logs the real mean, not half of it (Lightning's GA rule)."""
    model, dataset = tiny_bert(dropout=0.0), classification_dataset(n=20)
    capture, losses = run_ours(copy.deepcopy(model), dataset, tmp_path, batch_size=2, ga=4)
    ref_loss, _ = reference_window(model, dataset, 16, 20)
    assert capture.window_sizes[-1] == 2
    assert losses[-1] == pytest.approx(ref_loss, rel=1e-5)
    assert losses[-1] != pytest.approx(ref_loss * 2 / 4, rel=1e-2)


def test_hf_trainer_bert_loss_grows_with_ga_while_ours_does_not(tmp_path):
    """Documents the HF difference: BERT classifiers accept `**kwargs` but ignore `num_items_in_batch`, so the real
    `transformers.Trainer` neither divides their loss by GA nor normalises it: GA=2 logs twice the GA=1 loss (and
    gradient norm). Ours logs the same loss for both."""
    model, dataset = tiny_bert(dropout=0.0), classification_dataset(n=16)
    common = dict(
        learning_rate=0.0, max_steps=2, logging_steps=1, train_sampling_strategy="sequential", optim="adamw_torch",
        save_strategy="no", seed=0,
    )

    def hf_logs(batch_size: int, ga: int) -> list[dict]:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / f"hf{ga}"), use_cpu=True, disable_tqdm=True, report_to="none",
            per_device_train_batch_size=batch_size, gradient_accumulation_steps=ga, **common,
        )
        trainer = transformers.Trainer(model=copy.deepcopy(model), args=args, train_dataset=dataset)
        trainer.train()
        return [e for e in trainer.state.log_history if "loss" in e]

    def our_logs(batch_size: int, ga: int) -> list[dict]:
        args = hf_lightning.TrainingArguments(
            output_dir=str(tmp_path / f"ours{ga}"), per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=ga, **common,
        )
        trainer = hf_lightning.Trainer(
            model=copy.deepcopy(model), args=args, train_dataset=dataset, lightning_kwargs=dict(LIGHTNING_KWARGS)
        )
        trainer.train()
        return [e for e in trainer.state.log_history if "loss" in e]

    hf_ga1, hf_ga2 = hf_logs(8, 1), hf_logs(4, 2)
    ours_ga1, ours_ga2 = our_logs(8, 1), our_logs(4, 2)
    for step in range(2):
        assert hf_ga2[step]["loss"] == pytest.approx(2 * hf_ga1[step]["loss"], rel=1e-5)
        assert hf_ga2[step]["grad_norm"] == pytest.approx(2 * hf_ga1[step]["grad_norm"], rel=1e-4)
        assert ours_ga2[step]["loss"] == pytest.approx(ours_ga1[step]["loss"], rel=1e-5)
        assert ours_ga2[step]["grad_norm"] == pytest.approx(ours_ga1[step]["grad_norm"], rel=1e-4)
        # at GA=1 there is nothing to accumulate: both trainers agree
        assert ours_ga1[step]["loss"] == pytest.approx(hf_ga1[step]["loss"], rel=1e-5)


def test_micro_batch_without_label_tokens_contributes_nothing(tmp_path):
    """A micro-batch whose labels are all -100 (e.g. a prompt-only row) has a NaN mean loss (0/0) in the model; its
    share of the window is 0, so the window loss and gradients stay those of the other micro-batches (HF's sum / N).
    Regression: the NaN made the logged loss of the update 0.0 (dropped by the NaN filter)."""
    from datasets import Dataset

    rows = lm_dataset(n=8).to_dict()
    rows["labels"][1] = [-100] * len(rows["labels"][1])
    dataset = Dataset.from_dict(rows)
    model = tiny_gpt2(dropout=0.0)
    model.loss_type = "ForCausalLM"  # HF counts shifted labels for it (see test_train_parity.py)
    common = dict(
        per_device_train_batch_size=1, gradient_accumulation_steps=2, max_steps=4, logging_steps=1,
        train_sampling_strategy="sequential", save_strategy="no", optim="adamw_torch", learning_rate=1e-3,
    )
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, report_to="none", **common)
    hf = transformers.Trainer(model=copy.deepcopy(model), args=hf_args, train_dataset=dataset)
    hf.train()
    ours = hf_lightning.Trainer(
        model=copy.deepcopy(model), args=hf_lightning.TrainingArguments(output_dir=str(tmp_path / "ours"), **common),
        train_dataset=dataset, lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    ours.train()
    hf_logs = [e for e in hf.state.log_history if "loss" in e]
    our_logs = [e for e in ours.state.log_history if "loss" in e]
    ref_loss, _ = reference_window(model, dataset, 0, 2)  # the model's own mean over the window's label tokens
    assert our_logs[0]["loss"] == pytest.approx(ref_loss, rel=1e-5)
    for hf_entry, our_entry in zip(hf_logs, our_logs, strict=True):
        assert our_entry["loss"] == pytest.approx(hf_entry["loss"], rel=1e-5)
        assert our_entry["grad_norm"] == pytest.approx(hf_entry["grad_norm"], rel=1e-5)
