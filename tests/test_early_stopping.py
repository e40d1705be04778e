"""`HFEarlyStopping` (a Lightning callback) stops where `transformers.EarlyStoppingCallback` stops HF's Trainer, checks
its arguments clearly, and keeps its patience counter in Lightning checkpoints."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import transformers

import hf_lightning
from hf_lightning.callbacks.early_stopping import HFEarlyStopping, is_improvement
from hf_lightning.flow.flow import HFTrainerFlow
from hf_lightning.data.datamodule import TransformerDataModule
from helpers import classification_dataset, tiny_bert


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


class ScriptedScore:
    """`compute_metrics` returning the scripted `score`s in turn, then the last one forever."""

    def __init__(self, scores: list[float]) -> None:
        self.scores = scores
        self.calls = 0

    def __call__(self, eval_pred: Any) -> dict[str, float]:
        self.calls += 1
        return {"score": self.scores[min(self.calls, len(self.scores)) - 1]}


COMMON = dict(use_cpu=True, disable_tqdm=True, report_to="none", learning_rate=1e-3, per_device_train_batch_size=4,
              per_device_eval_batch_size=8, max_steps=20, logging_steps=2, eval_strategy="steps", eval_steps=2,
              save_strategy="steps", save_steps=4, metric_for_best_model="score", load_best_model_at_end=True)


def _train(side: str, output_dir: str, callback: Any, scores: list[float], **overrides: Any) -> Any:
    trainer_cls, args_cls = ((transformers.Trainer, transformers.TrainingArguments) if side == "hf"
                             else (hf_lightning.Trainer, hf_lightning.TrainingArguments))
    args = args_cls(output_dir=output_dir, **{**COMMON, **overrides})
    trainer = trainer_cls(model=tiny_bert(), args=args, train_dataset=classification_dataset(20),
                          eval_dataset=classification_dataset(10, seed=1), callbacks=[callback],
                          compute_metrics=ScriptedScore(scores))
    if side == "hf":
        trainer.model_accepts_loss_kwargs = False  # see tests/test_flow.py
    trainer.train()
    return trainer


@pytest.mark.parametrize(("scores", "patience", "threshold", "stop_step"), [
    ([0.5, 0.6, 0.6, 0.55, 0.9], 2, 0.0, 8),  # 0.6, then 0.6 and 0.55 do not improve
    ([0.5, 0.55, 0.58, 0.7, 0.71], 2, 0.06, 6),  # best moves to 0.55, then 0.58: +0.05, +0.03, both under 0.06
])
def test_stops_where_hf_early_stopping_stops(tmp_path, scores, patience, threshold, stop_step):
    ours = _train("ours", str(tmp_path / "ours"), HFEarlyStopping(patience, threshold), scores)
    hf = _train("hf", str(tmp_path / "hf"), transformers.EarlyStoppingCallback(patience, threshold), scores)
    assert ours.state.global_step == hf.state.global_step == stop_step
    def entries(trainer: Any) -> list:
        return [(e["step"], list(e)) for e in trainer.state.log_history]

    assert entries(ours) == entries(hf)
    assert ours.state.best_metric == hf.state.best_metric
    assert os.path.basename(ours.state.best_model_checkpoint) == os.path.basename(hf.state.best_model_checkpoint)
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "hf"))


def test_is_improvement_rule():
    assert is_improvement(0.1, None, True, 0.5)  # no best yet
    assert is_improvement(0.7, 0.5, True, 0.1) and not is_improvement(0.55, 0.5, True, 0.1)
    assert not is_improvement(0.6, 0.5, True, 0.1)  # exactly the threshold is not more than it
    assert is_improvement(0.3, 0.5, False, 0.0) and not is_improvement(0.5, 0.5, False, 0.0)
    assert not is_improvement(float("nan"), 0.5, True, 0.0)


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(metric_for_best_model=None, load_best_model_at_end=False), "requires `metric_for_best_model`"),
    (dict(eval_strategy="no", save_strategy="no", load_best_model_at_end=False), "eval_strategy='no'"),
])
def test_missing_settings_are_clear_errors(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _train("ours", str(tmp_path), HFEarlyStopping(2), [0.5], **overrides)


def test_needs_the_flow_and_valid_arguments(tmp_path):
    with pytest.raises(ValueError, match="early_stopping_patience"):
        HFEarlyStopping(0)
    with pytest.raises(ValueError, match="early_stopping_threshold"):
        HFEarlyStopping(1, -0.1)
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), max_steps=2, eval_strategy="steps",
                                          metric_for_best_model="loss")
    module = hf_lightning.TransformerModule(tiny_bert(), args)
    dm = TransformerDataModule(train_dataset=classification_dataset(8), eval_dataset=classification_dataset(4),
                               args=args)
    trainer = pl.Trainer(callbacks=[HFEarlyStopping(1)], max_steps=2, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, use_distributed_sampler=False)
    with pytest.raises(ValueError, match="needs the `HFTrainerFlow` callback"):
        trainer.fit(module, datamodule=dm)


def test_patience_counter_survives_a_lightning_checkpoint(tmp_path):
    """Run until two evaluations without improvement (patience 3: no stop yet), save a Lightning checkpoint, load it
    into a fresh callback: one more non-improving evaluation then stops training."""
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), max_steps=6, eval_strategy="steps", eval_steps=2, save_strategy="no",
        metric_for_best_model="score", per_device_train_batch_size=4, report_to="none", disable_tqdm=True)
    callback = HFEarlyStopping(3)
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(24),
                                   eval_dataset=classification_dataset(4),
                                   compute_metrics=ScriptedScore([0.5, 0.4, 0.4]),
                                   callbacks=[callback], lightning_kwargs={"enable_checkpointing": False})
    trainer.train()
    assert trainer.state.global_step == 6 and callback.patience_counter == 2
    path = tmp_path / "last.ckpt"
    trainer.lightning_trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["callbacks"][callback.state_key]
    assert callback.state_key.startswith("HFEarlyStopping")
    assert json.loads(json.dumps(saved)) == saved == {
        "patience_counter": 2, "early_stopping_patience": 3, "early_stopping_threshold": 0.0}

    restored = HFEarlyStopping(3)
    restored.load_state_dict(saved)
    flow = HFTrainerFlow(args)
    flow.state.best_metric = 0.5
    restored.on_hf_evaluate(trainer.lightning_trainer, trainer.module, flow, {"eval_score": 0.45})
    assert restored.patience_counter == 3 and flow.control.should_training_stop


def test_patience_and_best_metric_survive_a_real_resume(tmp_path):
    """Resuming from checkpoint-6 (one evaluation without improvement so far) stops at step 8 like the
    uninterrupted run; with the counter or `best_metric` lost it would run on to step 20 (0.9 improves)."""
    import shutil

    scores = [0.5, 0.6, 0.6, 0.55, 0.9]
    full = _train("ours", str(tmp_path / "full"), HFEarlyStopping(2), scores, save_steps=2)
    assert full.state.global_step == 8
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "full" / "checkpoint-6", resumed_dir / "checkpoint-6")
    args = hf_lightning.TrainingArguments(output_dir=str(resumed_dir), **{**COMMON, "save_steps": 2})
    resumed = hf_lightning.Trainer(
        model=tiny_bert(), args=args, train_dataset=classification_dataset(20),
        eval_dataset=classification_dataset(10, seed=1), callbacks=[HFEarlyStopping(2)],
        compute_metrics=ScriptedScore(scores[3:]),  # the evaluations after step 6
    )
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 8
    assert resumed.state.best_metric == full.state.best_metric == 0.6
    assert [e["step"] for e in resumed.state.log_history] == [e["step"] for e in full.state.log_history]
