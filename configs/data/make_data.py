"""Regenerate the small bundled data and tokenizer of configs/ (deterministic; the outputs are committed).

    python configs/data/make_data.py

- sentiment_{train,validation}.csv: text,label (positive / negative) short reviews (hf_lightning.quickstart's generator)
- pairs_{train,validation}.csv: sentence1,sentence2,label (same / different sentiment)
- tags_{train,validation}.jsonl: tokens (word list), tags (POS / NEG / NOT / O per word)
- tokenizer.json: a WordPiece tokenizer with a small vocabulary, so longer words split into sub-words
"""

from __future__ import annotations

import csv
import json
import os
import random

from hf_lightning.quickstart import _NEGATIVE, _POSITIVE, make_sentiment_dataset

HERE = os.path.dirname(os.path.abspath(__file__))


def _write_csv(name: str, header: list[str], rows: list[list]) -> None:
    with open(os.path.join(HERE, name), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _tag(word: str) -> str:
    return "POS" if word in _POSITIVE else "NEG" if word in _NEGATIVE else "NOT" if word == "not" else "O"


def main() -> None:
    corpus = []
    for split, n, seed in (("train", 1024, 0), ("validation", 128, 1)):
        data = make_sentiment_dataset(n, seed)
        names = ["negative", "positive"]
        _write_csv(f"sentiment_{split}.csv", ["text", "label"],
                   [[t, names[y]] for t, y in zip(data["text"], data["label"])])
        rng = random.Random(seed + 10)
        pairs = []
        for i, (text, label) in enumerate(zip(data["text"], data["label"])):
            j = rng.randrange(n)
            pairs.append([text, data["text"][j], "same" if label == data["label"][j] else "different"])
        _write_csv(f"pairs_{split}.csv", ["sentence1", "sentence2", "label"], pairs)
        with open(os.path.join(HERE, f"tags_{split}.jsonl"), "w") as f:
            for text in data["text"]:
                words = text.split()
                f.write(json.dumps({"tokens": words, "tags": [_tag(w) for w in words]}) + "\n")
        corpus += data["text"]

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=130, special_tokens=special))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer.save(os.path.join(HERE, "tokenizer.json"))


if __name__ == "__main__":
    main()
