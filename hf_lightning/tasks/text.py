"""Text task presets: sequence classification (single / pair), token classification, causal LM and masked LM.

Each preprocessing function is one `datasets.map` pass (two for the LMs), so its result is cached by `datasets`
and a second process (or a second run) reads the cache instead of tokenising again. Heavy imports stay inside the
functions: importing this module is cheap.
"""

from __future__ import annotations

from typing import Any

from hf_lightning.tasks.task import Task, register_task

__all__ = ["token_accuracy", "accuracy", "group_texts"]


def _require_columns(dataset: Any, columns: list[str]) -> None:
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"data: column(s) {missing} not found in the dataset; available columns: {dataset.column_names} "
            "(set data.text_column / data.text_pair_column / data.label_column)."
        )


def _map(dataset: Any, fn: Any, spec: Any, desc: str, remove: list[str] | None = None) -> Any:
    return dataset.map(
        fn, batched=True, remove_columns=dataset.column_names if remove is None else remove,
        num_proc=spec.preprocessing_num_workers, desc=desc,
    )


def _label_id(label2id: dict[str, int] | None, value: Any, column: str) -> int:
    if label2id is None:
        raise ValueError(f"data.{column}: labels {value!r} need a label list (data.label_list), none was built.")
    try:
        return label2id[str(value)]
    except KeyError:
        raise ValueError(f"data.{column}: label {value!r} is not in the label list {list(label2id)}.") from None


# ----- sequence classification -----
def classification_labels(dataset: Any, spec: Any) -> list[Any]:
    """The label values of a classification split."""
    _require_columns(dataset, [spec.label_column])
    return list(dataset[spec.label_column])


def preprocess_classification(dataset: Any, tokenizer: Any, spec: Any, label2id: dict[str, int] | None) -> Any:
    """Tokenise `text_column` (and `text_pair_column`); map labels to ids when the split has them."""
    columns = [spec.text_column] + ([spec.text_pair_column] if spec.text_pair_column else [])
    _require_columns(dataset, columns)
    has_labels = spec.label_column in dataset.column_names

    def encode(batch: dict[str, list]) -> Any:
        pairs = batch[spec.text_pair_column] if spec.text_pair_column else None
        out = tokenizer(batch[spec.text_column], pairs, truncation=True, max_length=spec.max_length)
        if has_labels:
            out["labels"] = [_label_id(label2id, v, spec.label_column) for v in batch[spec.label_column]]
        return out

    return _map(dataset, encode, spec, "tokenising")


def accuracy(pred: Any) -> dict[str, float]:
    """Share of examples whose arg-max logit is the label."""
    import numpy as np

    logits = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
    return {"accuracy": float((np.asarray(logits).argmax(-1) == pred.label_ids).mean())}


def _padding_collator(tokenizer: Any, spec: Any) -> Any:
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer)


# ----- token classification -----
def token_labels(dataset: Any, spec: Any) -> list[Any]:
    """Every tag of every example (the label column holds one tag list per example)."""
    _require_columns(dataset, [spec.label_column])
    return [tag for tags in dataset[spec.label_column] for tag in tags]


def align_labels(word_ids: list[int | None], tags: list[int]) -> list[int]:
    """One label per sub-word: the word's tag on its first sub-word, -100 on the others and on special tokens."""
    labels, previous = [], None
    for word in word_ids:
        labels.append(-100 if word is None or word == previous else tags[word])
        previous = word
    return labels


def preprocess_tokens(dataset: Any, tokenizer: Any, spec: Any, label2id: dict[str, int] | None) -> Any:
    """Tokenise pre-split words (`text_column` holds a word list) and align the per-word tags to sub-words."""
    _require_columns(dataset, [spec.text_column])
    has_labels = spec.label_column in dataset.column_names

    def encode(batch: dict[str, list]) -> Any:
        out = tokenizer(batch[spec.text_column], is_split_into_words=True, truncation=True, max_length=spec.max_length)
        if has_labels:
            out["labels"] = [
                align_labels(out.word_ids(i), [_label_id(label2id, t, spec.label_column) for t in tags])
                for i, tags in enumerate(batch[spec.label_column])
            ]
        return out

    return _map(dataset, encode, spec, "tokenising words")


def token_accuracy(pred: Any) -> dict[str, float]:
    """Accuracy over the labelled sub-words (label != -100)."""
    import numpy as np

    logits = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
    predicted, labels = np.asarray(logits).argmax(-1), np.asarray(pred.label_ids)
    keep = labels != -100
    return {"accuracy": float((predicted[keep] == labels[keep]).mean()) if keep.any() else 0.0}


def _token_collator(tokenizer: Any, spec: Any) -> Any:
    from transformers import DataCollatorForTokenClassification

    return DataCollatorForTokenClassification(tokenizer)


# ----- language modelling -----
def group_texts(batch: dict[str, list[list[int]]], block_size: int) -> dict[str, list[list[int]]]:
    """Concatenate the token lists and cut them into blocks of `block_size` (the remainder is dropped, as HF's
    run_clm / run_mlm do)."""
    keys = list(batch)
    concatenated = {k: [x for row in batch[k] for x in row] for k in keys}
    total = (len(concatenated[keys[0]]) // block_size) * block_size
    return {k: [v[i:i + block_size] for i in range(0, total, block_size)] for k, v in concatenated.items()}


def _preprocess_lm(dataset: Any, tokenizer: Any, spec: Any, causal: bool) -> Any:
    _require_columns(dataset, [spec.text_column])

    def encode(batch: dict[str, list]) -> Any:
        out = tokenizer(batch[spec.text_column])
        return {k: out[k] for k in ("input_ids", "attention_mask")}

    def blocks(batch: dict[str, list]) -> Any:
        out = group_texts(batch, spec.block_size)
        if causal:
            out["labels"] = [list(ids) for ids in out["input_ids"]]
        return out

    tokenised = _map(dataset, encode, spec, "tokenising")
    grouped = _map(tokenised, blocks, spec, f"grouping into blocks of {spec.block_size}", remove=[])
    if len(grouped) == 0:
        raise ValueError(
            f"data.block_size={spec.block_size}: the split has fewer tokens than one block; lower block_size."
        )
    return grouped


def preprocess_causal_lm(dataset: Any, tokenizer: Any, spec: Any, label2id: Any = None) -> Any:
    """Tokenise, group into blocks, labels = input ids (the model shifts them)."""
    return _preprocess_lm(dataset, tokenizer, spec, causal=True)


def preprocess_masked_lm(dataset: Any, tokenizer: Any, spec: Any, label2id: Any = None) -> Any:
    """Tokenise and group into blocks; masking happens in the collator (fresh masks every epoch)."""
    return _preprocess_lm(dataset, tokenizer, spec, causal=False)


def _default_collator(tokenizer: Any, spec: Any) -> Any:
    from transformers import default_data_collator

    return default_data_collator


def _mlm_collator(tokenizer: Any, spec: Any) -> Any:
    from transformers import DataCollatorForLanguageModeling

    if tokenizer.mask_token is None:
        raise ValueError("task=masked_lm needs a tokenizer with a mask token (data.special_tokens.mask_token).")
    return DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=spec.mlm_probability)


register_task(Task("text_classification", "AutoModelForSequenceClassification", preprocess_classification,
                   _padding_collator, classification_labels, accuracy))
register_task(Task("token_classification", "AutoModelForTokenClassification", preprocess_tokens, _token_collator,
                   token_labels, token_accuracy))
register_task(Task("causal_lm", "AutoModelForCausalLM", preprocess_causal_lm, _default_collator,
                   length_fields=("block_size",)))
register_task(Task("masked_lm", "AutoModelForMaskedLM", preprocess_masked_lm, _mlm_collator,
                   length_fields=("block_size",)))
