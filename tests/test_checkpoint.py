"""Checkpoint folders: HF layout and schema, `save_only_model`, `save_model`, `from_pretrained` round trip, the
output-directory rule and the errors for bad checkpoints or settings."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
import transformers

import hf_lightning
from helpers import VOCAB, lm_dataset, tiny_gpt2

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


def tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    core = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]")


def make_trainer(output_dir: Path, model=None, **overrides) -> hf_lightning.Trainer:
    settings = dict(output_dir=str(output_dir), per_device_train_batch_size=4, max_steps=4, save_steps=2,
                    logging_steps=1, learning_rate=1e-2, report_to="none", disable_tqdm=True)
    settings.update(overrides)
    return hf_lightning.Trainer(
        model=model or tiny_gpt2(dropout=0.1), args=hf_lightning.TrainingArguments(**settings),
        train_dataset=lm_dataset(n=16), eval_dataset=lm_dataset(n=4, seed=1), processing_class=tokenizer(),
        lightning_kwargs=dict(LIGHTNING_KWARGS),
    )


def test_checkpoint_layout_schema_and_from_pretrained_logits(tmp_path):
    trainer = make_trainer(tmp_path / "out")
    trainer.train()
    folder = tmp_path / "out" / "checkpoint-4"
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-2", "checkpoint-4"]  # no tmp folder left, root empty
    assert sorted(os.listdir(folder)) == sorted([
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
        "lightning_state.pt", "checkpoint_manifest.json",
    ])
    state = json.loads((folder / "trainer_state.json").read_text())
    assert set(state) == {f.name for f in dataclasses.fields(transformers.TrainerState)}  # HF's full schema
    assert state["global_step"] == 4 and state["max_steps"] == 4 and state["save_steps"] == 2
    assert "TrainerControl" in state["stateful_callbacks"]
    assert [e["step"] for e in state["log_history"]] == [1, 2, 3, 4]
    rng = torch.load(folder / "rng_state.pth", weights_only=False)
    assert set(rng) >= {"python", "numpy", "cpu"}
    # weights are stored once: the Lightning file holds only loop position and callback states
    assert (folder / "lightning_state.pt").stat().st_size < 10_000
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    trained = trainer.model.eval()
    ids = torch.tensor([[5, 9, 12, 33, 40, 7]])
    assert torch.equal(reloaded(input_ids=ids).logits, trained(input_ids=ids).logits)
    assert transformers.AutoTokenizer.from_pretrained(folder).get_vocab() == tokenizer().get_vocab()


def test_save_only_model_and_save_model(tmp_path):
    trainer = make_trainer(tmp_path / "out", save_only_model=True)
    trainer.train()
    assert sorted(os.listdir(tmp_path / "out" / "checkpoint-2")) == sorted([
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "training_args.bin", "trainer_state.json", "checkpoint_manifest.json",
    ])
    trainer.save_model()
    root = sorted(p for p in os.listdir(tmp_path / "out") if not p.startswith("checkpoint-"))
    assert root == sorted(["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "training_args.bin"])
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.tensor([[5, 9, 12]])
    assert torch.equal(reloaded(input_ids=ids).logits, trainer.model.eval()(input_ids=ids).logits)
    # a model-only checkpoint resumes (weights and state; fresh optimizer, as HF)
    resumed = make_trainer(tmp_path / "out", save_only_model=True, max_steps=6)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))
    assert resumed.state.global_step == 6


# ----- bad input -----
@pytest.fixture
def checkpoint(tmp_path) -> Path:
    make_trainer(tmp_path / "run", max_steps=2).train()
    return tmp_path / "run" / "checkpoint-2"


def test_missing_checkpoint_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such checkpoint folder"):
        make_trainer(tmp_path / "out").train(resume_from_checkpoint=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="No valid checkpoint found in output directory"):
        make_trainer(tmp_path / "out").train(resume_from_checkpoint=True)


@pytest.mark.parametrize("missing", ["trainer_state.json", "model.safetensors", "scheduler.pt", "optimizer.pt"])
def test_incomplete_checkpoint_names_the_missing_file(checkpoint, tmp_path, missing):
    (checkpoint / missing).unlink()
    with pytest.raises(FileNotFoundError, match=f"incomplete checkpoint.*{missing.split('.')[0]}"):
        make_trainer(tmp_path / "out").train(resume_from_checkpoint=str(checkpoint))


def test_checkpoint_of_a_different_model_names_the_parameter(checkpoint, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    other = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=2, n_positions=64))
    with pytest.raises(ValueError, match=r"different model: transformer\.wte\.weight: checkpoint \[64, 32\] vs "
                                         r"model \[64, 48\]"):
        make_trainer(tmp_path / "out", model=other).train(resume_from_checkpoint=str(checkpoint))


def test_metric_for_best_model_not_among_metrics_lists_them(tmp_path):
    """A key `compute_metrics` does not return is only known at the first evaluation: HF's KeyError, listing the
    keys. (Without `compute_metrics` it is known before training: tests/test_best_metric_check.py.)"""
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=4,
                                          eval_strategy="steps", eval_steps=2, metric_for_best_model="accuracy",
                                          report_to="none", disable_tqdm=True)
    trainer = hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=lm_dataset(n=16),
                                   eval_dataset=lm_dataset(n=4, seed=1), compute_metrics=lambda pred: {"acc": 1.0},
                                   lightning_kwargs=dict(LIGHTNING_KWARGS))
    with pytest.raises(KeyError, match=r"'eval_accuracy', which is not found.*\['eval_loss', 'eval_acc'"):
        trainer.train()


def test_fractional_eval_and_save_steps_that_resolve_to_non_multiples_fail_at_setup(tmp_path):
    # 0.1 / 0.2 pass HF's argument check but resolve to 2 and 3 updates for max_steps=11: evals at 2, 4, 6...,
    # checkpoints at 3, 6, 9: the best evaluation would mostly have no checkpoint (HF silently loads nothing).
    trainer = make_trainer(tmp_path / "out", max_steps=11, eval_strategy="steps", eval_steps=0.1, save_steps=0.2,
                           load_best_model_at_end=True)
    with pytest.raises(ValueError, match=r"resolve to 2 and 3 updates for max_steps=11; 3 is not a multiple of 2"):
        trainer.train()
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_output_dir_with_earlier_checkpoints_is_trained_into_as_hf(checkpoint, tmp_path):
    """As HF: a fresh run into an output_dir with checkpoints trains and replaces them; a resume from an older
    checkpoint replaces the newer ones. Files that are not `checkpoint-<n>` folders are never touched."""
    out = checkpoint.parent
    (out / "checkpoint-final").mkdir()
    (out / "checkpoint-final" / "mine.txt").write_text("mine")
    old = (out / "checkpoint-2" / "trainer_state.json").stat().st_mtime_ns
    make_trainer(out, max_steps=2, learning_rate=5e-3).train()  # another run's arguments: HF trains all the same
    assert (out / "checkpoint-2" / "trainer_state.json").stat().st_mtime_ns != old
    make_trainer(out, max_steps=4).train(resume_from_checkpoint=True)
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "checkpoint-final"]
    first = (out / "checkpoint-4" / "trainer_state.json").stat().st_mtime_ns
    make_trainer(out, max_steps=4, weight_decay=0.1).train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert (out / "checkpoint-4" / "trainer_state.json").stat().st_mtime_ns != first  # written again at step 4
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "checkpoint-final"]
    assert (out / "checkpoint-final" / "mine.txt").read_text() == "mine"


def test_interrupted_replacement_is_recovered(checkpoint, tmp_path):
    """A crash between the two renames of a same-step re-save leaves `tmp-checkpoint-2-old`: it is put back before
    the latest checkpoint is looked up, and the run resumes from it."""
    out = checkpoint.parent
    os.replace(checkpoint, out / "tmp-checkpoint-2-old")
    trainer = make_trainer(out, max_steps=4)
    trainer.train(resume_from_checkpoint=True)
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4"]
    assert [e["step"] for e in trainer.state.log_history if "loss" in e] == [1, 2, 3, 4]  # 1, 2 from the state
