"""Non-finite and empty training losses, against the real `transformers.Trainer` (the oracle).

A model whose loss *value* is NaN on batches holding a marked row (the gradient stays the finite one of the real
loss, so the weights are the same in both trainers and later losses are finite) shows:
- `logging_nan_inf_filter=True`: a window whose every micro-batch loss is NaN logs 0.0 in both trainers; ours also
  warns once, naming the step;
- `logging_nan_inf_filter=False`: both log NaN for that window; HF's running sum stays NaN for every later log
  (`tr_loss -= tr_loss` on NaN is NaN), ours starts the next window from zero (README "Differences").
An update whose labels are all -100 is warned about once, naming the step.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
import transformers
from datasets import Dataset
from torch import nn

import hf_lightning
from helpers import lm_dataset, tiny_bert, tiny_gpt2

MARK = 1  # first token of a marked row (other rows use ids >= 6)


class NaNLossOnMarkedRows(nn.Module):
    """A tiny BERT classifier whose loss value is NaN when the batch has a marked row; gradients stay finite."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_bert()

    def forward(self, input_ids, attention_mask=None, labels=None):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        marked = (input_ids[:, 0] == MARK).any()
        nan = torch.where(marked, torch.tensor(float("nan")), torch.tensor(0.0))  # a constant: no gradient
        return {"loss": out.loss + nan, "logits": out.logits}


def _dataset(marked_rows: int) -> Dataset:
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    for i in range(16):
        ids = [(7 * i + j) % 58 + 6 for j in range(8)]
        if i < marked_rows:
            ids[0] = MARK
        rows["input_ids"].append(ids)
        rows["attention_mask"].append([1] * 8)
        rows["labels"].append(i % 2)
    return Dataset.from_dict(rows)


ARGS = dict(per_device_train_batch_size=2, max_steps=8, logging_steps=2, learning_rate=1e-3, save_strategy="no",
            train_sampling_strategy="sequential", report_to="none", disable_tqdm=True, optim="adamw_torch",
            remove_unused_columns=False, seed=1)


def _losses(output_dir, marked_rows: int, nan_filter: bool) -> tuple[list[float], list[float]]:
    settings = dict(ARGS, logging_nan_inf_filter=nan_filter)
    torch.manual_seed(0)
    ours = hf_lightning.Trainer(model=NaNLossOnMarkedRows(), args=hf_lightning.TrainingArguments(
        output_dir=str(output_dir / "ours"), **settings), train_dataset=_dataset(marked_rows),
        lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False})
    ours.train()
    torch.manual_seed(0)
    hf = transformers.Trainer(model=NaNLossOnMarkedRows(), args=transformers.TrainingArguments(
        output_dir=str(output_dir / "hf"), use_cpu=True, **settings), train_dataset=_dataset(marked_rows))
    hf.train()
    return ([e["loss"] for e in ours.state.log_history if "loss" in e],
            [e["loss"] for e in hf.state.log_history if "loss" in e])


def test_without_the_filter_a_nan_window_stays_nan_in_hf_and_not_in_ours(tmp_path, one_thread):
    ours, hf = _losses(tmp_path, marked_rows=1, nan_filter=False)  # the first update (rows 0-1) is NaN
    assert math.isnan(ours[0]) and math.isnan(hf[0])
    assert all(math.isnan(v) for v in hf[1:])  # HF: NaN forever after
    assert all(math.isfinite(v) for v in ours[1:])  # ours: the next windows are the real losses
    with_filter, _ = _losses(tmp_path / "filtered", marked_rows=1, nan_filter=True)
    # the windows after the NaN one hold the same updates in both runs: the same values as with the filter
    assert ours[1:] == pytest.approx(with_filter[1:], rel=1e-6)


def test_a_window_of_only_nan_losses_logs_zero_like_hf_and_warns_once(tmp_path, caplog, one_thread):
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        ours, hf = _losses(tmp_path, marked_rows=4, nan_filter=True)  # updates 1-2 (rows 0-3): all NaN
    assert ours[0] == hf[0] == 0.0 and ours[1:] == pytest.approx(hf[1:], rel=1e-5)
    warnings = [r.getMessage() for r in caplog.records if "was NaN or Inf" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("step 2: every training loss of the logging window "
                                                         "(steps 1-2) was NaN or Inf")


def test_an_update_without_label_tokens_is_warned_once(tmp_path, caplog, one_thread):
    rows = lm_dataset(n=16, seed=2).to_dict()
    for i in (4, 5, 6, 7):  # update 2 (GA 2 x batch 2, sequential): every label -100
        rows["labels"][i] = [-100] * len(rows["labels"][i])
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=4,
        logging_steps=2, save_strategy="no", train_sampling_strategy="sequential", report_to="none",
        disable_tqdm=True)
    trainer = hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=Dataset.from_dict(rows),
                                   lightning_kwargs={"accelerator": "cpu", "logger": False,
                                                     "enable_progress_bar": False})
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "had no label token" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("step 2: an update in steps 1-2 had no label token")
