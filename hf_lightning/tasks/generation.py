"""Generation task presets: `seq2seq` (encoder-decoder, source -> target) and `causal_lm_generation` (decoder-only,
prompt -> completion), both evaluated by `generate` through `Seq2SeqTransformerModule`.

- `seq2seq`: `text_column` is the source, `target_column` the target; the target ids become `labels`
  (`tokenizer(text_target=...)`, as HF's run_translation / run_summarization), batched by `DataCollatorForSeq2Seq`
  (labels padded with -100).
- `causal_lm_generation`: `text_column` is the prompt, `target_column` the completion, tokenised by
  `hf_lightning.seq2seq.tokenize_prompt_completion` (the documented decoder-only format: labels -100 on the prompt).

Rows without a target (prediction data) keep only the source / prompt: nothing to compare, predictions only.
With `args.predict_with_generate`, `compute_metrics` is `build_text_metrics(tokenizer)` (SacreBLEU, ROUGE, exact
match); without it evaluation is loss-only (the logits would be no text to score). Heavy imports stay in functions.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hf_lightning.args import TrainingArguments
from hf_lightning.seq2seq.args import Seq2SeqTrainingArguments
from hf_lightning.tasks.task import Task, register_task
from hf_lightning.tasks.text import _map, _require_columns

__all__ = ["preprocess_seq2seq", "preprocess_prompt_completion", "text_metrics_for", "write_prediction_texts"]

_MODULE = "hf_lightning.seq2seq.module.Seq2SeqTransformerModule"
_ARGS = "hf_lightning.seq2seq.args.Seq2SeqTrainingArguments"


def preprocess_seq2seq(dataset: Any, tokenizer: Any, spec: Any, label2id: Any = None) -> Any:
    """Tokenise the sources (`text_column`, up to `max_length`) and, when present, the targets (`target_column`,
    up to `max_target_length`) into `labels`."""
    _require_columns(dataset, [spec.text_column])
    has_targets = spec.target_column in dataset.column_names

    def encode(batch: dict[str, list]) -> Any:
        out = tokenizer(batch[spec.text_column], max_length=spec.max_length, truncation=True)
        if has_targets:
            targets = tokenizer(text_target=batch[spec.target_column], max_length=spec.max_target_length,
                                truncation=True)
            out["labels"] = targets["input_ids"]
        return out

    return _map(dataset, encode, spec, "tokenising sources and targets")


def preprocess_prompt_completion(dataset: Any, tokenizer: Any, spec: Any, label2id: Any = None) -> Any:
    """The decoder-only format (`tokenize_prompt_completion`): prompt (`text_column`) then completion
    (`target_column`) ids, labels -100 on the prompt. Without a completion column: the prompts alone, no labels."""
    from hf_lightning.seq2seq.prompts import tokenize_prompt_completion

    _require_columns(dataset, [spec.text_column])
    if spec.target_column not in dataset.column_names:
        def encode_prompts(batch: dict[str, list]) -> Any:
            out = tokenizer(batch[spec.text_column], max_length=spec.max_length, truncation=True)
            return {k: out[k] for k in ("input_ids", "attention_mask")}

        return _map(dataset, encode_prompts, spec, "tokenising prompts")

    def encode(batch: dict[str, list]) -> Any:
        try:
            return tokenize_prompt_completion(batch, tokenizer, spec.max_length, prompt_column=spec.text_column,
                                              completion_column=spec.target_column)
        except ValueError as err:  # name the config key, not the function argument
            raise ValueError(str(err).replace("`max_length`", "data.max_length")) from None

    return _map(dataset, encode, spec, "tokenising prompts and completions")


def _seq2seq_collator(tokenizer: Any, spec: Any) -> Any:
    from transformers import DataCollatorForSeq2Seq

    # no `model=`: the model makes decoder_input_ids from the labels itself (-100 -> pad), so the collator stays
    # model-free and picklable for DataLoader workers
    return DataCollatorForSeq2Seq(tokenizer)


def text_metrics_for(tokenizer: Any, args: TrainingArguments) -> Any:
    """`build_text_metrics(tokenizer)` when the evaluation generates (`predict_with_generate`), else None."""
    if not (isinstance(args, Seq2SeqTrainingArguments) and args.predict_with_generate):  # plain args never generate
        return None
    from hf_lightning.tasks.text_metrics import build_text_metrics

    return build_text_metrics(tokenizer)


def _special_id(tokenizer: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return None


def _seq2seq_defaults(tokenizer: Any) -> dict[str, Any]:
    """Random-init ids from the tokenizer: EOS (or SEP), BOS (or CLS), decoder start = pad (T5's convention)."""
    ids = {"eos_token_id": _special_id(tokenizer, "eos_token_id", "sep_token_id"),
           "bos_token_id": _special_id(tokenizer, "bos_token_id", "cls_token_id"),
           "decoder_start_token_id": _special_id(tokenizer, "pad_token_id")}
    return {k: v for k, v in ids.items() if v is not None}


def _decoder_defaults(tokenizer: Any) -> dict[str, Any]:
    """Random-init EOS / BOS ids from the tokenizer, so generation stops where the completions end."""
    ids = {"eos_token_id": _special_id(tokenizer, "eos_token_id", "sep_token_id"),
           "bos_token_id": _special_id(tokenizer, "bos_token_id", "cls_token_id")}
    return {k: v for k, v in ids.items() if v is not None}


def write_prediction_texts(result: Any, tokenizer: Any, output_dir: str) -> str | None:
    """Write `<output_dir>/predictions.jsonl`: one `{"prediction": text, "reference": text or null}` per row, in
    dataset order; returns its path, or None when the predictions are not token ids (no `predict_with_generate`)."""
    import numpy as np

    from hf_lightning.tasks.text_metrics import decode_ids

    predictions = result.predictions[0] if isinstance(result.predictions, tuple) else result.predictions
    if predictions is None or np.asarray(predictions).dtype.kind not in "iu":
        return None
    texts = decode_ids(predictions, tokenizer)
    references = decode_ids(result.label_ids, tokenizer) if result.label_ids is not None else [None] * len(texts)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "predictions.jsonl")
    with open(path, "w") as f:
        for text, reference in zip(texts, references):
            f.write(json.dumps({"prediction": text, "reference": reference}) + "\n")
    return path


register_task(Task("seq2seq", "AutoModelForSeq2SeqLM", preprocess_seq2seq, _seq2seq_collator, args_class=_ARGS,
                   module_class=_MODULE, build_metrics=text_metrics_for, model_defaults=_seq2seq_defaults,
                   generates=True))
register_task(Task("causal_lm_generation", "AutoModelForCausalLM", preprocess_prompt_completion, _seq2seq_collator,
                   args_class=_ARGS, module_class=_MODULE, build_metrics=text_metrics_for,
                   model_defaults=_decoder_defaults, generates=True))
