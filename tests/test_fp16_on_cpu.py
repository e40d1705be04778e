"""`fp16=True` on the CPU trains in float32, as `transformers.Trainer` does there (accelerate has no float16 autocast
on the CPU), with a warning; Lightning alone would have switched to bf16 autocast (other numbers)."""

from __future__ import annotations

import pytest
import transformers

import hf_lightning
from hf_lightning.args.to_lightning import fp16_precision, lightning_trainer_kwargs
from helpers import lm_dataset, tiny_gpt2

ARGS = dict(max_steps=3, logging_steps=1, learning_rate=1e-2, per_device_train_batch_size=4, save_strategy="no",
            seed=7, report_to="none", disable_tqdm=True, optim="adamw_torch")


def losses(trainer) -> list[float]:
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


def run_ours(tmp_path, **overrides):
    model = tiny_gpt2()
    model.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    trainer = hf_lightning.Trainer(
        model=model, args=hf_lightning.TrainingArguments(output_dir=str(tmp_path), **{**ARGS, **overrides}),
        train_dataset=lm_dataset(n=16), lightning_kwargs={"accelerator": "cpu", "logger": False,
                                                          "enable_progress_bar": False},
    )
    trainer.train()
    return trainer


def test_fp16_on_cpu_trains_in_float32_like_hf_and_says_so(tmp_path, one_thread):
    with pytest.warns(UserWarning, match="fp16=True on the CPU: training in float32, as transformers.Trainer"):
        ours = run_ours(tmp_path / "fp16", fp16=True)
    assert ours.lightning_trainer.precision == "32-true"
    fp32 = run_ours(tmp_path / "fp32")
    assert losses(ours) == losses(fp32) and len(losses(ours)) == 3
    model = tiny_gpt2()
    model.loss_type = "ForCausalLM"
    hf = transformers.Trainer(model=model, args=transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), use_cpu=True, fp16=True, **ARGS), train_dataset=lm_dataset(n=16))
    hf.train()
    assert not hf.accelerator.native_amp and hf.accelerator.scaler is None  # HF's fp16 is off on the CPU
    assert losses(ours) == pytest.approx(losses(hf), rel=1e-5)


def test_fp16_elsewhere_is_lightnings_16_mixed(recwarn):
    args = hf_lightning.TrainingArguments(fp16=True, report_to="none")
    assert fp16_precision(args, {"accelerator": "gpu"}) == "16-mixed"
    assert lightning_trainer_kwargs(args, {"accelerator": "cuda"})["precision"] == "16-mixed"
    assert lightning_trainer_kwargs(args, {"accelerator": "cpu", "precision": "bf16-mixed"})["precision"] == \
        "bf16-mixed"  # an explicit Lightning precision wins, without our warning
    assert not [w for w in recwarn if "fp16=True on the CPU" in str(w.message)]
    with pytest.warns(UserWarning, match="fp16=True on the CPU"):
        assert lightning_trainer_kwargs(hf_lightning.TrainingArguments(fp16=True, use_cpu=True, report_to="none"),
                                        {})["precision"] == "32-true"
