"""`eval_loss` of generation evaluation equals `transformers.Seq2SeqTrainer`'s (the oracle), with a short last batch.

HF's `Seq2SeqTrainer.evaluate` / `predict` gather with `accelerator.gather` (not `gather_for_metrics`), so every
batch's mean loss is repeated `eval_batch_size` times, the short last batch included: `eval_loss` is the plain mean
of the batch means (HF's base `Trainer` weights each batch by its samples, as our base module does). Tiny T5 and
BART, 21 samples in batches of 8 for `evaluate` and 17 for `predict`; `eval_loss_weighting="tokens"` still gives the
per-token mean.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from gen_helpers import seq2seq_dataset, tiny_bart, tiny_t5, word_tokenizer
from transformers import DataCollatorForSeq2Seq

import hf_lightning
from hf_lightning.tasks.text_metrics import build_text_metrics

LIGHTNING = {"accelerator": "cpu", "logger": False, "enable_model_summary": False}


def _trainers(build, tmp_path, **ours_kwargs):
    tok = word_tokenizer()
    common = dict(per_device_eval_batch_size=8, predict_with_generate=True, generation_max_length=6,
                  report_to="none", disable_tqdm=True)
    hf_model, our_model = build(), build()
    hf = transformers.Seq2SeqTrainer(
        model=hf_model, args=transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True,
                                                                   **common),
        data_collator=DataCollatorForSeq2Seq(tok, model=hf_model), processing_class=tok,
        compute_metrics=build_text_metrics(tok))
    ours = hf_lightning.Seq2SeqTrainer(
        model=our_model, args=hf_lightning.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "ours"), **common),
        data_collator=DataCollatorForSeq2Seq(tok, model=our_model), processing_class=tok,
        compute_metrics=build_text_metrics(tok), lightning_kwargs=LIGHTNING, **ours_kwargs)
    return tok, hf, ours


def _batch_losses(model, tok, data, batch: int = 8) -> list[tuple[float, int]]:
    """(mean loss, label tokens) of each eval batch, computed by hand."""
    collator = DataCollatorForSeq2Seq(tok, model=model)
    out = []
    with torch.no_grad():
        for start in range(0, len(data), batch):
            inputs = collator([data[i] for i in range(start, min(start + batch, len(data)))])
            out.append((model.eval()(**inputs).loss.item(), int((inputs["labels"] != -100).sum())))
    return out


@pytest.mark.parametrize("build", [tiny_t5, tiny_bart], ids=["t5", "bart"])
def test_eval_loss_of_evaluate_and_predict_equals_hf_seq2seq(build, tmp_path, one_thread):
    tok, hf, ours = _trainers(build, tmp_path)
    evaluation, prediction = seq2seq_dataset(tok, 21, seed=1), seq2seq_dataset(tok, 17, seed=2)
    hf_eval, our_eval = hf.evaluate(evaluation)["eval_loss"], ours.evaluate(evaluation)["eval_loss"]
    assert our_eval == pytest.approx(hf_eval, rel=1e-6)
    losses = _batch_losses(build(), tok, evaluation)
    assert [n for _, n in losses] and len(losses) == 3  # 8 + 8 + 5 samples
    assert hf_eval == pytest.approx(sum(v for v, _ in losses) / 3, rel=1e-6)  # every batch weighs the same
    hf_test = hf.predict(prediction).metrics["test_loss"]
    assert ours.predict(prediction).metrics["test_loss"] == pytest.approx(hf_test, rel=1e-6)


def test_token_weighted_eval_loss_is_still_available(tmp_path, one_thread):
    tok, _, ours = _trainers(tiny_t5, tmp_path, eval_loss_weighting="tokens")
    data = seq2seq_dataset(tok, 21, seed=1)
    losses = _batch_losses(tiny_t5(), tok, data)
    expected = sum(v * n for v, n in losses) / sum(n for _, n in losses)
    assert ours.evaluate(data)["eval_loss"] == pytest.approx(expected, rel=1e-6)


def _qa_style(base: type) -> type:
    """HF's `trainer_seq2seq_qa.py` shape: `evaluate` sets `_gen_kwargs` itself and calls `evaluation_loop`."""

    class QAStyle(base):
        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", **gen_kwargs):
            gen_kwargs = gen_kwargs.copy()
            gen_kwargs.setdefault("max_length", self.args.generation_max_length)
            gen_kwargs.setdefault("num_beams", self.args.generation_num_beams)
            self._gen_kwargs = gen_kwargs
            loader = self.get_eval_dataloader(eval_dataset)
            output = self.evaluation_loop(loader, description="Evaluation", metric_key_prefix=metric_key_prefix)
            return output.metrics

    return QAStyle


def test_a_direct_evaluation_loop_weighs_the_loss_per_sample_as_hf(tmp_path, one_thread):
    """HF weights by sample (`gather_for_metrics`) in a direct `evaluation_loop` call; only `Seq2SeqTrainer`'s own
    `evaluate` / `predict` switch to `accelerator.gather`. `_gen_kwargs` is settable (HF's QA subclass sets it)."""
    tok = word_tokenizer()
    common = dict(per_device_eval_batch_size=8, predict_with_generate=True, generation_max_length=6,
                  report_to="none", disable_tqdm=True)
    hf_model, our_model = tiny_t5(), tiny_t5()
    hf = _qa_style(transformers.Seq2SeqTrainer)(
        model=hf_model, args=transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True,
                                                                   **common),
        data_collator=DataCollatorForSeq2Seq(tok, model=hf_model), processing_class=tok)
    ours = _qa_style(hf_lightning.Seq2SeqTrainer)(
        model=our_model, args=hf_lightning.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "ours"), **common),
        data_collator=DataCollatorForSeq2Seq(tok, model=our_model), processing_class=tok, lightning_kwargs=LIGHTNING)
    data = seq2seq_dataset(tok, 21, seed=1)
    hf_loss, our_loss = hf.evaluate(data)["eval_loss"], ours.evaluate(data)["eval_loss"]
    assert our_loss == pytest.approx(hf_loss, rel=1e-6)
    losses = _batch_losses(tiny_t5(), tok, data)
    assert hf_loss == pytest.approx(sum(v * n for v, n in zip([v for v, _ in losses], (8, 8, 5))) / 21, rel=1e-6)
    assert ours._gen_kwargs == {"max_length": 6, "num_beams": None}
    # a subclass that sets HF's `gather_function` to `accelerator.gather` gets the batch-equal weighting, as in HF
    for trainer in (hf, ours):
        trainer.gather_function = trainer.accelerator.gather
    assert ours.evaluate(data)["eval_loss"] == pytest.approx(hf.evaluate(data)["eval_loss"], rel=1e-6)
    assert ours.evaluate(data)["eval_loss"] == pytest.approx(our_loss, rel=1e-6)  # reset after the loop, as HF
    ours.gather_function = print
    with pytest.raises(ValueError, match="`gather_function`=<built-in function print>"):
        ours.evaluate(data)
