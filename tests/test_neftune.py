"""`neftune_noise_alpha` against `transformers.Trainer` (the oracle): the same noisy losses for the same seed, noise
only while training (evaluations see clean embeddings), the hook gone after training (also after an exception),
exact resume, and PEFT models (the hook sits on the base model's embeddings)."""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import TrainerCallback

import hf_lightning
from helpers import assert_logs_close, lm_dataset, stable_log, tiny_gpt2

ARGS = dict(
    per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=1e-2,
    logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, seed=7,
    report_to="none", disable_tqdm=True, optim="adamw_torch", neftune_noise_alpha=5.0,
)
LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


def gpt2(seed: int = 0, peft: bool = False):
    model = tiny_gpt2(seed=seed)
    model.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    if peft:
        torch.manual_seed(seed)
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM"))
    return model


def run_ours(output_dir, model=None, resume=None, callbacks=None, **overrides):
    trainer = hf_lightning.Trainer(
        model=model if model is not None else gpt2(),
        args=hf_lightning.TrainingArguments(output_dir=str(output_dir), **{**ARGS, **overrides}),
        train_dataset=lm_dataset(n=18), eval_dataset=lm_dataset(n=6, seed=1), callbacks=callbacks,
        lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def run_hf(output_dir, model=None, **overrides):
    args = transformers.TrainingArguments(output_dir=str(output_dir), use_cpu=True, **{**ARGS, **overrides})
    trainer = transformers.Trainer(model=model if model is not None else gpt2(), args=args,
                                   train_dataset=lm_dataset(n=18), eval_dataset=lm_dataset(n=6, seed=1))
    trainer.train()
    return trainer


def assert_no_hook(model) -> None:
    embeddings = model.get_input_embeddings()
    assert not embeddings._forward_hooks and not hasattr(embeddings, "neftune_noise_alpha")


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("neftune")
    return root, run_ours(root / "ours")


def test_noisy_losses_are_hfs_and_evaluations_are_clean(noisy, tmp_path, one_thread):
    root, ours = noisy
    hf = run_hf(tmp_path / "hf")
    assert_logs_close(stable_log(ours), stable_log(hf))
    clean = run_ours(tmp_path / "clean", neftune_noise_alpha=None)
    train_losses = [e["loss"] for e in stable_log(ours) if "loss" in e]
    assert train_losses[0] != pytest.approx([e["loss"] for e in stable_log(clean) if "loss" in e][0], rel=1e-4)
    assert_no_hook(ours.model)  # removed after training, as HF


def test_evaluation_during_training_sees_no_noise(tmp_path, one_thread):
    """An evaluation at step 0 (`eval_on_start`) happens after the hook is added: it equals a run without NEFTune."""
    noisy = run_ours(tmp_path / "noisy", eval_on_start=True, max_steps=1)
    clean = run_ours(tmp_path / "clean", eval_on_start=True, max_steps=1, neftune_noise_alpha=None)
    at_start = [e["eval_loss"] for t in (noisy, clean) for e in t.state.log_history if e["step"] == 0]
    assert len(at_start) == 2 and at_start[0] == at_start[1]


@pytest.mark.parametrize("step", [2, 6])
def test_resume_draws_the_same_noise(noisy, tmp_path, step, one_thread):
    root, ours = noisy
    source = tmp_path / f"checkpoint-{step}"
    shutil.copytree(root / "ours" / f"checkpoint-{step}", source)
    resumed = run_ours(tmp_path / "resumed", model=gpt2(seed=99), resume=str(source))
    assert stable_log(resumed, step) == stable_log(ours, step)


def test_peft_model_gets_the_noise_on_its_base_embeddings(tmp_path, one_thread):
    ours = run_ours(tmp_path / "ours", model=gpt2(peft=True), max_steps=4)
    hf = run_hf(tmp_path / "hf", model=gpt2(peft=True), max_steps=4)
    assert_logs_close(stable_log(ours), stable_log(hf))
    assert_no_hook(ours.model.get_base_model())


def test_the_hook_is_removed_when_training_fails(tmp_path, one_thread):
    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise RuntimeError("boom")

    model = gpt2()
    with pytest.raises(RuntimeError, match="boom"):
        run_ours(tmp_path / "out", model=model, callbacks=[Boom()])
    assert_no_hook(model)
