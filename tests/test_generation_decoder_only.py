"""Decoder-only generation evaluation (HF has none): tiny GPT-2 and Llama, prompt/completion format.

The oracle for the generated completions is `model.generate` on each prompt alone (no padding at all): the batched,
left-padded generation of the module must produce exactly those tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset
from gen_helpers import EOS, PAD, prompt_completion_dataset, text_pairs, tiny_gpt2_lm, tiny_llama, word_tokenizer
from transformers import DataCollatorForSeq2Seq

import hf_lightning
from hf_lightning.seq2seq import Seq2SeqTrainingArguments, split_prompt_completion, tokenize_prompt_completion
from hf_lightning.tasks.text_metrics import build_text_metrics

LIGHTNING = {"accelerator": "cpu", "logger": False, "enable_model_summary": False}


def _trainer(tmp_path, model, **arg_kwargs):
    tok = word_tokenizer()
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to="none",
                                    disable_tqdm=True, predict_with_generate=True, **arg_kwargs)
    return tok, hf_lightning.Seq2SeqTrainer(
        model=model, args=args, data_collator=DataCollatorForSeq2Seq(tok), processing_class=tok,
        compute_metrics=build_text_metrics(tok), lightning_kwargs=LIGHTNING,
    )


@pytest.mark.parametrize("build", [tiny_gpt2_lm, tiny_llama], ids=["gpt2", "llama"])
def test_batched_left_padded_generation_equals_one_prompt_at_a_time(build, tmp_path, one_thread) -> None:
    tok, trainer = _trainer(tmp_path, build())
    data = prompt_completion_dataset(tok, 10, seed=1)  # prompts of 2..6 words: real left padding in each batch
    out = trainer.predict(data, max_new_tokens=5)
    assert out.predictions.shape == (10, 5)
    model = build().eval()
    for i, row in enumerate(data):
        n_prompt = row["labels"].index(next(t for t in row["labels"] if t != -100))
        prompt = torch.tensor([row["input_ids"][:n_prompt]])
        with torch.no_grad():
            alone = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5,
                                   pad_token_id=PAD)[0, n_prompt:]
        np.testing.assert_array_equal(out.predictions[i, : len(alone)], alone.numpy())
        assert (out.predictions[i, len(alone):] == PAD).all()
        reference = [t for t in row["labels"] if t != -100]
        assert out.label_ids[i, : len(reference)].tolist() == reference
        assert (out.label_ids[i, len(reference):] == -100).all()
    assert len({tuple(r) for r in out.predictions}) > 3
    decoded = [tok.decode([t for t in r if t >= 0], skip_special_tokens=True) for r in out.predictions]
    references = [c for _, c in text_pairs(10, seed=1)]
    expected = sum(d.strip() == r for d, r in zip(decoded, references)) / 10
    assert out.metrics["test_exact_match"] == pytest.approx(expected)


def test_teacher_forced_loss_counts_completion_tokens_only(tmp_path, one_thread) -> None:
    tok, trainer = _trainer(tmp_path, tiny_gpt2_lm(), generation_max_length=20)
    data = prompt_completion_dataset(tok, 8, seed=2)
    loss = trainer.evaluate(data)["eval_loss"]
    model = tiny_gpt2_lm().eval()
    collator = DataCollatorForSeq2Seq(tok)
    with torch.no_grad():
        batch_losses = [model(**collator([data[i] for i in range(s, s + 4)])).loss.item() for s in (0, 4)]
    assert loss == pytest.approx(sum(batch_losses) / 2, rel=1e-6)


def test_training_then_generation_evaluation_learns_the_task(tmp_path, one_thread) -> None:
    """A few dozen updates on 'reverse the words' make exact matches appear: the metrics see real completions."""
    tok = word_tokenizer()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, per_device_eval_batch_size=16, max_steps=60,
        learning_rate=3e-3, optim="adamw_torch", report_to="none", disable_tqdm=True, save_strategy="no",
        predict_with_generate=True, generation_max_length=24, logging_steps=30,
    )
    pairs_data = Dataset.from_dict({"prompt": ["w1 w2 w3 w4", "w5 w6 w7 w8"] * 32,
                                   "completion": ["w4 w3 w2 w1", "w8 w7 w6 w5"] * 32})
    data = pairs_data.map(tokenize_prompt_completion, batched=True, remove_columns=pairs_data.column_names,
                          fn_kwargs={"tokenizer": tok, "max_length": 16})
    trainer = hf_lightning.Seq2SeqTrainer(
        model=tiny_gpt2_lm(), args=args, train_dataset=data, data_collator=DataCollatorForSeq2Seq(tok),
        processing_class=tok, compute_metrics=build_text_metrics(tok), lightning_kwargs=LIGHTNING,
    )
    before = trainer.evaluate(data.select(range(8)))
    trainer.train()
    after = trainer.evaluate(data.select(range(8)))
    assert before["eval_exact_match"] == 0.0
    assert after["eval_exact_match"] == 1.0 and after["eval_sacrebleu"] == pytest.approx(1.0)


def test_max_length_shorter_than_prompt_is_an_error_naming_the_argument(tmp_path) -> None:
    tok, trainer = _trainer(tmp_path, tiny_gpt2_lm(), generation_max_length=3)
    with pytest.raises(ValueError, match="generation_max_length"):
        trainer.predict(prompt_completion_dataset(tok, 4, seed=1))


def test_tokenize_prompt_completion_format_and_errors() -> None:
    tok = word_tokenizer()
    out = tokenize_prompt_completion({"prompt": ["w1 w2", "w3"], "completion": ["w4 w5 w6", "w7"]}, tok, 5)
    ids = {w: tok.convert_tokens_to_ids(w) for w in ("w1", "w2", "w3", "w4", "w5", "w6", "w7")}
    assert out["input_ids"][0] == [ids["w1"], ids["w2"], ids["w4"], ids["w5"], ids["w6"]]  # completion cut at 5
    assert out["labels"][0] == [-100, -100, ids["w4"], ids["w5"], ids["w6"]]
    assert out["input_ids"][1] == [ids["w3"], ids["w7"], EOS]  # EOS ends the completion
    assert out["labels"][1] == [-100, ids["w7"], EOS]
    assert out["attention_mask"][1] == [1, 1, 1]
    with pytest.raises(ValueError, match="max_length"):
        tokenize_prompt_completion({"prompt": ["w1 w2 w3"], "completion": ["w4"]}, tok, 3)
    with pytest.raises(ValueError, match="completion"):
        tokenize_prompt_completion({"prompt": ["w1"]}, tok, 3)
    with pytest.raises(ValueError, match="tokenizer"):
        tokenize_prompt_completion({"prompt": ["w1"], "completion": ["w2"]}, None, 3)


def test_split_prompt_completion_handles_either_padding_side() -> None:
    right = split_prompt_completion(
        torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 0, 0]]), torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
        torch.tensor([[-100, -100, 7, 8, -100], [-100, 10, 11, -100, -100]]), PAD,
    )
    left = split_prompt_completion(
        torch.tensor([[5, 6, 7, 8, 0], [0, 0, 9, 10, 11]]), torch.tensor([[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]),
        torch.tensor([[-100, -100, 7, 8, -100], [-100, -100, -100, 10, 11]]), PAD,
    )
    for prompts, mask, refs in (right, left):
        assert prompts.tolist() == [[5, 6], [0, 9]]
        assert mask.tolist() == [[1, 1], [0, 1]]
        assert refs.tolist() == [[7, 8], [10, 11]]
    with pytest.raises(ValueError, match="labels"):
        split_prompt_completion(torch.tensor([[5, 6]]), None, torch.tensor([[-100, -100]]), PAD)


def test_prompts_without_labels_generate_the_same_completions(tmp_path, one_thread) -> None:
    """`predict` on prompts alone (no `labels` column): every attended token is prompt; same completions."""
    tok, trainer = _trainer(tmp_path, tiny_gpt2_lm())
    data = prompt_completion_dataset(tok, 6, seed=4)
    prompts = Dataset.from_dict({
        "input_ids": [[t for t, label in zip(r["input_ids"], r["labels"]) if label == -100] for r in data],
    }).map(lambda r: {"attention_mask": [1] * len(r["input_ids"])})
    with_labels = trainer.predict(data, max_new_tokens=4)
    alone = trainer.predict(prompts, max_new_tokens=4)
    np.testing.assert_array_equal(alone.predictions, with_labels.predictions)
    assert alone.label_ids is None
