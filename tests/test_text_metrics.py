"""`build_text_metrics`: decoding with -100, values against the reference implementations, streaming, errors.

Oracles: the `sacrebleu` package (`corpus_bleu`, 0-100 scale) and Google's `rouge_score` package, both installed
with the dev tools; our values come from torchmetrics.
"""

from __future__ import annotations

import numpy as np
import pytest
from gen_helpers import word_tokenizer
from transformers import EvalPrediction

from hf_lightning.tasks.text_metrics import build_text_metrics, decode_ids

PREDS = ["w1 w2 w3 w4 w5", "w6 w7 w8", "w9 w10 w11 w12", "w1 w2"]
REFS = ["w1 w2 w3 w4 w6", "w6 w7 w8", "w9 w10 w12 w11 w13", "w3 w2"]


def _ids(tok, texts, pad_value):
    rows = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, rows)) + 2
    return np.array([r + [pad_value] * (width - len(r)) for r in rows])


def test_decoding_drops_minus_100_and_special_tokens() -> None:
    tok = word_tokenizer()
    ids = np.array([[4, 5, 1, -100, -100], [6, 0, 0, -100, 7]])
    assert decode_ids(ids, tok) == ["w0 w1", "w2 w3"]
    assert decode_ids([[4, -100], [5]], tok) == ["w0", "w1"]  # ragged lists too
    with pytest.raises(ValueError, match="predict_with_generate"):
        decode_ids(np.zeros((2, 3, 5), dtype=np.float32), tok)


def test_values_match_sacrebleu_and_rouge_score() -> None:
    import sacrebleu
    from rouge_score import rouge_scorer

    tok = word_tokenizer()
    metrics = build_text_metrics(tok)
    # predictions padded with the pad id (as generated), labels with -100 (as collated)
    out = metrics(EvalPrediction(predictions=_ids(tok, PREDS, 0), label_ids=_ids(tok, REFS, -100)))
    assert out["sacrebleu"] * 100 == pytest.approx(sacrebleu.corpus_bleu(PREDS, [REFS]).score, rel=1e-5)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])
    scores = [scorer.score(r, p) for p, r in zip(PREDS, REFS)]
    for key in ("rouge1", "rouge2", "rougeL"):
        assert out[key] == pytest.approx(np.mean([s[key].fmeasure for s in scores]), rel=1e-5), key
    assert out["exact_match"] == 0.25
    assert 0 < out["sacrebleu"] < 1


def test_streaming_batches_equal_the_whole_set() -> None:
    tok = word_tokenizer()
    metrics = build_text_metrics(tok, metrics=("sacrebleu", "rouge", "exact_match"))
    preds, labels = _ids(tok, PREDS, 0), _ids(tok, REFS, -100)
    whole = metrics(EvalPrediction(predictions=preds, label_ids=labels))
    assert metrics(EvalPrediction(predictions=preds[:2], label_ids=labels[:2]), compute_result=False) == {}
    streamed = metrics(EvalPrediction(predictions=preds[2:], label_ids=labels[2:]), compute_result=True)
    assert streamed == pytest.approx(whole)
    assert metrics(EvalPrediction(predictions=preds, label_ids=labels)) == pytest.approx(whole)  # state was reset


def test_selected_metrics_and_bad_input() -> None:
    tok = word_tokenizer()
    only = build_text_metrics(tok, metrics=("exact_match",))
    assert only(EvalPrediction(predictions=_ids(tok, PREDS, 0), label_ids=_ids(tok, PREDS, -100))) == {
        "exact_match": 1.0
    }
    with pytest.raises(ValueError, match="tokenizer"):
        build_text_metrics(None)
    with pytest.raises(ValueError, match="metrics"):
        build_text_metrics(tok, metrics=("bleu",))
    with pytest.raises(ValueError, match="labels"):
        only(EvalPrediction(predictions=_ids(tok, PREDS, 0), label_ids=None))
