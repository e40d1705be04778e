"""`gradient_checkpointing` / `activation_checkpointing` with their `*_kwargs`, against `transformers.Trainer`.

With a LoRA adapter (frozen embeddings) both `use_reentrant` values train, with the losses of HF's run and of a run
without checkpointing (the recomputed forward replays the RNG state, so dropout agrees too); `every_n_layers` picks
the layers HF picks; the kwargs parse from JSON as HF's do.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model

import hf_lightning
from helpers import lm_dataset, stable_log, tiny_gpt2

ARGS = dict(
    per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=4, learning_rate=1e-2, logging_steps=1,
    save_strategy="no", seed=7, report_to="none", disable_tqdm=True, optim="adamw_torch",
)


def lora_gpt2():
    model = tiny_gpt2(dropout=0.1)
    model.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM"))


def run_ours(output_dir, model, **overrides):
    trainer = hf_lightning.Trainer(
        model=model, args=hf_lightning.TrainingArguments(output_dir=str(output_dir), **{**ARGS, **overrides}),
        train_dataset=lm_dataset(n=16), lightning_kwargs={"accelerator": "cpu", "logger": False,
                                                          "enable_progress_bar": False},
    )
    trainer.train()
    return trainer


@pytest.mark.parametrize("reentrant", [False, True])
def test_lora_with_checkpointing_trains_like_hf_and_like_no_checkpointing(tmp_path, reentrant, one_thread):
    settings = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": reentrant}}
    ours = run_ours(tmp_path / "ours", lora_gpt2(), **settings)
    blocks = ours.model.get_base_model().transformer.h
    assert all(block.gradient_checkpointing for block in blocks)
    assert ours.args.activation_checkpointing_kwargs == {"use_reentrant": reentrant}  # HF's alias, resolved
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, **ARGS, **settings)
    hf = transformers.Trainer(model=lora_gpt2(), args=hf_args, train_dataset=lm_dataset(n=16))
    hf.train()
    plain = run_ours(tmp_path / "plain", lora_gpt2())
    assert len(stable_log(ours)) == 4
    for a, b, c in zip(stable_log(ours), stable_log(hf), stable_log(plain), strict=True):
        assert a == pytest.approx(b, rel=1e-5) and a == pytest.approx(c, rel=1e-5)


def test_every_n_layers_and_json_kwargs_as_hf(tmp_path):
    kwargs = '{"use_reentrant": false, "every_n_layers": 2}'  # a command line's JSON string, parsed as HF does
    model = tiny_gpt2()
    hf_lightning.TransformerModule(model, hf_lightning.TrainingArguments(activation_checkpointing=True,
                                                                         activation_checkpointing_kwargs=kwargs))
    reference = tiny_gpt2()
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, activation_checkpointing=True,
                                             activation_checkpointing_kwargs=kwargs, max_steps=1, report_to="none",
                                             save_strategy="no")
    transformers.Trainer(model=reference, args=hf_args, train_dataset=lm_dataset(n=4)).train()
    flags = [[block.gradient_checkpointing for block in m.transformer.h] for m in (model, reference)]
    assert flags[0] == flags[1] and flags[0].count(True) == 1


def test_a_model_without_checkpointing_support_is_refused_by_name():
    with pytest.raises(ValueError, match="`gradient_checkpointing`=True needs a model with"):
        hf_lightning.TransformerModule(torch.nn.Linear(2, 2), hf_lightning.TrainingArguments(
            gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}))
