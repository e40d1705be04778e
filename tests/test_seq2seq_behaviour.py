"""Seq2Seq behaviour beyond parity: HF's rough edges fixed, argument handling, generation config, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from gen_helpers import PAD, seq2seq_dataset, tiny_t5, word_tokenizer
from helpers import tiny_bert
from transformers import DataCollatorForSeq2Seq, GenerationConfig

import hf_lightning
from hf_lightning.seq2seq import Seq2SeqTrainingArguments, Seq2SeqTransformerModule
from hf_lightning.seq2seq.gen_kwargs import generation_width, resolve_gen_kwargs
from hf_lightning.seq2seq.prompts import pad_right
from hf_lightning.tasks.text_metrics import build_text_metrics

LIGHTNING = {"accelerator": "cpu", "logger": False, "enable_model_summary": False}


def _trainer(tmp_path, model=None, **arg_kwargs):
    tok = word_tokenizer()
    model = model if model is not None else tiny_t5()
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to="none",
                                    disable_tqdm=True, predict_with_generate=True, **arg_kwargs)
    return tok, hf_lightning.Seq2SeqTrainer(
        model=model, args=args, data_collator=DataCollatorForSeq2Seq(tok, model=model), processing_class=tok,
        compute_metrics=build_text_metrics(tok), lightning_kwargs=LIGHTNING,
    )


def test_predictions_padded_to_generation_length_and_labels_only_minus_100(tmp_path, one_thread) -> None:
    tok, ours = _trainer(tmp_path, generation_max_length=6)
    out = ours.predict(seq2seq_dataset(tok, 6, seed=2))
    assert out.predictions.shape == (6, 6)
    assert out.predictions.dtype == np.int64
    lengths = [len(r) for r in seq2seq_dataset(tok, 6, seed=2)["labels"]]
    assert out.label_ids.shape == (6, max(lengths))
    for row, n in zip(out.label_ids, lengths):
        assert (row[n:] == -100).all() and (row[:n] >= 0).all()  # never a pad id appended to the labels
    assert ours.predict(seq2seq_dataset(tok, 6, seed=2), max_new_tokens=2).predictions.shape == (6, 3)


def test_prediction_loss_only_and_no_compute_metrics_skip_generation(tmp_path, one_thread) -> None:
    tok, ours = _trainer(tmp_path, generation_max_length=5)
    calls = []
    original = ours.model.generate
    ours.model.generate = lambda *a, **k: calls.append(1) or original(*a, **k)
    ours.module.compute_metrics = None
    metrics = ours.evaluate(seq2seq_dataset(tok, 4))
    assert "eval_loss" in metrics and not calls  # HF: evaluate without compute_metrics is loss-only
    ours.predict(seq2seq_dataset(tok, 4))
    assert len(calls) == 1


def test_generation_config_object_and_path_replace_the_models(tmp_path) -> None:
    config = GenerationConfig(max_length=7, num_beams=1, decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
    model = tiny_t5()
    Seq2SeqTransformerModule(model, Seq2SeqTrainingArguments(generation_config=config))
    assert model.generation_config.max_length == 7 and model.generation_config is not config
    config.max_length = 11
    config.save_pretrained(tmp_path / "gen")
    for value in (str(tmp_path / "gen"), str(tmp_path / "gen" / "generation_config.json")):
        model = tiny_t5()
        Seq2SeqTransformerModule(model, Seq2SeqTrainingArguments(generation_config=value))
        assert model.generation_config.max_length == 11
    bad = GenerationConfig(num_beams=1, early_stopping=True)  # strict validation: early_stopping needs beams
    with pytest.raises(ValueError, match="generation_config"):
        Seq2SeqTransformerModule(tiny_t5(), Seq2SeqTrainingArguments(generation_config=bad))


def test_transformers_seq2seq_arguments_are_converted(tmp_path) -> None:
    hf_args = transformers.Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), predict_with_generate=True, generation_max_length=12, generation_num_beams=3,
        learning_rate=3e-4,
    )
    tok = word_tokenizer()
    trainer = hf_lightning.Seq2SeqTrainer(model=tiny_t5(), args=hf_args, processing_class=tok,
                                          lightning_kwargs=LIGHTNING)
    assert isinstance(trainer.args, Seq2SeqTrainingArguments)
    assert (trainer.args.predict_with_generate, trainer.args.generation_max_length,
            trainer.args.generation_num_beams, trainer.args.learning_rate) == (True, 12, 3, 3e-4)
    assert trainer._gen_kwargs == {"max_length": 12, "num_beams": 3}


def test_bad_input_names_the_argument(tmp_path) -> None:
    with pytest.raises(ValueError, match="predict_with_generate"):
        Seq2SeqTransformerModule(tiny_bert(), Seq2SeqTrainingArguments(predict_with_generate=True))
    with pytest.raises(ValueError, match="generation_num_beams"):
        Seq2SeqTrainingArguments(generation_num_beams=0)
    with pytest.raises(ValueError, match="generation_max_length"):
        Seq2SeqTrainingArguments(generation_max_length=0)
    tok, ours = _trainer(tmp_path)
    with pytest.raises(ValueError, match="num_beams"):
        ours.evaluate(seq2seq_dataset(tok, 4), num_beams=0)
    with pytest.raises(ValueError, match="tokenizer"):
        build_text_metrics(None)
    model = tiny_t5()
    model.config.pad_token_id = None
    model.generation_config.pad_token_id = None
    model.generation_config.eos_token_id = None
    module = Seq2SeqTransformerModule(model, Seq2SeqTrainingArguments(predict_with_generate=True))
    with pytest.raises(ValueError, match="pad_token_id"):
        module.pad_token_id()


def test_pure_rules() -> None:
    args = Seq2SeqTrainingArguments(generation_max_length=8, generation_num_beams=2)
    assert resolve_gen_kwargs(args, {}) == {"max_length": 8, "num_beams": 2}
    assert resolve_gen_kwargs(args, {"max_new_tokens": 3}) == {"max_new_tokens": 3, "num_beams": 2}
    assert resolve_gen_kwargs(args, {"max_length": 4, "num_beams": 1}) == {"max_length": 4, "num_beams": 1}
    config = GenerationConfig()
    assert generation_width({"max_length": 8}, config, True) == 8
    assert generation_width({"max_new_tokens": 3}, config, True) == 4
    assert generation_width({"max_new_tokens": 3}, config, False) == 3
    assert generation_width({}, config, True) == 20
    assert generation_width({}, GenerationConfig(max_new_tokens=5), True) == 6
    assert pad_right(torch.tensor([[5, 6]]), 4, PAD).tolist() == [[5, 6, 0, 0]]
    assert pad_right(torch.tensor([[5, 6, 7]]), 2, PAD).tolist() == [[5, 6, 7]]  # never truncated


def test_seq2seq_args_module_imports_without_torch() -> None:
    """Like `hf_lightning.args`, so a CLI can parse configs before loading torch."""
    import subprocess
    import sys

    code = ("import sys, hf_lightning.seq2seq.args as a; a.Seq2SeqTrainingArguments(predict_with_generate=True); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "False"


def test_streamed_text_metrics_equal_whole_set_metrics(tmp_path, one_thread) -> None:
    """`batch_eval_metrics=True`: the text metrics are updated batch by batch and give the whole-set values."""
    tok, whole = _trainer(tmp_path / "a", generation_max_length=6)
    _, streamed = _trainer(tmp_path / "b", generation_max_length=6, batch_eval_metrics=True)
    data = seq2seq_dataset(tok, 10, seed=4)
    a, b = whole.evaluate(data), streamed.evaluate(data)
    for key in ("eval_loss", "eval_sacrebleu", "eval_rouge1", "eval_rouge2", "eval_rougeL", "eval_exact_match"):
        assert b[key] == pytest.approx(a[key], rel=1e-6), key
