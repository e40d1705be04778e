"""Quickstart: fine-tune a tiny BERT on a generated sentiment task, on CPU, with nothing downloaded.

Run it with `hf-lightning quickstart` (or `python -m hf_lightning.cli.quickstart`). It shows the intended use of the
library, and users copy it:

1. build a tokenizer locally and a small, deterministic text dataset (swap in `AutoTokenizer.from_pretrained` and
   `datasets.load_dataset` for real work);
2. build a model from a config (or `AutoModelForSequenceClassification.from_pretrained`);
3. train with `hf_lightning.Trainer` and the familiar `TrainingArguments`; Lightning options go in
   `lightning_kwargs` (e.g. `{"strategy": "ddp", "devices": 2}`);
4. read the summary: metrics, the best `checkpoint-<step>/`, the saved model and the TensorBoard logs.

CPU threads: without `OMP_NUM_THREADS` the quickstart trains on one thread (`quickstart_threads`). For this tiny
model a second thread gains nothing on an idle machine (8.2 s against 8.5 s on 2 idle cores) and costs many times
that on a busy one (183 s against 38 s on 2 shared cores), and one thread gives the README's numbers to the last
digit on every machine. Set `OMP_NUM_THREADS` to choose another count.
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Mapping
from typing import Any

__all__ = ["build_tokenizer", "make_sentiment_dataset", "main", "quickstart_threads"]

_POSITIVE = ["great", "good", "fun", "wonderful", "brilliant", "lovely", "superb", "enjoyable"]
_NEGATIVE = ["bad", "boring", "awful", "terrible", "dull", "poor", "weak", "tedious"]
_SUBJECTS = ["the movie", "the plot", "the acting", "the music", "the ending", "the cast", "the script", "the film"]
_FILLER = ["really", "quite", "very", "so", "rather", "truly", "somewhat", "honestly"]


def make_sentiment_dataset(n: int, seed: int) -> dict[str, list[Any]]:
    """`n` short reviews; the label is whether positive words outnumber negative ones (a "not" flips a word)."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        score, clauses = 0, []
        for _ in range(rng.randint(1, 3)):
            positive = rng.random() < 0.5
            negated = rng.random() < 0.25
            word = rng.choice(_POSITIVE if positive else _NEGATIVE)
            clauses.append(f"{rng.choice(_SUBJECTS)} was {'not ' if negated else ''}{rng.choice(_FILLER)} {word}")
            score += 1 if positive != negated else -1
        if score == 0:  # break ties with one more clear clause
            word = rng.choice(_POSITIVE)
            clauses.append(f"{rng.choice(_SUBJECTS)} was {word}")
            score = 1
        texts.append(" and ".join(clauses))
        labels.append(int(score > 0))
    return {"text": texts, "label": labels}


def build_tokenizer(corpus: list[str]) -> Any:
    """A word-level tokenizer trained on `corpus`, wrapped as a `PreTrainedTokenizerFast` (saved with checkpoints)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special_tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=special_tokens))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")),
                                                 ("[SEP]", tokenizer.token_to_id("[SEP]"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    )


_SHOWN = ("eval_accuracy", "eval_loss")


def quickstart_threads(environ: Mapping[str, str]) -> int | None:
    """The torch thread count the quickstart sets: 1 when `OMP_NUM_THREADS` is unset or empty, else None (the
    user's choice stands)."""
    return None if environ.get("OMP_NUM_THREADS", "").strip() else 1


def _has_checkpoints(folder: str) -> bool:
    return os.path.isdir(folder) and any(name.startswith("checkpoint-") for name in os.listdir(folder))


def _fresh_run_dir(root: str) -> str:
    """`root/run-<n>` with the first n not used yet, so running the quickstart again keeps the earlier runs."""
    n = 1
    while os.path.exists(os.path.join(root, f"run-{n}")):
        n += 1
    return os.path.join(root, f"run-{n}")


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train, evaluate and print where the checkpoints and logs are; returns the final eval metrics."""
    parser = argparse.ArgumentParser(prog="hf-lightning quickstart", description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default=None,
                        help="where checkpoints and logs go (default: a new quickstart_output/run-<n>)")
    parser.add_argument("--num_train_epochs", type=float, default=3.0)
    parser.add_argument("--max_steps", type=int, default=-1)
    parser.add_argument("--train_size", type=int, default=2000)
    opts = parser.parse_args(argv)
    if opts.output_dir is None:
        opts.output_dir = _fresh_run_dir("quickstart_output")
    elif _has_checkpoints(opts.output_dir):
        # the quickstart keeps each run in its own folder (a run would replace the checkpoints there, as HF)
        parser.error(f"--output_dir {opts.output_dir} already holds checkpoints of an earlier run; choose another "
                     "folder or delete them (leave --output_dir out to get a new quickstart_output/run-<n>).")

    import torch
    from datasets import Dataset
    from transformers import BertConfig, BertForSequenceClassification, set_seed

    import hf_lightning
    from hf_lightning.cli.summary import fit_summary, logger_paths

    threads = quickstart_threads(os.environ)
    if threads is not None:  # said in the first line, so nothing about the run is silently different
        torch.set_num_threads(threads)
        print(f"CPU threads: {threads} (OMP_NUM_THREADS is unset; the quickstart's model is too small to gain from "
              "more, and a busy machine slows every extra thread down)")

    # 1. Data and tokenizer (real work: datasets.load_dataset(...) and AutoTokenizer.from_pretrained(...)).
    raw_train = Dataset.from_dict(make_sentiment_dataset(opts.train_size, seed=0))
    raw_eval = Dataset.from_dict(make_sentiment_dataset(400, seed=1))
    tokenizer = build_tokenizer(raw_train["text"])

    def tokenize(batch: dict[str, list]) -> Any:
        return tokenizer(batch["text"], truncation=True, max_length=48)

    train = raw_train.map(tokenize, batched=True, remove_columns=["text"])
    evaluation = raw_eval.map(tokenize, batched=True, remove_columns=["text"])

    # 2. Model (real work: AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=2)).
    # Seed first: the new layers' initial weights come from the random generator (HF's example scripts do the same;
    # the Trainer's own `set_seed(args.seed)` comes too late for a model built before it).
    set_seed(42)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        num_labels=2,  # type: ignore[call-arg]  # a PretrainedConfig argument that BertConfig's signature omits
    )
    model = BertForSequenceClassification(config)

    def accuracy(pred: Any) -> dict[str, float]:
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}

    # 3. Train: the HF arguments you know; Lightning options in lightning_kwargs.
    args = hf_lightning.TrainingArguments(
        output_dir=opts.output_dir,
        num_train_epochs=opts.num_train_epochs,
        max_steps=opts.max_steps,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=64,
        learning_rate=3e-3,
        weight_decay=0.01,
        warmup_steps=0.1,
        logging_steps=20,
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        seed=42,
    )
    trainer = hf_lightning.Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        compute_metrics=accuracy,
        lightning_kwargs={"accelerator": "cpu", "devices": 1},
    )
    result = trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model()

    # 4. How it went and where things are.
    print(fit_summary(trainer.state, args, train_metrics=result.metrics, model_dir=args.resolved_output_dir,
                      logs=logger_paths(trainer.lightning_trainer)))
    print("Final model: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k in _SHOWN))
    return metrics


if __name__ == "__main__":
    main()
