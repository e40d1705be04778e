"""Regenerate the small bundled data and tokenizer of configs/ (deterministic; the outputs are committed).

    python configs/data/make_data.py

- sentiment_{train,validation}.csv: text,label (positive / negative) short reviews (hf_lightning.cli.quickstart's generator)
- pairs_{train,validation}.csv: sentence1,sentence2,label (same / different sentiment; one clause each, so a tiny
  model learns the pair task in a few hundred updates: with the multi-clause reviews it stays at chance)
- tags_{train,validation}.jsonl: tokens (word list), tags (POS / NEG / NOT / O per word)
- reverse_{train,validation}.jsonl: source, target (a toy seq2seq task: the target is the source's words reversed)
- reverse_prompts_{train,validation}.jsonl: prompt, completion (the same task in the decoder-only format)
- reverse_preferences_{train,validation}.jsonl: prompt, chosen (the words reversed), rejected (the words in another
  order: the prompt copied, or reversed with two words swapped), TRL's preference format (DPO)
- squad_{train,validation}.jsonl: id, title, context, question, answers {text, answer_start} (SQuAD's layout; the
  context is a review, the question asks how one of its subjects was, the answer is that clause's adjective)
- tokenizer.json: a WordPiece tokenizer with a small vocabulary, so longer words split into sub-words. Its training
  is not reproducible run to run (ties between equally frequent pairs), so it is only written when missing or with
  `--tokenizer`; the data files above are reproducible byte for byte.
"""

from __future__ import annotations

import csv
import json
import os
import random
import sys

from hf_lightning.cli.quickstart import _FILLER, _NEGATIVE, _POSITIVE, _SUBJECTS, make_sentiment_dataset

HERE = os.path.dirname(os.path.abspath(__file__))


def _write_csv(name: str, header: list[str], rows: list[list]) -> None:
    with open(os.path.join(HERE, name), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _tag(word: str) -> str:
    return "POS" if word in _POSITIVE else "NEG" if word in _NEGATIVE else "NOT" if word == "not" else "O"


# whole words of the bundled tokenizer's vocabulary (one token each), so the toy task is about order, not spelling
_REVERSE_WORDS = ["film", "plot", "cast", "music", "script", "acting", "ending", "movie", "great", "wonderful"]


def _write_reverse(split: str, n: int, seed: int) -> None:
    """The toy generation task: 3-5 words -> the same words reversed, as seq2seq and prompt/completion rows."""
    rng = random.Random(seed + 20)
    with open(os.path.join(HERE, f"reverse_{split}.jsonl"), "w") as pairs, \
            open(os.path.join(HERE, f"reverse_prompts_{split}.jsonl"), "w") as prompts:
        for _ in range(n):
            words = [rng.choice(_REVERSE_WORDS) for _ in range(rng.randint(3, 5))]
            source, target = " ".join(words), " ".join(reversed(words))
            pairs.write(json.dumps({"source": source, "target": target}) + "\n")
            prompts.write(json.dumps({"prompt": source, "completion": target}) + "\n")


def _write_preferences(split: str, n: int, seed: int) -> None:
    """The reversal task as preferences: the reversed words chosen, a wrong order of the same words rejected."""
    rng = random.Random(seed + 40)
    with open(os.path.join(HERE, f"reverse_preferences_{split}.jsonl"), "w") as f:
        while n:
            words = [rng.choice(_REVERSE_WORDS) for _ in range(rng.randint(3, 5))]
            chosen = list(reversed(words))
            rejected = list(words)
            if rejected == chosen or rng.random() < 0.5:  # a near miss: reversed with two words swapped
                rejected = list(chosen)
                i, j = rng.sample(range(len(words)), 2)
                rejected[i], rejected[j] = rejected[j], rejected[i]
            if rejected == chosen:  # every order of these words is the same: no preference to learn
                continue
            f.write(json.dumps({"prompt": " ".join(words), "chosen": " ".join(chosen),
                                "rejected": " ".join(rejected)}) + "\n")
            n -= 1


def _write_pairs(split: str, n: int, seed: int) -> None:
    """Sentence pairs, one clause each ("the plot was quite dull"); label: whether both have the same sentiment."""
    rng = random.Random(seed + 30)
    rows = []
    for _ in range(n):
        first, second = rng.random() < 0.5, rng.random() < 0.5
        sentences = [f"{rng.choice(_SUBJECTS)} was {rng.choice(_FILLER)} {rng.choice(_POSITIVE if p else _NEGATIVE)}"
                     for p in (first, second)]
        rows.append([*sentences, "same" if first == second else "different"])
    _write_csv(f"pairs_{split}.csv", ["sentence1", "sentence2", "label"], rows)


def _write_squad(split: str, texts: list[str], seed: int) -> None:
    """SQuAD-like rows: "how was the plot?" over a review, answered by the plot clause's last word (a subject that
    appears once in the review, so the answer is unique)."""
    rng = random.Random(seed + 40)
    with open(os.path.join(HERE, f"squad_{split}.jsonl"), "w") as f:
        for i, context in enumerate(texts):
            clauses = context.split(" and ")
            subjects = [c.split(" was ")[0] for c in clauses]
            unique = [c for c, s in zip(clauses, subjects) if subjects.count(s) == 1 and " was " in c]
            if not unique:
                continue
            clause = rng.choice(unique)
            answer = clause.split()[-1]
            start = context.index(clause) + len(clause) - len(answer)
            f.write(json.dumps({"id": f"{split}-{i}", "title": "reviews", "context": context,
                                "question": f"how was {clause.split(' was ')[0]}?",
                                "answers": {"text": [answer], "answer_start": [start]}}) + "\n")


def main() -> None:
    corpus = []
    for split, n, seed in (("train", 1024, 0), ("validation", 128, 1)):
        data = make_sentiment_dataset(n, seed)
        names = ["negative", "positive"]
        _write_csv(f"sentiment_{split}.csv", ["text", "label"],
                   [[t, names[y]] for t, y in zip(data["text"], data["label"])])
        _write_pairs(split, n, seed)
        with open(os.path.join(HERE, f"tags_{split}.jsonl"), "w") as f:
            for text in data["text"]:
                words = text.split()
                f.write(json.dumps({"tokens": words, "tags": [_tag(w) for w in words]}) + "\n")
        corpus += data["text"]
        _write_reverse(split, n, seed)
        _write_preferences(split, n, seed)
        _write_squad(split, data["text"], seed)

    if os.path.isfile(os.path.join(HERE, "tokenizer.json")) and "--tokenizer" not in sys.argv[1:]:
        return
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
