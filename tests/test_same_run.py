"""Re-running a script into its own `output_dir`, and resuming from an older checkpoint while newer ones exist, proceed
as in HF when the checkpoints are the user's own earlier run (same arguments); another run's checkpoints stay refused,
now with what differs."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import transformers

import hf_lightning
from hf_lightning.resume.same_run import argument_differences
from helpers import classification_dataset, tiny_bert

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
COMMON = dict(max_steps=4, save_steps=2, per_device_train_batch_size=8, logging_steps=1, learning_rate=1e-3,
              report_to="none", seed=3)
MODEL, TRAIN = tiny_bert(), classification_dataset(32)


def ours(output_dir, **overrides):
    args = hf_lightning.TrainingArguments(output_dir=str(output_dir), **{**COMMON, **overrides})
    return hf_lightning.Trainer(model=copy.deepcopy(MODEL), args=args, train_dataset=TRAIN,
                                lightning_kwargs=dict(LIGHTNING_KWARGS))


def hf(output_dir, **overrides):
    args = transformers.TrainingArguments(output_dir=str(output_dir), use_cpu=True, disable_tqdm=True,
                                          **{**COMMON, **overrides})
    return transformers.Trainer(model=copy.deepcopy(MODEL), args=args, train_dataset=TRAIN)


def state(folder):
    """`{step: loss}` of the checkpoint's log history."""
    entries = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    return {e["step"]: e["loss"] for e in entries if "loss" in e}


def test_rerun_from_scratch_replaces_the_earlier_run_s_checkpoints_as_hf(tmp_path, caplog):
    for make, folder in ((ours, tmp_path / "ours"), (hf, tmp_path / "hf")):
        make(folder).train()
        with caplog.at_level(logging.WARNING, logger="hf_lightning.resume.load"):
            make(folder).train()  # the same command again, no resume: HF trains from scratch over its checkpoints
    notices = [r.getMessage() for r in caplog.records if "earlier run with the same arguments" in r.getMessage()]
    assert len(notices) == 1 and "replaces checkpoint-2, checkpoint-4" in notices[0]
    for step in (2, 4):
        assert state(tmp_path / "ours" / f"checkpoint-{step}") == pytest.approx(
            state(tmp_path / "hf" / f"checkpoint-{step}"), rel=1e-5)


def test_resume_from_an_older_checkpoint_replaces_the_newer_ones_as_hf(tmp_path, caplog):
    for make, folder in ((ours, tmp_path / "ours"), (hf, tmp_path / "hf")):
        make(folder).train()
        with caplog.at_level(logging.WARNING, logger="hf_lightning.resume.load"):
            make(folder).train(resume_from_checkpoint=str(folder / "checkpoint-2"))
    notices = [r.getMessage() for r in caplog.records if "earlier run with the same arguments" in r.getMessage()]
    assert len(notices) == 1 and "resumes from step 2 and replaces checkpoint-4" in notices[0]
    assert state(tmp_path / "ours" / "checkpoint-4") == pytest.approx(state(tmp_path / "hf" / "checkpoint-4"),
                                                                       rel=1e-5)


def test_another_run_s_checkpoints_are_still_refused_naming_what_differs(tmp_path):
    ours(tmp_path).train()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"another run .*learning_rate: 0\.001 -> 0\.0003"):
        ours(tmp_path, learning_rate=3e-4).train()
    with pytest.raises(ValueError, match=r"newer than the resumed step 2 .*max_steps: 4 -> 6"):
        ours(tmp_path, max_steps=6).train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_hf_written_checkpoints_compare_by_their_arguments(tmp_path):
    hf(tmp_path).train()
    same = hf_lightning.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **COMMON)
    assert argument_differences(tmp_path / "checkpoint-4", same) == []
    other = hf_lightning.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **{**COMMON, "seed": 4})
    assert argument_differences(tmp_path / "checkpoint-4", other) == ["seed: 3 -> 4"]
    assert argument_differences(tmp_path / "nowhere", same) is None
