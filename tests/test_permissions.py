"""Checkpoint and model files are written with the user's umask (safetensors alone writes weights as 0600)."""

from __future__ import annotations

import os
import stat

import pytest
import transformers

import hf_lightning
from hf_lightning.checkpoint.permissions import current_umask, file_mode
from helpers import classification_dataset, tiny_bert


@pytest.fixture
def umask():
    """Set the process umask for one test, then restore it."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def _modes(folder) -> dict[str, int]:
    return {name: stat.S_IMODE(os.stat(os.path.join(folder, name)).st_mode)
            for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name))}


def test_current_umask_reads_without_changing(umask):
    umask(0o027)
    assert current_umask() == 0o027 and current_umask() == 0o027
    assert file_mode(0o027) == 0o640 and file_mode(0o022) == 0o644


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_checkpoint_and_saved_model_follow_the_umask(tmp_path, umask, one_thread, mask):
    umask(mask)
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), max_steps=2, save_steps=2,
                                          per_device_train_batch_size=4, report_to="none", disable_tqdm=True)
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(8))
    trainer.train()
    trainer.save_model()
    expected = file_mode(mask)
    for folder in (tmp_path / "checkpoint-2", tmp_path):
        modes = _modes(folder)
        assert "model.safetensors" in modes and "optimizer.pt" in _modes(tmp_path / "checkpoint-2")
        assert modes == {name: expected for name in modes}, (oct(mask), {k: oct(v) for k, v in modes.items()})


def test_hf_writes_weights_owner_only(tmp_path, umask, one_thread):
    """The oracle, where we differ on purpose: `transformers.Trainer` 5.23 (safetensors 0.8) writes
    `model.safetensors` as 0600 under umask 0022, unreadable to anyone else on a shared machine."""
    umask(0o022)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=1, save_steps=1, report_to="none",
                                          per_device_train_batch_size=4, use_cpu=True, disable_tqdm=True)
    transformers.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(4)).train()
    modes = _modes(tmp_path / "checkpoint-1")
    assert modes["model.safetensors"] == 0o600 and modes["config.json"] == 0o644
