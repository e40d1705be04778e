"""Rows the model cannot take are named before training (`hf_lightning/data/row_checks.py`).

Before: a label 7 with `num_labels=2` ended the run with `IndexError: Target 7 is out of bounds` at the step that drew
it (step 4 of a 6-step run here), a row longer than the position table with `index out of range in self`, an empty
row with `cannot reshape tensor of 0 elements`, a token id past the vocabulary with `index out of range`, and a NaN
regression label trained on silently. Now one `BadRowError` names the split, the row, the column, the value and what
is allowed, before the first update (for a stream: at the batch that holds the row).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from datasets import Dataset, IterableDataset, Sequence, Value
from helpers import CPU_QUIET, VOCAB, RecordingDataset, classification_dataset, lm_dataset, tiny_bert, tiny_gpt2

import hf_lightning
from hf_lightning import HFTrainerFlow, TransformerDataModule, TransformerModule
from hf_lightning.data.row_checks import BadRowError, RowLimits, check_dataset

REPO = Path(__file__).resolve().parents[1]


def _args(tmp_path, **overrides):
    return hf_lightning.TrainingArguments(**{**dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=6, save_strategy="steps",
        save_steps=1, report_to="none", disable_tqdm=True, seed=0), **overrides})


def _with(dataset: Dataset, column: str, row: int, value) -> Dataset:
    values = list(dataset[column])
    values[row] = value
    return dataset.remove_columns(column).add_column(column, values)


def _regression_dataset(n: int = 48) -> Dataset:
    data = classification_dataset(n)
    return data.remove_columns("label").add_column("label", [float(i % 5) / 4 for i in range(n)])


BAD_TRAIN = {
    # name: (model, dataset, column, message)
    "label_out_of_range": (lambda: tiny_bert(), lambda: _with(classification_dataset(), "label", 30, 7),
                           "the train data, row 30, column 'label': value 7 is not allowed: class ids in [0, 2) "
                           "(num_labels=2 in BertForSequenceClassification's config), or -100"),
    "negative_label": (lambda: tiny_bert(), lambda: _with(classification_dataset(), "label", 5, -1),
                       "the train data, row 5, column 'label': value -1 is not allowed: class ids in [0, 2)"),
    "nan_regression_label": (lambda: tiny_bert(num_labels=1), lambda: _with(_regression_dataset(), "label", 17,
                                                                            math.nan),
                             "the train data, row 17, column 'label': value nan is not allowed: a finite number (a "
                             "regression label: num_labels=1; in float32"),
    "inf_regression_label": (lambda: tiny_bert(num_labels=1), lambda: _with(_regression_dataset(), "label", 3,
                                                                            math.inf),
                             "row 3, column 'label': value inf is not allowed: a finite number"),
    # issue 29: 1e200 is finite in float64 (the column) but inf in float32 (the collated batch, the model's dtype)
    "float32_overflow_label": (lambda: tiny_bert(num_labels=1), lambda: _with(_regression_dataset(), "label", 5,
                                                                              1e200),
                               "row 5, column 'label': value 1e+200 is not allowed: a finite number (a regression "
                               "label: num_labels=1; in float32, |value| <= 3.403e+38)"),
    "too_long": (lambda: tiny_bert(), lambda: _with(_with(classification_dataset(), "input_ids", 11, [7] * 70),
                                                    "attention_mask", 11, [1] * 70),
                 "the train data, row 11, column 'input_ids': 70 tokens, longer than the 64 positions of "
                 "BertForSequenceClassification's position embeddings (it would fail with `index out of range`); "
                 "tokenise with `truncation=True, max_length=64`"),
    "empty_row": (lambda: tiny_bert(), lambda: _with(_with(classification_dataset(), "input_ids", 9, []),
                                                     "attention_mask", 9, []),
                  "the train data, row 9, column 'input_ids': an empty row (0 tokens)"),
    "token_past_vocab": (lambda: tiny_bert(), lambda: _with(classification_dataset(), "input_ids", 2,
                                                            [6] * 5 + [VOCAB + 3] + [6] * 6),
                         f"the train data, row 2, column 'input_ids': value {VOCAB + 3} at position 5 (the row: "),
    "lm_label_past_vocab": (lambda: tiny_gpt2(), lambda: _with(lm_dataset(), "labels", 4, [5] * 15 + [VOCAB]),
                            f"the train data, row 4, column 'labels': value {VOCAB} at position 15"),
    "float_class_ids": (lambda: tiny_bert(), lambda: classification_dataset().cast_column("label", Value("float32")),
                        "the train data, row 0, column 'label': value 1.0 is not allowed: 2 finite numbers per row "
                        "(float labels with num_labels=2 are multi-label, by HF's problem_type rule; in float32"),
    "integer_multi_label_rows": (lambda: tiny_bert(num_labels=3), lambda: _multi_label_rows().cast_column(
        "labels", Sequence(Value("int64"))),
        "the train data, row 0, column 'labels': value [1, 0, 0] is not allowed: one class id per row"),
}


@pytest.mark.parametrize("kind", sorted(BAD_TRAIN))
def test_a_bad_train_row_is_named_before_the_first_update(kind, tmp_path):
    make_model, make_data, expected = BAD_TRAIN[kind]
    trainer = hf_lightning.Trainer(model=make_model(), args=_args(tmp_path), train_dataset=make_data(),
                                   lightning_kwargs=CPU_QUIET)
    with pytest.raises(BadRowError) as info:
        trainer.train()
    assert expected in str(info.value), str(info.value)
    assert trainer.state.global_step == 0
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_a_bad_eval_row_is_named_before_training(tmp_path):
    """The eval sets are read before the first update too: the bad row would end the run at its first evaluation."""
    args = _args(tmp_path, eval_strategy="steps", eval_steps=3)
    trainer = hf_lightning.Trainer(
        model=tiny_bert(), args=args, train_dataset=classification_dataset(),
        eval_dataset={"dev": classification_dataset(16), "test": _with(classification_dataset(16), "label", 12, 2)},
        lightning_kwargs=CPU_QUIET)
    with pytest.raises(BadRowError, match=r"the eval \(test\) data, row 12, column 'label': value 2 is not allowed"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_evaluate_names_a_bad_row_of_the_dataset_it_is_given(tmp_path):
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=_args(tmp_path), lightning_kwargs=CPU_QUIET)
    with pytest.raises(BadRowError, match=r"the eval data, row 1, column 'label': value 9"):
        trainer.evaluate(_with(classification_dataset(8), "label", 1, 9))


def test_the_lightning_pieces_check_rows_in_setup(tmp_path):
    """`TransformerDataModule` with a plain `lightning.Trainer` (README "The Lightning pieces")."""
    args = _args(tmp_path, save_strategy="no")
    module = TransformerModule(tiny_bert(), args)
    data = TransformerDataModule(train_dataset=_with(classification_dataset(), "label", 40, 3), args=args)
    trainer = pl.Trainer(callbacks=[HFTrainerFlow(args)], max_epochs=-1, num_sanity_val_steps=0,
                         use_distributed_sampler=False, enable_checkpointing=False, **CPU_QUIET)
    with pytest.raises(BadRowError, match=r"the train data, row 40, column 'label': value 3"):
        trainer.fit(module, datamodule=data)
    assert trainer.global_step == 0


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=8,
                                        pad_token_id=0))


def _token_classifier():
    from transformers import BertConfig, BertForTokenClassification

    torch.manual_seed(0)
    return BertForTokenClassification(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=64, num_labels=3))


def _token_rows() -> Dataset:
    data = classification_dataset(16)
    return data.remove_columns("label").add_column(
        "labels", [[-100] + [i % 3 for i in range(10)] + [-100] for _ in range(16)])


def _multi_label_rows() -> Dataset:
    data = classification_dataset(16)
    return data.remove_columns("label").add_column("labels", [[1.0, 0.0, float(i % 2)] for i in range(16)])


VALID = {
    "ignored_sequence_label": (tiny_bert, lambda: _with(classification_dataset(16), "label", 3, -100)),
    "lm_labels_with_ignored_padding": (tiny_gpt2, lambda: lm_dataset(16)),
    "token_labels_with_ignored_subwords": (_token_classifier, _token_rows),
    "multi_label_floats": (lambda: tiny_bert(num_labels=3), _multi_label_rows),
    "rotary_positions_longer_than_max_position_embeddings": (_tiny_llama, lambda: lm_dataset(16, max_length=16)),
}


@pytest.mark.parametrize("kind", sorted(VALID))
def test_valid_hf_data_is_not_refused(kind, tmp_path):
    """-100 labels, multi-label floats, and rows longer than a rotary model's `max_position_embeddings` (Llama takes
    them: no position table) train as in HF."""
    make_model, make_data = VALID[kind]
    trainer = hf_lightning.Trainer(model=make_model(), args=_args(tmp_path, max_steps=1, save_strategy="no",
                                                                  per_device_train_batch_size=4),
                                   train_dataset=make_data(), lightning_kwargs=CPU_QUIET)
    trainer.train()
    assert trainer.state.global_step == 1


def _stream(bad_at: int) -> IterableDataset:
    rows = classification_dataset(48).to_list()
    rows[bad_at]["label"] = 7

    def generate():
        yield from rows

    return IterableDataset.from_generator(generate)


def test_a_stream_names_the_bad_row_at_the_batch_that_holds_it(tmp_path):
    """A stream cannot be read ahead: its rows are checked as they are collated, and the error names the row by its
    index in the stream (issue 29; before: only "row 5 of batch 3"), and the batch."""
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=_args(tmp_path), train_dataset=_stream(bad_at=21),
                                   lightning_kwargs=CPU_QUIET)
    with pytest.raises(BadRowError, match=r"the train data, row 21 of the stream as read \(row 5 of batch 3\), "
                                          r"column 'label': value 7 is not allowed: class ids in \[0, 2\)"):
        trainer.train()
    assert trainer.state.global_step <= 2  # at most the two batches before it trained (Lightning fetches one ahead)


def test_a_torch_dataset_names_the_bad_row_in_its_batch(tmp_path):
    """A map-style torch dataset is not read ahead (reading it may run the user's code per row): each batch's rows
    are checked as they are collated."""
    rows = classification_dataset().to_list()
    rows[20]["label"] = 4
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=_args(tmp_path), train_dataset=RecordingDataset(rows),
                                   lightning_kwargs=CPU_QUIET)
    with pytest.raises(BadRowError, match=r"the train data, row \d+ of the stream as read \(row \d of batch \d\), "
                                          r"column 'label': value 4 is not allowed"):
        trainer.train()


@pytest.mark.parametrize(("make", "inputs", "decoder"), [
    ("bert", 16, None), ("roberta", 16, None), ("gpt2", 16, None), ("opt", 16, None), ("bart", 16, 16),
    ("llama", None, None), ("t5", None, None),
], ids=lambda v: str(v))
def test_position_limits_are_where_the_model_fails(make, inputs, decoder):
    """The limit is the model's own: `limit` tokens run, `limit + 1` fail with HF's error; rotary (Llama) and relative
    (T5) positions have no limit and take longer rows."""
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        BertConfig,
        BertModel,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        OPTConfig,
        OPTForCausalLM,
        RobertaConfig,
        RobertaModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    small = dict(vocab_size=VOCAB, pad_token_id=1)
    models = {
        "bert": lambda: BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=16, max_position_embeddings=16, **small)),
        "roberta": lambda: RobertaModel(RobertaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                      intermediate_size=16, max_position_embeddings=18, **small)),
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, n_positions=16, bos_token_id=2,
                                                   eos_token_id=2, **small)),
        "opt": lambda: OPTForCausalLM(OPTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                ffn_dim=16, max_position_embeddings=16, word_embed_proj_dim=16,
                                                bos_token_id=2, eos_token_id=2, **small)),
        "bart": lambda: BartForConditionalGeneration(BartConfig(
            d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=16, bos_token_id=2, eos_token_id=2,
            decoder_start_token_id=2, forced_eos_token_id=None, **small)),
        "llama": lambda: LlamaForCausalLM(LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                      num_key_value_heads=2, intermediate_size=16,
                                                      max_position_embeddings=16, **small)),
        "t5": lambda: T5ForConditionalGeneration(T5Config(d_model=16, num_layers=1, num_heads=2, d_ff=16, d_kv=8,
                                                          decoder_start_token_id=0, **small)),
    }
    torch.manual_seed(0)
    model = models[make]().eval()
    limits = RowLimits.of(model)
    assert (limits.max_positions, limits.decoder_max_positions) == (inputs, decoder)

    def run(length: int) -> None:
        ids = torch.full((1, length), 5)
        extra = {"decoder_input_ids": torch.full((1, 4), 5)} if model.config.is_encoder_decoder else {}
        with torch.no_grad():
            model(input_ids=ids, **extra)

    run(16)
    if inputs is None:
        run(40)
    else:
        with pytest.raises((IndexError, RuntimeError)):
            run(inputs + 1)


def test_the_pass_reads_every_row_in_parts(tmp_path, monkeypatch):
    """Rows past the first part (50,000 rows; 7 here) keep their own index."""
    import hf_lightning.data.row_checks as row_checks

    monkeypatch.setattr(row_checks, "_BATCH_ROWS", 7)
    data = _with(classification_dataset(30), "label", 23, 5).shuffle(seed=1)  # an indices mapping too
    bad = list(data["label"]).index(5)
    with pytest.raises(BadRowError, match=rf"the train data, row {bad}, column 'label': value 5"):
        check_dataset(data, "train", RowLimits.of(tiny_bert()))


def test_rows_a_filter_dropped_are_not_refused(tmp_path):
    """`filter` / `select` give a view of the table: rows outside it are not the dataset's; rows inside are named by
    their index in the view."""
    data = _with(_with(classification_dataset(), "label", 10, 7), "label", 30, 9)
    limits = RowLimits.of(tiny_bert())
    with pytest.raises(BadRowError, match=r"row 29, column 'label': value 9"):
        check_dataset(data.filter(lambda row: row["label"] != 7), "train", limits)
    check_dataset(data.filter(lambda row: row["label"] < 2), "train", limits)
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=_args(tmp_path, max_steps=1, save_strategy="no"),
                                   train_dataset=data.filter(lambda row: row["label"] < 2),
                                   lightning_kwargs=CPU_QUIET)
    trainer.train()
    assert trainer.state.global_step == 1


def test_the_cli_names_a_token_past_the_models_vocabulary(tmp_path):
    """A real `hf-lightning fit` whose tokenizer has more tokens (130) than the model's embedding (40 rows): one error
    line naming the row, before training (before: `IndexError: index out of range in self` at the first step)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "hf_lightning", "fit", "--config", "configs/text_classification.yaml",
         "--args.output_dir", str(out), "--model.config_kwargs",
         "{hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 32, vocab_size: 40}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, run.stderr[-3000:]
    assert "the train data, row " in errors[0] and "column 'input_ids': value " in errors[0], errors[0]
    assert "token ids in [0, 40) (the rows of BertForSequenceClassification's input embeddings" in errors[0]
    assert not list(out.glob("checkpoint-*"))


def test_under_ddp_every_process_stops_with_one_line(tmp_path):
    """Two processes read the same rows in `setup`: both stop before training, one `error:` line, no hang."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "hf_lightning", "fit", "--config", "configs/text_classification.yaml",
         "--args.output_dir", str(out), "--trainer.devices", "2", "--trainer.strategy", "ddp", "--model.config_kwargs",
         "{hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 32, vocab_size: 40}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "token ids in [0, 40)" in errors[0], run.stderr[-3000:]
    assert not list(out.glob("checkpoint-*"))
