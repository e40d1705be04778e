"""`hf_lightning.Seq2SeqTrainer` against the real `transformers.Seq2SeqTrainer` (tiny T5 and BART, same weights).

Generated ids are identical (ours are padded to the generation length used, HF's to `generation_config.max_length`
= 20: HF's extra columns are all pad ids), text metrics and `eval_loss` are identical (a short last batch included:
test_seq2seq_eval_loss.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers
from gen_helpers import PAD, seq2seq_dataset, tiny_bart, tiny_t5, word_tokenizer
from transformers import DataCollatorForSeq2Seq

import hf_lightning
from hf_lightning.tasks.text_metrics import build_text_metrics

LIGHTNING = {"accelerator": "cpu", "logger": False, "enable_model_summary": False}
TIMING = ("runtime", "samples_per_second", "steps_per_second", "model_preparation_time")


def _pair(build, beams: int, max_length: int, tmp_path, n_train: int = 0):
    tok = word_tokenizer()
    common = dict(per_device_eval_batch_size=4, per_device_train_batch_size=4, predict_with_generate=True,
                  generation_max_length=max_length, generation_num_beams=beams, report_to="none", seed=3,
                  learning_rate=1e-2, optim="adamw_torch", max_steps=n_train or -1)
    hf_model, our_model = build(), build()
    hf = transformers.Seq2SeqTrainer(
        model=hf_model, args=transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True,
                                                                   disable_tqdm=True, **common),
        data_collator=DataCollatorForSeq2Seq(tok, model=hf_model), processing_class=tok,
        compute_metrics=build_text_metrics(tok), train_dataset=seq2seq_dataset(tok, 16, seed=5),
    )
    ours = hf_lightning.Seq2SeqTrainer(
        model=our_model, args=hf_lightning.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "ours"),
                                                                    disable_tqdm=True, save_strategy="no", **common),
        data_collator=DataCollatorForSeq2Seq(tok, model=our_model), processing_class=tok,
        compute_metrics=build_text_metrics(tok), train_dataset=seq2seq_dataset(tok, 16, seed=5),
        lightning_kwargs=LIGHTNING,
    )
    return tok, hf, ours


def _assert_same_generation(hf_pred: np.ndarray, ours: np.ndarray, width: int) -> None:
    assert ours.shape[1] == width  # the generation length used, not 20
    assert hf_pred.shape[1] == 20
    np.testing.assert_array_equal(ours, hf_pred[:, :width])
    assert (hf_pred[:, width:] == PAD).all()


def _metrics_equal(hf: dict, ours: dict) -> None:
    keep = lambda d: {k: v for k, v in d.items() if not k.endswith(TIMING)}  # noqa: E731
    assert keep(hf).keys() == keep(ours).keys()
    for key, value in keep(hf).items():
        assert ours[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


@pytest.mark.parametrize("build", [tiny_t5, tiny_bart], ids=["t5", "bart"])
@pytest.mark.parametrize("beams", [1, 3], ids=["greedy", "beam3"])
def test_predict_and_evaluate_match_hf(build, beams, tmp_path, one_thread) -> None:
    tok, hf, ours = _pair(build, beams, 9, tmp_path)
    data = seq2seq_dataset(tok, 12, seed=1)  # 3 full batches of 4
    hf_out, our_out = hf.predict(data), ours.predict(data)
    assert len({tuple(row) for row in our_out.predictions}) > 3  # varied outputs: a meaningful comparison
    _assert_same_generation(hf_out.predictions, our_out.predictions, 9)
    _metrics_equal(hf_out.metrics, our_out.metrics)
    # labels: ours keep -100 as their only padding; HF appends pad ids after the collator's -100
    assert set(np.unique(our_out.label_ids[our_out.label_ids < 4])) <= {-100, 1}
    hf_labels = np.where(hf_out.label_ids == -100, PAD, hf_out.label_ids)
    our_labels = np.where(our_out.label_ids == -100, PAD, our_out.label_ids)
    np.testing.assert_array_equal(hf_labels[:, : our_labels.shape[1]], our_labels)
    _metrics_equal(hf.evaluate(data), ours.evaluate(data))


@pytest.mark.parametrize("build", [tiny_t5, tiny_bart], ids=["t5", "bart"])
def test_gen_kwargs_override_and_max_new_tokens(build, tmp_path, one_thread) -> None:
    tok, hf, ours = _pair(build, 1, 9, tmp_path)
    data = seq2seq_dataset(tok, 8, seed=2)
    hf_out = hf.predict(data, max_new_tokens=4, num_beams=2)
    our_out = ours.predict(data, max_new_tokens=4, num_beams=2)
    np.testing.assert_array_equal(our_out.predictions, hf_out.predictions[:, :5])  # 4 new tokens + start token
    assert hf._gen_kwargs == ours._gen_kwargs == {"max_new_tokens": 4, "num_beams": 2}
    _metrics_equal(hf.evaluate(data, max_length=6), ours.evaluate(data, max_length=6))
    assert hf._gen_kwargs == ours._gen_kwargs == {"max_length": 6, "num_beams": 1}


def test_training_time_evaluation_uses_args_and_matches_hf(tmp_path, one_thread) -> None:
    """Train 4 updates with an evaluation every 2 (HF's `_evaluate` passes no gen_kwargs: the args apply)."""
    tok, hf, ours = _pair(tiny_t5, 2, 7, tmp_path, n_train=4)
    data = seq2seq_dataset(tok, 8, seed=3)
    for trainer in (hf, ours):
        trainer.args.eval_strategy = "steps"
        trainer.args.eval_steps = 2
        trainer.args.logging_steps = 2
        trainer.eval_dataset = data
    ours.evaluate(data, max_length=3)  # stored kwargs are replaced by the args' at the first training evaluation
    hf.evaluate(data, max_length=3)
    hf.train()
    ours.train()
    assert hf._gen_kwargs == ours._gen_kwargs == {"max_length": 7, "num_beams": 2}
    hf_evals = [e for e in hf.state.log_history if "eval_loss" in e]
    our_evals = [e for e in ours.state.log_history if "eval_loss" in e]
    assert len(hf_evals) == len(our_evals) == 2
    for a, b in zip(hf_evals, our_evals):
        for key in ("eval_loss", "eval_sacrebleu", "eval_rouge1", "eval_exact_match", "step"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    _assert_same_generation(hf.predict(data).predictions, ours.predict(data).predictions, 7)


def test_training_evaluations_and_saved_generation_config_match_hf(tmp_path, one_thread) -> None:
    """No `generation_max_length`: `generate` runs on the model's own config, which HF's `prediction_step` fills with
    the library defaults after its first `generate` (max_length None -> 20). HF's first evaluation therefore makes
    21 ids (the model-agnostic default: 20 new tokens + the start token) in its first batch, later ones 20; the
    checkpoints saved before any evaluation hold the sparse config, the later ones every field."""
    tok = word_tokenizer()
    widths = lambda p: {"width": float(p.predictions.shape[1]),  # noqa: E731
                        "gen_len": float(np.mean([np.count_nonzero(row != PAD) for row in p.predictions]))}
    common = dict(per_device_eval_batch_size=4, per_device_train_batch_size=4, predict_with_generate=True,
                  report_to="none", seed=3, learning_rate=1e-4, optim="adamw_torch", max_steps=5,
                  eval_strategy="steps", eval_steps=2, logging_steps=2, save_steps=1, disable_tqdm=True)
    runs = {}
    for name, trainer_cls, args_cls, extra in (
        ("hf", transformers.Seq2SeqTrainer, transformers.Seq2SeqTrainingArguments, {"use_cpu": True}),
        ("ours", hf_lightning.Seq2SeqTrainer, hf_lightning.Seq2SeqTrainingArguments, {}),
    ):
        model = tiny_bart()
        kwargs = {"lightning_kwargs": LIGHTNING} if name == "ours" else {}
        trainer = trainer_cls(
            model=model, args=args_cls(output_dir=str(tmp_path / name), **common, **extra),
            data_collator=DataCollatorForSeq2Seq(tok, model=model), processing_class=tok, compute_metrics=widths,
            train_dataset=seq2seq_dataset(tok, 16, seed=5), eval_dataset=seq2seq_dataset(tok, 8, seed=3), **kwargs,
        )
        trainer.train()
        trainer.save_model(str(tmp_path / name / "final"))
        runs[name] = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert [e["eval_width"] for e in runs["hf"]] == [21.0, 20.0, 20.0]  # steps 2, 4 and the last, 5
    assert len(runs["ours"]) == 3
    for a, b in zip(runs["hf"], runs["ours"]):
        for key in ("eval_loss", "eval_width", "eval_gen_len", "step"):
            assert b[key] == pytest.approx(a[key], rel=1e-6), key
    for folder in ("checkpoint-1", "checkpoint-2", "checkpoint-5", "final"):
        hf_config = json.loads((tmp_path / "hf" / folder / "generation_config.json").read_text())
        ours = json.loads((tmp_path / "ours" / folder / "generation_config.json").read_text())
        assert ours == hf_config, folder
    saved = lambda folder: json.loads((tmp_path / "hf" / folder / "generation_config.json").read_text())  # noqa: E731
    assert "max_length" not in saved("checkpoint-1") and saved("final")["max_length"] == 20  # both kinds compared
