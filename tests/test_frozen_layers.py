"""A model with frozen base weights and a few trainable layers (no PEFT), against `transformers.Trainer`.

Only the trainable parameters reach the optimizer (as HF's `get_decay_parameter_names` groups: `requires_grad` only);
checkpoints still hold the full weights (frozen ones included, unchanged); the losses are HF's; a resumed run is
bit-identical to the uninterrupted one.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file

import hf_lightning
from helpers import lm_dataset, stable_log, tiny_gpt2

ARGS = dict(
    per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=1e-2,
    weight_decay=0.1, logging_steps=1, save_strategy="steps", save_steps=2, seed=7, report_to="none",
    disable_tqdm=True, optim="adamw_torch",
)
TRAINABLE = ("transformer.h.1.", "transformer.ln_f.")


def partly_frozen(seed: int = 0):
    model = tiny_gpt2(dropout=0.1, seed=seed)
    model.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith(TRAINABLE)
    return model


def run_ours(output_dir, resume=None, seed=0):
    trainer = hf_lightning.Trainer(
        model=partly_frozen(seed), args=hf_lightning.TrainingArguments(output_dir=str(output_dir), **ARGS),
        train_dataset=lm_dataset(n=18),
        lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False},
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("frozen")
    return root, run_ours(root / "ours")


def test_only_trainable_parameters_are_optimised_and_losses_are_hfs(uninterrupted, tmp_path, one_thread):
    root, ours = uninterrupted
    optimizer = ours.lightning_trainer.optimizers[0]
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    trainable = {id(p) for n, p in ours.model.named_parameters() if p.requires_grad}
    assert in_optimizer == trainable and 0 < len(trainable) < len(list(ours.model.parameters()))
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, **ARGS)
    hf = transformers.Trainer(model=partly_frozen(), args=hf_args, train_dataset=lm_dataset(n=18))
    hf.train()
    assert [len(g["params"]) for g in hf.optimizer.param_groups] == [len(g["params"]) for g in optimizer.param_groups]
    for a, b in zip(stable_log(ours), stable_log(hf), strict=True):
        assert a == pytest.approx(b, rel=1e-5)


def test_checkpoints_hold_every_weight_and_frozen_ones_are_unchanged(uninterrupted):
    root, ours = uninterrupted
    saved = load_file(str(root / "ours" / "checkpoint-4" / "model.safetensors"))
    untrained = partly_frozen().state_dict()
    assert set(saved) >= {k for k in untrained if k != "lm_head.weight"}  # the tied head is saved once
    frozen = [k for k in saved if not k.startswith(TRAINABLE)]
    assert frozen and all(torch.equal(saved[k], untrained[k]) for k in frozen)
    assert any(not torch.equal(saved[k], untrained[k]) for k in saved if k.startswith(TRAINABLE))


@pytest.mark.parametrize("step", [2, 6])  # mid-epoch, mid-epoch of epoch 2 (5 updates per epoch)
def test_resume_is_exact(uninterrupted, tmp_path, step, one_thread):
    root, ours = uninterrupted
    source = tmp_path / f"checkpoint-{step}"
    shutil.copytree(root / "ours" / f"checkpoint-{step}", source)
    resumed = run_ours(tmp_path / "resumed", resume=str(source), seed=99)
    assert stable_log(resumed, step) == stable_log(ours, step) and stable_log(resumed, step)
    for (name, p), (_, q) in zip(resumed.model.named_parameters(), ours.model.named_parameters()):
        assert torch.equal(p, q), name
