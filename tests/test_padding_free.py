"""Padding-free batches (`DataCollatorWithFlattening`: one row of concatenated sequences, `position_ids`, no padding)
against `transformers.Trainer` and against padded batches of the same samples.

The collator puts -100 at each sequence's first label, so the causal shift never predicts across a boundary and
`num_items_in_batch` counts `len - 1` tokens per sequence, as for padded rows. A tiny Llama (which keeps packed
sequences apart from `position_ids`) then gives the same per-update losses flattened and padded, and HF's losses;
`eval_loss` weighs each flattened batch by its sequences, as HF's does.
"""

from __future__ import annotations

import random

import pytest
import torch
import transformers
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

import hf_lightning
from hf_lightning.module.loss import count_label_tokens, count_samples
from helpers import VOCAB, stable_log

ARGS = dict(
    per_device_train_batch_size=3, gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=1e-2,
    logging_steps=1, eval_strategy="epoch", per_device_eval_batch_size=4, save_strategy="no", seed=7,
    report_to="none", disable_tqdm=True, optim="adamw_torch",
)


def tiny_llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                        pad_token_id=0))


def rows(n: int = 22, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    ids = [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 20))] for _ in range(n)]
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


def run_ours(output_dir, collator):
    trainer = hf_lightning.Trainer(
        model=tiny_llama(), args=hf_lightning.TrainingArguments(output_dir=str(output_dir), **ARGS),
        train_dataset=rows(), eval_dataset=rows(n=7, seed=1), data_collator=collator,
        lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False},
    )
    trainer.train()
    return trainer


def padded_collator():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"p": 0, "u": 1}, unk_token="u")),
                                        pad_token="p")
    return DataCollatorForSeq2Seq(tokenizer, padding=True)


def test_flattened_label_tokens_exclude_each_sequences_first_position():
    batch = DataCollatorWithFlattening()(list(rows(n=5)))
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch and "position_ids" in batch
    assert int(count_label_tokens(batch, shift=True)) == sum(len(r) - 1 for r in rows(n=5)["input_ids"])
    assert count_samples(batch) == 5  # an eval batch's loss weighs its 5 sequences, as HF's (not its 1 row)


def test_padding_free_losses_are_hfs_and_those_of_padded_batches(tmp_path, one_thread):
    flat = run_ours(tmp_path / "flat", DataCollatorWithFlattening())
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, **ARGS)
    hf = transformers.Trainer(model=tiny_llama(), args=hf_args, train_dataset=rows(), eval_dataset=rows(n=7, seed=1),
                              data_collator=DataCollatorWithFlattening())
    hf.train()
    padded = run_ours(tmp_path / "padded", padded_collator())
    train_entries = [e for e in stable_log(flat) if "loss" in e]
    assert len(train_entries) == 8  # 8 micro-batches per epoch -> 4 updates, 2 epochs
    for ours, theirs in zip(stable_log(flat), stable_log(hf), strict=True):
        assert ours == pytest.approx(theirs, rel=1e-5)
    for ours, reference in zip(train_entries, [e for e in stable_log(padded) if "loss" in e], strict=True):
        assert ours == pytest.approx(reference, rel=1e-4)
