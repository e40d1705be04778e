"""HF `TrainerCallback`s run unchanged: same event sequence, same keyword arguments, same early stop as HF.

A recording callback is passed in `callbacks=` to the real `transformers.Trainer` and to `hf_lightning.Trainer` for the
same run (GA=2 with a short last window, evaluation and saves by steps, then `evaluate()` and `predict()`); the event
names must come in the same order, each with the same keyword arguments set. `EarlyStoppingCallback` must stop both
at the same step, with the same history, checkpoints, best checkpoint and exported callback state.
"""

from __future__ import annotations

import json
import os
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import transformers

import hf_lightning
from helpers import classification_dataset, tiny_bert

EVENTS = (
    "on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin",
    "on_pre_optimizer_step", "on_optimizer_step", "on_substep_end", "on_step_end", "on_evaluate", "on_predict",
    "on_save", "on_log", "on_prediction_step",
)
HANDLER_KWARGS = {"model", "processing_class", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


class Recorder(transformers.TrainerCallback):
    """Records `(event, global_step, keyword arguments that are set)` for every event."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, tuple[str, ...]]] = []
        self.kwarg_names: dict[str, set[str]] = {}


def _recording(name: str):
    def method(self: Recorder, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        set_kwargs = tuple(sorted(k for k, v in kwargs.items() if v is not None))
        self.events.append((name, state.global_step, set_kwargs))
        self.kwarg_names.setdefault(name, set()).update(kwargs)

    return method


for _event in EVENTS:
    setattr(Recorder, _event, _recording(_event))


COMMON = dict(
    use_cpu=True, disable_tqdm=True, report_to="none", learning_rate=1e-3, per_device_train_batch_size=4,
    per_device_eval_batch_size=8,
)


def _run(trainer_cls: Any, args_cls: Any, output_dir: str, callbacks: list, compute_metrics=None,
         eval_dataset: Any = None, **kwargs: Any):
    args = args_cls(output_dir=output_dir, **COMMON, **kwargs)
    trainer = trainer_cls(
        model=tiny_bert(), args=args, train_dataset=classification_dataset(20),
        eval_dataset=eval_dataset if eval_dataset is not None else classification_dataset(10, seed=1),
        callbacks=callbacks, compute_metrics=compute_metrics,
    )
    if isinstance(trainer, transformers.Trainer):
        trainer.model_accepts_loss_kwargs = False  # see tests/test_flow.py
    trainer.train()
    return trainer


STEPS_RUN = dict(gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2, eval_strategy="steps",
                 eval_steps=2, save_strategy="steps", save_steps=3)
EPOCH_RUN = dict(gradient_accumulation_steps=3, num_train_epochs=1.5, logging_strategy="epoch", eval_strategy="epoch",
                 save_strategy="epoch", eval_on_start=True, logging_first_step=True)


@pytest.mark.parametrize("run_kwargs", [STEPS_RUN, EPOCH_RUN], ids=["steps", "epoch-eval_on_start-two_eval_sets"])
def test_recorded_event_sequence_matches_hf(tmp_path, run_kwargs):
    if run_kwargs is EPOCH_RUN:  # one `evaluate()` per dataset: prediction steps, on_log, on_evaluate, then the next
        run_kwargs = dict(run_kwargs, eval_dataset={"x": classification_dataset(10, seed=1),
                                                    "y": classification_dataset(9, seed=3)})
    hf_rec, our_rec = Recorder(), Recorder()
    hf = _run(transformers.Trainer, transformers.TrainingArguments, str(tmp_path / "hf"), [hf_rec], **run_kwargs)
    ours = _run(hf_lightning.Trainer, hf_lightning.TrainingArguments, str(tmp_path / "ours"), [our_rec],
                **run_kwargs)
    test_set = classification_dataset(10, seed=2)
    for trainer in (hf, ours):
        trainer.evaluate()
        trainer.predict(test_set)

    hf_names = [(name, step) for name, step, _ in hf_rec.events]
    our_names = [(name, step) for name, step, _ in our_rec.events]
    assert our_names == hf_names
    if run_kwargs is STEPS_RUN:
        # 5 micro-batches per epoch with GA=2: two `on_substep_end` per epoch (the last window has one batch).
        assert sum(name == "on_substep_end" for name, _ in our_names) == 4
        assert our_names[-3:] == [("on_prediction_step", 6), ("on_prediction_step", 6), ("on_predict", 6)]
    # The same keyword arguments are set at every event (model, optimizer, scheduler, loaders, metrics=, logs=).
    assert [kw for *_, kw in our_rec.events] == [kw for *_, kw in hf_rec.events]
    for name, names in our_rec.kwarg_names.items():
        assert HANDLER_KWARGS <= names, name
    assert "metrics" in our_rec.kwarg_names["on_evaluate"] and "metrics" in our_rec.kwarg_names["on_predict"]
    assert "logs" in our_rec.kwarg_names["on_log"]


class ScriptedScore:
    """`compute_metrics` returning a scripted `score` per evaluation: 0.5, 0.6, 0.6, 0.55, then 0.9 forever."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, eval_pred: Any) -> dict[str, float]:
        scores = [0.5, 0.6, 0.6, 0.55]
        self.calls += 1
        return {"score": scores[self.calls - 1] if self.calls <= len(scores) else 0.9}


def test_early_stopping_callback_stops_at_the_same_step(tmp_path):
    """Patience 2 stops at the 4th evaluation (score 0.6 then 0.6 and 0.55 do not improve)."""
    run_kwargs = dict(max_steps=20, logging_steps=2, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                      save_steps=4, metric_for_best_model="score", load_best_model_at_end=True)
    trainers = {}
    for side, trainer_cls, args_cls in (("hf", transformers.Trainer, transformers.TrainingArguments),
                                        ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments)):
        callback = transformers.EarlyStoppingCallback(early_stopping_patience=2)
        trainers[side] = _run(trainer_cls, args_cls, str(tmp_path / side), [callback], ScriptedScore(), **run_kwargs)
    hf, ours = trainers["hf"], trainers["ours"]
    assert ours.state.global_step == hf.state.global_step == 8
    assert [e["step"] for e in ours.state.log_history] == [e["step"] for e in hf.state.log_history]
    assert [list(e) for e in ours.state.log_history] == [list(e) for e in hf.state.log_history]
    assert os.path.basename(ours.state.best_model_checkpoint) == os.path.basename(hf.state.best_model_checkpoint)
    assert ours.state.best_metric == hf.state.best_metric == 0.6
    for side in ("hf", "ours"):
        assert sorted(os.listdir(tmp_path / side)) == ["checkpoint-4", "checkpoint-8"]

    def exported(side: str) -> dict:
        with open(tmp_path / side / "checkpoint-8" / "trainer_state.json") as f:
            return json.load(f)["stateful_callbacks"]

    assert exported("ours") == exported("hf")


class _EvaluateAt(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            control.should_evaluate = True


@pytest.mark.parametrize("side", ["hf", "ours"])
def test_should_evaluate_without_eval_dataset_raises_like_hf(tmp_path, side):
    trainer_cls, args_cls = ((transformers.Trainer, transformers.TrainingArguments) if side == "hf"
                             else (hf_lightning.Trainer, hf_lightning.TrainingArguments))
    args = args_cls(output_dir=str(tmp_path), max_steps=3, save_strategy="no", **COMMON)
    trainer = trainer_cls(model=tiny_bert(), args=args, train_dataset=classification_dataset(16),
                          callbacks=[_EvaluateAt()])
    with pytest.raises(ValueError, match="evaluation requires an eval_dataset"):
        trainer.train()


def test_a_returned_control_replaces_it_for_later_callbacks_and_the_trainer(tmp_path):
    """HF's handler: a non-None return value becomes the control object from then on."""

    class Replace(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                fresh = transformers.TrainerControl()
                fresh.should_training_stop = True
                return fresh
            return None

    seen = []

    class Later(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append((state.global_step, control.should_training_stop))

    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), max_steps=5, save_strategy="no", **COMMON)
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(32),
                                   callbacks=[Replace(), Later()])
    trainer.train()
    assert seen == [(1, False), (2, True)]
    assert trainer.state.global_step == 2


class _CountingLightningCallback(pl.Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.batches += 1


def test_add_pop_and_remove_callback_for_both_kinds(tmp_path):
    """HF's `add_callback` / `pop_callback` / `remove_callback`, by class or instance, for HF and Lightning callbacks."""
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), max_steps=3, save_strategy="no", **COMMON)
    kept, popped = Recorder(), Recorder()
    kept_pl, removed_pl = _CountingLightningCallback(), _CountingLightningCallback()
    trainer = hf_lightning.Trainer(
        model=tiny_bert(), args=args, train_dataset=classification_dataset(n=16),
        lightning_kwargs={"enable_progress_bar": False, "logger": False},
    )
    trainer.add_callback(kept)
    trainer.add_callback(popped)
    trainer.add_callback(kept_pl)
    trainer.add_callback(removed_pl)
    assert trainer.pop_callback(popped) is popped  # by instance
    assert trainer.pop_callback(popped) is None
    trainer.remove_callback(removed_pl)
    assert trainer.pop_callback(hf_lightning.TrainingArguments) is None  # not a callback class held: None, as HF
    trainer.train()
    assert [e[0] for e in kept.events].count("on_step_end") == 3
    assert popped.events == []
    assert (kept_pl.batches, removed_pl.batches) == (3, 0)
    assert trainer.pop_callback(Recorder) is kept  # by class
    assert trainer.pop_callback(_CountingLightningCallback) is kept_pl
