"""Ready-made `compute_metrics` for generated text: SacreBLEU, ROUGE and exact match, computed with torchmetrics.

`build_text_metrics(tokenizer)` returns a function taking HF's `EvalPrediction` (predictions = generated ids,
label_ids = reference ids) that decodes both with the tokenizer and scores the texts. Decoding never crashes on -100
or any other negative id (HF's examples must `np.where(labels != -100, labels, pad)` first): negative ids are
dropped before decoding, special tokens are skipped.

Backends (all offline): `torchmetrics.text.SacreBLEUScore` (its own `13a` tokenizer, no `sacrebleu` package) and
`torchmetrics.text.ROUGEScore` with `rouge1`, `rouge2`, `rougeL` (`rougeLsum` needs nltk's `punkt` data, which may
need a download; it is accepted only when asked for by name). Both metrics keep running sums, so with
`batch_eval_metrics=True` each batch is scored and dropped (streaming) and the result equals the whole-set score.

Values: `sacrebleu` in [0, 1] (torchmetrics' scale; multiply by 100 for sacrebleu's), `rouge1`/`rouge2`/`rougeL`
F-measures in [0, 1], `exact_match` the fraction of predictions equal to their reference after stripping spaces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from torchmetrics.text import ROUGEScore, SacreBLEUScore

__all__ = ["BleuTokenize", "build_text_metrics", "decode_ids", "TEXT_METRICS"]

BleuTokenize = Literal["none", "13a", "zh", "intl", "char", "ja-mecab", "ko-mecab", "flores101", "flores200"]
"""SacreBLEU's tokenizers (torchmetrics `SacreBLEUScore(tokenize=...)`)."""

TEXT_METRICS = ("sacrebleu", "rouge", "exact_match")
"""The metric names `build_text_metrics` accepts."""

_DEFAULT_ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


def decode_ids(ids: Any, tokenizer: Any) -> list[str]:
    """Decode a (batch, length) array / tensor / list of token ids, dropping negative ids (-100 padding).

    Raises:
        ValueError: `ids` holds floats (logits): generation evaluation needs `predict_with_generate=True`.
    """
    if hasattr(ids, "detach"):
        ids = ids.detach().cpu().numpy()
    if isinstance(ids, tuple):
        ids = ids[0]
    array = np.asarray(ids) if not isinstance(ids, list) or not ids or not isinstance(ids[0], list) else None
    if array is not None and array.dtype.kind == "f":
        raise ValueError(
            f"Text metrics need token ids, but the predictions are floats of shape {array.shape} (logits). Set "
            "`predict_with_generate=True` in Seq2SeqTrainingArguments."
        )
    rows = array.tolist() if array is not None else ids
    if rows and not isinstance(rows[0], list):
        rows = [rows]
    vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    cleaned = [[int(t) for t in row if t >= 0 and (vocab is None or t < vocab)] for row in rows]
    return [text.strip() for text in tokenizer.batch_decode(cleaned, skip_special_tokens=True)]


class _TextMetrics:
    """The callable `build_text_metrics` returns (keeps the torchmetrics states between streamed batches)."""

    def __init__(self, tokenizer: Any, metrics: Sequence[str], rouge_keys: Sequence[str], bleu_tokenize: BleuTokenize
                 ) -> None:
        self.tokenizer = tokenizer
        self.metrics = tuple(metrics)
        self.rouge_keys = tuple(rouge_keys)
        self.bleu_tokenize = bleu_tokenize
        self._reset()

    def _reset(self) -> None:
        self._bleu = SacreBLEUScore(tokenize=self.bleu_tokenize) if "sacrebleu" in self.metrics else None
        self._rouge = ROUGEScore(rouge_keys=self.rouge_keys) if "rouge" in self.metrics else None
        self._matches = 0
        self._count = 0

    def _update(self, predictions: Any, label_ids: Any) -> None:
        preds = decode_ids(predictions, self.tokenizer)
        refs = decode_ids(label_ids, self.tokenizer)
        if len(preds) != len(refs):
            raise ValueError(f"{len(preds)} predictions but {len(refs)} references: they must pair up row by row.")
        if self._bleu is not None:
            self._bleu.update(preds, [[r] for r in refs])
        if self._rouge is not None:
            self._rouge.update(preds, refs)
        self._matches += sum(p == r for p, r in zip(preds, refs))
        self._count += len(preds)

    def _compute(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self._bleu is not None:
            out["sacrebleu"] = float(self._bleu.compute())
        if self._rouge is not None:
            scores = self._rouge.compute()
            for key in self.rouge_keys:
                out[key] = float(scores[f"{key}_fmeasure"])
        if "exact_match" in self.metrics:
            out["exact_match"] = self._matches / self._count if self._count else 0.0
        return out

    def __call__(self, eval_pred: Any, compute_result: bool | None = None) -> dict[str, float]:
        """Score one `EvalPrediction`; with `compute_result` (HF's `batch_eval_metrics`), stream batch by batch."""
        if eval_pred.label_ids is None:
            raise ValueError("Text metrics need references: the evaluation dataset has no `labels`.")
        if compute_result is None:
            self._reset()
        self._update(eval_pred.predictions, eval_pred.label_ids)
        if compute_result is False:
            return {}
        result = self._compute()
        self._reset()
        return result


def build_text_metrics(
    tokenizer: Any,
    metrics: Sequence[str] = TEXT_METRICS,
    rouge_keys: Sequence[str] = _DEFAULT_ROUGE_KEYS,
    bleu_tokenize: BleuTokenize = "13a",
) -> Callable[..., dict[str, float]]:
    """A `compute_metrics(eval_pred, compute_result=None)` scoring generated text against the references.

    Args:
        tokenizer: decodes predictions and labels (`batch_decode`).
        metrics: any of `sacrebleu`, `rouge`, `exact_match`.
        rouge_keys: ROUGE variants reported (F-measure), e.g. `rouge1`, `rouge2`, `rougeL`, `rougeLsum`.
        bleu_tokenize: SacreBLEU tokenizer (`13a`, `intl`, `char`, `none`...; see torchmetrics).

    Raises:
        ValueError: a missing tokenizer, an unknown metric name, or empty `metrics`.
    """
    if tokenizer is None or not hasattr(tokenizer, "batch_decode"):
        raise ValueError(
            f"`tokenizer` is required by build_text_metrics to decode token ids into text (got {tokenizer!r}); pass "
            "the tokenizer used for the dataset."
        )
    unknown = [m for m in metrics if m not in TEXT_METRICS]
    if unknown or not metrics:
        raise ValueError(f"`metrics`={list(metrics)!r} is not valid; allowed: {', '.join(TEXT_METRICS)}.")
    return _TextMetrics(tokenizer, metrics, rouge_keys, bleu_tokenize)
