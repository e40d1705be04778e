"""Exact resume: a run resumed from any of its checkpoints equals the uninterrupted run, bit for bit.

Tiny GPT-2 with dropout on, shuffled data, GA=2 with a short last window (9 micro-batches per epoch -> 5 updates),
an evaluation every 3 updates, a checkpoint every update. The run is resumed mid-epoch, at an epoch boundary and
mid-epoch of the second epoch, each time into a fresh output directory with a differently initialised model (so
nothing but the checkpoint can carry the state): every later log entry (loss, grad_norm, learning_rate, epoch,
eval_loss), every later checkpoint (weights, optimizer, scheduler, trainer_state.json) and the final weights match.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

import hf_lightning
from helpers import lm_dataset, tiny_gpt2

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
VOLATILE = ("runtime", "per_second", "train_loss", "total_flos")  # timings; the summary covers only the new steps


def make_args(output_dir: Path, **overrides) -> hf_lightning.TrainingArguments:
    settings = dict(
        output_dir=str(output_dir), per_device_train_batch_size=2, gradient_accumulation_steps=2,
        num_train_epochs=2, learning_rate=1e-2, warmup_steps=2, logging_steps=1, eval_strategy="steps",
        eval_steps=3, save_strategy="steps", save_steps=1, per_device_eval_batch_size=4, seed=7, report_to="none",
        disable_tqdm=True,
    )
    settings.update(overrides)
    return hf_lightning.TrainingArguments(**settings)


def train(output_dir: Path, resume: str | bool | None = None, model_seed: int = 0, **overrides):
    trainer = hf_lightning.Trainer(
        model=tiny_gpt2(dropout=0.1, seed=model_seed), args=make_args(output_dir, **overrides),
        train_dataset=lm_dataset(n=18), eval_dataset=lm_dataset(n=6, seed=1), lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def stable(entries: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if not any(word in k for word in VOLATILE)} for e in entries
            if "train_runtime" not in e]


def assert_same_checkpoint(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    oa, ob = torch.load(a / "optimizer.pt"), torch.load(b / "optimizer.pt")
    for key in oa["state"]:
        for name, value in oa["state"][key].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(ob["state"][key][name])), (a.name, key, name)
    assert torch.load(a / "scheduler.pt") == torch.load(b / "scheduler.pt")
    sa, sb = (json.loads((p / "trainer_state.json").read_text()) for p in (a, b))
    assert stable(sa.pop("log_history")) == stable(sb.pop("log_history"))
    for state in (sa, sb):
        state.pop("best_model_checkpoint")
        state.pop("total_flos")
    assert sa == sb


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("full")
    trainer = train(root / "out")
    return root / "out", trainer


@pytest.mark.parametrize("step", [3, 5, 7])  # mid-epoch (an eval step), epoch boundary, mid-epoch of epoch 2
def test_resume_is_bit_identical(uninterrupted, tmp_path, step, one_thread):
    full_dir, full = uninterrupted
    source = tmp_path / "source" / f"checkpoint-{step}"
    shutil.copytree(full_dir / f"checkpoint-{step}", source)
    resumed = train(tmp_path / "resumed", resume=str(source), model_seed=123)
    after = [e for e in full.state.log_history if e["step"] > step]
    assert stable([e for e in resumed.state.log_history if e["step"] > step]) == stable(after)
    assert resumed.state.global_step == full.state.global_step == 10
    for later in range(step + 1, 11):
        assert_same_checkpoint(full_dir / f"checkpoint-{later}", tmp_path / "resumed" / f"checkpoint-{later}")
    wa, wb = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_hand_built_lightning_trainer_resumes_exactly(uninterrupted, tmp_path, one_thread):
    """The Lightning-native path: `flow.resume_from_checkpoint` before `fit` (Lightning's sanity check left on)."""
    import lightning.pytorch as pl

    full_dir, full = uninterrupted
    source = tmp_path / "source" / "checkpoint-7"
    shutil.copytree(full_dir / "checkpoint-7", source)
    args = make_args(tmp_path / "native")
    datamodule = hf_lightning.TransformerDataModule(
        train_dataset=lm_dataset(n=18), eval_dataset=lm_dataset(n=6, seed=1), args=args
    )
    flow = hf_lightning.HFTrainerFlow(args)
    flow.resume_from_checkpoint = str(source)
    trainer = pl.Trainer(callbacks=[flow], accelerator="cpu", logger=False, enable_progress_bar=False,
                         use_distributed_sampler=False, default_root_dir=str(tmp_path))
    trainer.fit(hf_lightning.TransformerModule(tiny_gpt2(dropout=0.1, seed=5), args), datamodule=datamodule)
    after = [e for e in full.state.log_history if e["step"] > 7]
    assert stable([e for e in flow.state.log_history if e["step"] > 7]) == stable(after)
    assert_same_checkpoint(full_dir / "checkpoint-10", tmp_path / "native" / "checkpoint-10")


class StopEpochAt2(TrainerCallback):
    """An HF callback ending the first epoch after update 2 (of 5): later epochs start earlier than HF's rule says."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            control.should_epoch_stop = True


def test_resume_after_an_early_epoch_stop(tmp_path, one_thread):
    """The checkpoint records that its epoch ended early, so the resumed run starts the next epoch as the
    uninterrupted one did (HF's `global_step // updates_per_epoch` would continue epoch 0)."""
    def run(out, resume=None, seed=0):
        trainer = hf_lightning.Trainer(
            model=tiny_gpt2(dropout=0.1, seed=seed), args=make_args(out, eval_strategy="no", max_steps=6),
            train_dataset=lm_dataset(n=18), callbacks=[StopEpochAt2()], lightning_kwargs=dict(LIGHTNING_KWARGS))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full")
    epochs = [e["epoch"] for e in full.state.log_history if "loss" in e]
    assert epochs[1] < 1 and epochs[2] > 1  # update 3 is in epoch 1
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"), seed=9)
    assert stable([e for e in resumed.state.log_history if e["step"] > 2]) == stable(
        [e for e in full.state.log_history if e["step"] > 2])


def test_resume_with_an_iterable_dataset_skips_by_reading(tmp_path, one_thread):
    """An `IterableDataset` has no random access: the trained windows are read and dropped (as HF does)."""
    def run(out, resume=None, seed=0):
        trainer = hf_lightning.Trainer(
            model=tiny_gpt2(dropout=0.1, seed=seed), args=make_args(out, eval_strategy="no", max_steps=6),
            train_dataset=lm_dataset(n=40).to_iterable_dataset(), lightning_kwargs=dict(LIGHTNING_KWARGS))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full")
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-3"), seed=9)
    assert stable([e for e in resumed.state.log_history if e["step"] > 3]) == stable(
        [e for e in full.state.log_history if e["step"] > 3])
    assert_same_checkpoint(tmp_path / "full" / "checkpoint-6", tmp_path / "resumed" / "checkpoint-6")
