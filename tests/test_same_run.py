"""Re-running a script into its own `output_dir`, and resuming from an older checkpoint while newer ones exist, proceed
as in HF (issue 22 item 3): the new run replaces the checkpoints as it saves, and one warning names them (and what
differs when the earlier run had other arguments). Nothing but `checkpoint-<n>` folders is touched."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import transformers

import hf_lightning
from hf_lightning.checkpoint.changed_settings import read_recorded_arguments
from hf_lightning.checkpoint.same_run import argument_differences
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
        with caplog.at_level(logging.WARNING, logger="hf_lightning.checkpoint.restore"):
            make(folder).train()  # the same command again, no resume: HF trains from scratch over its checkpoints
    notices = [r.getMessage() for r in caplog.records if "earlier run with the same arguments" in r.getMessage()]
    assert len(notices) == 1 and "replaces checkpoint-2, checkpoint-4" in notices[0]
    for step in (2, 4):
        assert state(tmp_path / "ours" / f"checkpoint-{step}") == pytest.approx(
            state(tmp_path / "hf" / f"checkpoint-{step}"), rel=1e-5)


def test_resume_from_an_older_checkpoint_replaces_the_newer_ones_as_hf(tmp_path, caplog):
    for make, folder in ((ours, tmp_path / "ours"), (hf, tmp_path / "hf")):
        make(folder).train()
        with caplog.at_level(logging.WARNING, logger="hf_lightning.checkpoint.restore"):
            make(folder).train(resume_from_checkpoint=str(folder / "checkpoint-2"))
    notices = [r.getMessage() for r in caplog.records if "earlier run with the same arguments" in r.getMessage()]
    assert len(notices) == 1 and "resumes from step 2 and replaces checkpoint-4" in notices[0]
    assert state(tmp_path / "ours" / "checkpoint-4") == pytest.approx(state(tmp_path / "hf" / "checkpoint-4"),
                                                                       rel=1e-5)


def test_another_run_s_checkpoints_are_replaced_and_rotated_as_hf(tmp_path, caplog):
    """Resume from checkpoint-2 of a run with other arguments while its checkpoint-4 exists: HF continues, overwrites
    checkpoint-4 at step 4 and rotates (`save_total_limit`) over old and new folders alike; the user's files stay."""
    second = dict(learning_rate=3e-4, max_steps=6, save_total_limit=2)
    for make, folder in ((ours, tmp_path / "ours"), (hf, tmp_path / "hf")):
        make(folder).train()
        (folder / "notes.txt").write_text("mine")
        with caplog.at_level(logging.WARNING, logger="hf_lightning.checkpoint.restore"):
            make(folder, **second).train(resume_from_checkpoint=str(folder / "checkpoint-2"))
    notices = [r.getMessage() for r in caplog.records if "replaces" in r.getMessage()]
    assert len(notices) == 1, notices
    assert "other arguments (" in notices[0] and "learning_rate: 0.001 -> 0.0003" in notices[0]
    assert "resumes from step 2 and replaces checkpoint-4 as it saves" in notices[0]
    names = sorted(p.name for p in (tmp_path / "ours").iterdir() if p.name.startswith("checkpoint-"))
    assert names == sorted(p.name for p in (tmp_path / "hf").iterdir() if p.name.startswith("checkpoint-"))
    assert names == ["checkpoint-4", "checkpoint-6"]  # checkpoint-2 rotated away at step 6
    assert (tmp_path / "ours" / "notes.txt").read_text() == "mine"
    for step in (4, 6):  # the new run's history (its learning rate), not the replaced run's
        assert state(tmp_path / "ours" / f"checkpoint-{step}") == pytest.approx(
            state(tmp_path / "hf" / f"checkpoint-{step}"), rel=1e-5)
    recorded = json.loads((tmp_path / "ours" / "checkpoint-4" / "trainer_state.json").read_text())
    assert [e["learning_rate"] for e in recorded["log_history"] if e["step"] == 4 and "loss" in e] != []


def test_the_run_lock_still_refuses_a_concurrent_run(tmp_path):
    """Replacing is for runs one after another: a live run's lock still refuses a second run into its output_dir."""
    from hf_lightning.checkpoint.run_lock import RunLock

    ours(tmp_path).train()
    lock = RunLock.acquire(tmp_path)  # a live run of this process holds output_dir
    try:
        with pytest.raises(RuntimeError, match="is in use by another training run"):
            ours(tmp_path).train()
    finally:
        lock.release()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-2", "checkpoint-4"]


def test_hf_written_checkpoints_compare_by_their_arguments(tmp_path):
    hf(tmp_path).train()
    same = hf_lightning.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **COMMON)
    before = read_recorded_arguments(tmp_path / "checkpoint-4")  # HF's pickle, through the allow-list
    assert argument_differences(before, same) == []
    other = hf_lightning.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **{**COMMON, "seed": 4})
    assert argument_differences(before, other) == ["seed: 3 -> 4"]
    assert read_recorded_arguments(tmp_path / "nowhere") is None
