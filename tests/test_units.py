"""Direct tests of modules otherwise reached only end to end: the training-loss bookkeeping, label-token counting,
`lightning_state.pt`, `CheckpointRestorer`, the evaluation run, the flow's contracts, the final save."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from helpers import classification_dataset, lm_dataset, tiny_bert, tiny_gpt2
from safetensors.torch import load_file

import hf_lightning
from hf_lightning import HFTrainerFlow, TransformerDataModule, TransformerModule
from hf_lightning.checkpoint.final_model import save_final_model
from hf_lightning.checkpoint.lightning_state import capture_lightning_state, restore_callback_states
from hf_lightning.checkpoint.restore import CheckpointRestorer
from hf_lightning.contracts import check_flow_contracts
from hf_lightning.flow.train_log import TrainLossTracker
from hf_lightning.module.eval_run import EvaluationRun
from hf_lightning.module.evaluation import EvalRequest, EvalSettings, EvalStep
from hf_lightning.module.loss import count_label_tokens


# ----- TrainLossTracker -----
def test_train_loss_tracker_window_mean_filter_and_total():
    tracker = TrainLossTracker(nan_inf_filter=True)
    tracker.start(torch.device("cpu"), global_step=10)
    assert tracker.last_logged_step == tracker.initial_step == 10
    tracker.add(torch.tensor([1.0, 3.0]), global_step_before=10)  # one update of two micro-batches
    # a non-finite micro-batch loss becomes the window's running mean per update: 4 / (1 + 11 - 10) = 2
    tracker.add(torch.tensor([float("nan")]), global_step_before=11)
    assert tracker.pop_log_value(None, global_step=12) == pytest.approx(6.0 / 2)
    assert tracker.latest_loss == pytest.approx(3.0) and tracker.last_logged_step == 12
    tracker.add(torch.tensor([2.0]), global_step_before=12)
    tracker.add(torch.tensor([4.0]), global_step_before=13)
    # train_loss: everything since `start` (the logged 6 and the open window's 6) per update
    assert tracker.train_loss(None, global_step=14) == pytest.approx(12.0 / 4)


def test_train_loss_tracker_without_filter_keeps_the_nan():
    tracker = TrainLossTracker(nan_inf_filter=False)
    tracker.start(torch.device("cpu"), global_step=0)
    tracker.add(torch.tensor([1.0, float("inf")]), global_step_before=0)
    assert math.isinf(tracker.pop_log_value(None, global_step=1))


# ----- count_label_tokens -----
def test_count_label_tokens():
    labels = torch.tensor([[5, 6, -100, -100], [-100, 7, 8, 9]])
    assert int(count_label_tokens({"labels": labels}, shift=False)) == 5
    assert int(count_label_tokens({"labels": labels}, shift=True)) == 4  # position 0 is never predicted
    assert int(count_label_tokens({"labels": torch.tensor([1, 0, -100])}, shift=True)) == 2  # 1-D: no shift
    shifted = torch.tensor([[6, -100, -100, -100]])
    assert int(count_label_tokens({"labels": labels, "shift_labels": shifted}, shift=True)) == 1  # the collator's
    assert count_label_tokens({"input_ids": labels}, shift=False) is None
    assert count_label_tokens({"labels": [1, 2]}, shift=False) is None  # not a tensor: nothing to count


# ----- lightning_state.pt -----
class _Counter(pl.Callback):
    """A stateful Lightning callback: counts updates."""

    def __init__(self, name: str = "a") -> None:
        self.name, self.count = name, 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(name=self.name)

    def on_train_batch_end(self, *args) -> None:
        self.count += 1

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state_dict: dict) -> None:
        self.count = state_dict["count"]


class _Capture(pl.Callback):
    """Takes `capture_lightning_state` after update `at` (placed after the counter)."""

    def __init__(self, at: int, skip: tuple = ()) -> None:
        self.at, self.skip, self.captured = at, skip, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.at:
            self.captured = {ending: capture_lightning_state(trainer, ending, self.skip) for ending in (False, True)}


def _fit_tiny_bert(tmp_path, callbacks_after_flow):
    """3 updates of a tiny BERT under the flow; `callbacks_after_flow(flow)` gives the other callbacks."""
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), max_steps=3, save_strategy="no",
                                          per_device_train_batch_size=4, report_to="none", use_cpu=True)
    flow = HFTrainerFlow(args)
    trainer = pl.Trainer(callbacks=[flow, *callbacks_after_flow(flow)], accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, use_distributed_sampler=False,
                         default_root_dir=str(tmp_path))
    trainer.fit(TransformerModule(tiny_bert(), args), datamodule=TransformerDataModule(
        train_dataset=classification_dataset(16), args=args))


def test_capture_and_restore_lightning_state(tmp_path, one_thread):
    counter, captures = _Counter(), []
    _fit_tiny_bert(tmp_path, lambda flow: [counter, *captures.__iadd__([_Capture(2), _Capture(2, skip=(flow,))])])
    everything, skipping = captures
    state = skipping.captured[False]
    assert state["global_step"] == 2 and state["epoch"] == 0 and state["windows_done"] == 2
    assert state["epoch_finished"] is False and skipping.captured[True]["epoch_finished"] is True
    assert state["world_size"] == 1 and state["callbacks"] == {counter.state_key: {"count": 2}}
    assert set(everything.captured[False]["callbacks"]) == {counter.state_key, "HFTrainerFlow"}

    # restoring: each callback by its key; a key saved under other settings falls back to the one of its class
    restored, renamed = _Counter(), _Counter("b")
    restore_callback_states(pl.Trainer(callbacks=[restored], accelerator="cpu", logger=False), state)
    assert restored.count == 2
    restore_callback_states(pl.Trainer(callbacks=[renamed], accelerator="cpu", logger=False), state)
    assert renamed.count == 2
    ambiguous = [_Counter("c"), _Counter("d")]
    states = {"callbacks": {**state["callbacks"], "_Counter{'name': 'e'}": {"count": 9}}}
    restore_callback_states(pl.Trainer(callbacks=list(ambiguous), accelerator="cpu", logger=False), states)
    assert [cb.count for cb in ambiguous] == [0, 0]  # two candidates of the class: none is taken


# ----- CheckpointRestorer -----
class _Stop(Exception):
    pass


class _RestoreAtFitStart(pl.Callback):
    """Runs a `CheckpointRestorer` by hand after the flow's `on_fit_start`, records what it restored, stops."""

    def __init__(self, restorer: CheckpointRestorer) -> None:
        self.restorer, self.seen = restorer, {}

    def on_fit_start(self, trainer, pl_module) -> None:
        flow = next(cb for cb in trainer.callbacks if isinstance(cb, HFTrainerFlow))
        self.restorer.on_fit_start(trainer, pl_module, updates_per_epoch=5)
        restored = self.restorer.restore_trainer_state(trainer, flow.plan, flow.handler, flow.control)
        self.restorer.on_train_epoch_start(trainer)  # mid-epoch: nothing yet (HF loads after the first window's fetch)
        before = (random.random(), float(np.random.rand()), float(torch.rand(())))
        self.restorer.on_train_batch_start()
        self.seen = {
            "weights": {k: v.clone() for k, v in pl_module.model.state_dict().items()},
            "optimizer_steps": {s["step"].item() for s in trainer.optimizers[0].state_dict()["state"].values()},
            "scheduler_epoch": trainer.lr_scheduler_configs[0].scheduler.last_epoch,
            "global_step": trainer.global_step, "epoch": trainer.current_epoch,
            "resume_position": trainer.datamodule.resume_position, "position": self.restorer.position,
            "state": restored.state, "rng": (random.random(), float(np.random.rand()), float(torch.rand(()))),
            "rng_before": before,
        }
        raise _Stop


def test_checkpoint_restorer_restores_each_part(tmp_path, one_thread):
    """A checkpoint at update 3 (mid-epoch: 5 updates per epoch): weights, optimizer and scheduler state, the
    loop position, the sampler's start, the HF state and the RNG all come back, step by step."""
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=10, save_strategy="steps", save_steps=3, logging_steps=1,
        per_device_train_batch_size=2, report_to="none", use_cpu=True, disable_tqdm=True)
    hf_lightning.Trainer(model=tiny_gpt2(dropout=0.1), args=args, train_dataset=lm_dataset(n=10)).train()
    checkpoint = tmp_path / "run" / "checkpoint-3"
    rng = torch.load(checkpoint / "rng_state.pth", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.random.set_rng_state(rng["cpu"])
    expected_rng = (random.random(), float(np.random.rand()), float(torch.rand(())))

    fresh = dataclasses.replace(args, output_dir=str(tmp_path / "fresh"))
    restorer = CheckpointRestorer(str(checkpoint), fresh)
    probe = _RestoreAtFitStart(restorer)
    trainer = pl.Trainer(callbacks=[HFTrainerFlow(fresh), probe], accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, use_distributed_sampler=False)
    with pytest.raises(_Stop):
        trainer.fit(TransformerModule(tiny_gpt2(seed=9), fresh),
                    datamodule=TransformerDataModule(train_dataset=lm_dataset(n=10), args=fresh))
    seen = probe.seen
    saved = load_file(str(checkpoint / "model.safetensors"))
    assert all(torch.equal(seen["weights"][k], saved[k]) for k in saved)
    assert seen["optimizer_steps"] == {3.0} and seen["scheduler_epoch"] == 3
    assert (seen["global_step"], seen["epoch"], seen["resume_position"]) == (3, 0, (0, 3))
    assert (seen["position"].epoch, seen["position"].windows) == (0, 3)
    with open(checkpoint / "trainer_state.json") as f:
        on_disk = json.load(f)
    assert seen["state"].global_step == 3 and seen["state"].log_history == on_disk["log_history"]
    assert seen["state"].max_steps == 10  # this run's budget, not the checkpoint's
    assert seen["rng"] == expected_rng and seen["rng_before"] != expected_rng


# ----- EvaluationRun -----
def _settings() -> EvalSettings:
    return EvalSettings(args=hf_lightning.TrainingArguments(per_device_eval_batch_size=2))


def _accumulators(settings, prediction):
    from hf_lightning.module.eval_run import EvalAccumulator

    return lambda index: EvalAccumulator(settings, prediction_loss_only=True, is_prediction=prediction)


def test_evaluation_run_finishes_each_dataset_once_with_its_prefix():
    run = EvaluationRun(EvalRequest(metric_key_prefix="test"))
    run.open(["a", "b"], [2, 3], world_size=1, new_accumulator=_accumulators(_settings(), False))
    batch = {"input_ids": torch.zeros(2, 3)}
    run.add(0, batch, EvalStep(torch.tensor(1.5), None, None))
    result = run.finish(0)
    assert result is not None and result.metrics["test_a_loss"] == 1.5 and result.num_samples == 2
    assert run.finish(0) is None  # once
    assert run.finish(1) is None  # one process, no batch: no evaluation of it (as HF with an empty loader)
    assert run.unfinished(3) == [2] and list(run.output.results) == ["a"]
    assert run.output.metrics == result.metrics
    with pytest.raises(RuntimeError, match="already ran"):
        run.open(["a"], [2], 1, _accumulators(_settings(), False))


def test_a_prediction_always_has_a_result():
    run = EvaluationRun(EvalRequest(metric_key_prefix="test", is_prediction=True))
    run.open([""], [0], world_size=1, new_accumulator=_accumulators(_settings(), True))
    result = run.finish(0)
    assert result is not None and result.predictions is None and result.num_samples == 0


# ----- the flow's contracts -----
class _PlainModule(pl.LightningModule):
    """A LightningModule that is not a `FlowModule`."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch["input_ids"].float()[:, :2]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_check_flow_contracts_names_everything_missing():
    with pytest.raises(TypeError) as info:
        check_flow_contracts(_PlainModule(), None)
    message = str(info.value)
    for name in ("model", "new_eval_accumulator", "prediction_loss_only", "request_epoch_stop", "start_eval_run",
                 "no data module"):
        assert name in message, name
    with pytest.raises(TypeError, match="lacks eval_datasets, num_train_microbatches, predict_dataset"):
        check_flow_contracts(TransformerModule(tiny_bert()), pl.LightningDataModule())
    check_flow_contracts(TransformerModule(tiny_bert()), TransformerDataModule())  # the shipped pieces conform


def test_the_flow_checks_the_contracts_at_setup(tmp_path):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to="none")
    trainer = pl.Trainer(callbacks=[HFTrainerFlow(args)], accelerator="cpu", logger=False)
    with pytest.raises(TypeError, match="HFTrainerFlow cannot drive this run: the LightningModule _PlainModule"):
        trainer.fit(_PlainModule(), datamodule=TransformerDataModule(train_dataset=classification_dataset(4),
                                                                     args=args))


# ----- the final save -----
def test_save_final_model_writes_on_global_zero_only(tmp_path):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path))
    model = tiny_bert()
    save_final_model(model, tmp_path / "other", args=args, is_global_zero=False)
    assert not os.path.exists(tmp_path / "other")
    folder = save_final_model(model, tmp_path / "final", args=args)
    assert {"config.json", "model.safetensors", "training_args.bin"} <= set(os.listdir(folder))
    saved = load_file(str(folder / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items() if k in saved)


def test_gradient_checkpointing_without_support_is_refused_by_name():
    """HF calls `model.gradient_checkpointing_enable()` and fails on a plain module; we say what to do instead."""
    with pytest.raises(ValueError, match="`gradient_checkpointing`=True needs a model with"):
        TransformerModule(torch.nn.Linear(2, 2), hf_lightning.TrainingArguments(gradient_checkpointing=True))
    module = TransformerModule(tiny_bert(), hf_lightning.TrainingArguments(gradient_checkpointing=True))
    assert module.model.is_gradient_checkpointing
