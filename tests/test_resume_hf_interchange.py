"""Checkpoint interchange with the real `transformers.Trainer` (the oracle), both ways.

Both trainers run the same tiny GPT-2 (dropout on), shuffled data, GA=2 with a short last window, evaluation every 3
updates and a checkpoint every update. Then:
- `transformers.Trainer.train(resume_from_checkpoint=<our checkpoint>)` continues with the losses, learning rates,
  grad norms and eval losses of our uninterrupted run, and ends with its weights;
- `hf_lightning.Trainer.train(resume_from_checkpoint=<HF's checkpoint>)` continues like HF's uninterrupted run.
Resumes are mid-epoch and at an epoch boundary, into fresh output directories, from a differently initialised model.
Uninterrupted HF and hf_lightning agree to float rounding (see test_train_parity.py), hence the tolerance.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers

import hf_lightning
from helpers import lm_dataset, tiny_gpt2

ARGS = dict(
    per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=1e-2,
    warmup_steps=2, logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=1,
    per_device_eval_batch_size=4, seed=7, report_to="none", disable_tqdm=True, optim="adamw_torch",
)


def model(seed: int = 0):
    gpt2 = tiny_gpt2(dropout=0.1, seed=seed)
    gpt2.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    return gpt2


def run_hf(output_dir, resume=None, seed=0):
    args = transformers.TrainingArguments(output_dir=str(output_dir), use_cpu=True, **ARGS)
    trainer = transformers.Trainer(model=model(seed), args=args, train_dataset=lm_dataset(n=18),
                                   eval_dataset=lm_dataset(n=6, seed=1))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def run_ours(output_dir, resume=None, seed=0):
    trainer = hf_lightning.Trainer(
        model=model(seed), args=hf_lightning.TrainingArguments(output_dir=str(output_dir), **ARGS),
        train_dataset=lm_dataset(n=18), eval_dataset=lm_dataset(n=6, seed=1),
        lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False},
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def entries_after(trainer, step: int) -> list[dict]:
    return [e for e in trainer.state.log_history if e["step"] > step and "train_runtime" not in e]


def assert_continues_like(resumed, reference, step: int) -> None:
    got, want = entries_after(resumed, step), entries_after(reference, step)
    assert [sorted(k for k in e if "runtime" not in k and "per_second" not in k) for e in got] == [
        sorted(k for k in e if "runtime" not in k and "per_second" not in k) for e in want]
    assert len(got) > 0
    for a, b in zip(got, want):
        assert a["step"] == b["step"]
        for key in ("loss", "grad_norm", "eval_loss"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-5), (key, b["step"])
        for key in ("learning_rate", "epoch"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-9), (key, b["step"])
    assert resumed.state.global_step == reference.state.global_step
    for p, q in zip(resumed.model.parameters(), reference.model.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-3, atol=1e-4)  # lr 1e-2 amplifies rounding


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("interchange")
    return root, run_hf(root / "hf"), run_ours(root / "ours")


def test_uninterrupted_runs_agree(uninterrupted):
    """The premise: both uninterrupted runs agree (otherwise the interchange tests would prove nothing)."""
    root, hf_run, our_run = uninterrupted
    assert_continues_like(our_run, hf_run, 0)
    assert sorted(p.name for p in (root / "ours").iterdir()) == sorted(p.name for p in (root / "hf").iterdir())
    # the same HF file set in every checkpoint, plus our small Lightning loop-state file (no second copy of weights)
    ours, theirs = ({p.name for p in (root / d / "checkpoint-4").iterdir()} for d in ("ours", "hf"))
    assert ours == theirs | {"lightning_state.pt", "checkpoint_manifest.json"}
    assert (root / "ours" / "checkpoint-4" / "lightning_state.pt").stat().st_size < 10_000


@pytest.mark.parametrize("step", [3, 5])  # mid-epoch, epoch boundary
def test_hf_trainer_resumes_from_our_checkpoint(uninterrupted, tmp_path, step, one_thread):
    root, _, our_run = uninterrupted
    source = tmp_path / "ours" / f"checkpoint-{step}"
    shutil.copytree(root / "ours" / f"checkpoint-{step}", source)
    resumed = run_hf(tmp_path / "hf_resumed", resume=str(source), seed=99)
    assert_continues_like(resumed, our_run, step)


@pytest.mark.parametrize("step", [3, 5])
def test_we_resume_from_hf_checkpoint(uninterrupted, tmp_path, step, one_thread):
    root, hf_run, _ = uninterrupted
    source = tmp_path / "hf" / f"checkpoint-{step}"
    shutil.copytree(root / "hf" / f"checkpoint-{step}", source)
    resumed = run_ours(tmp_path / "ours_resumed", resume=str(source), seed=99)
    assert_continues_like(resumed, hf_run, step)
