"""Train a tiny sentence-transformers model with `SentenceTransformerTrainer` on HF's Trainer or on hf_lightning's.

Run by tests/test_sentence_transformers.py as a subprocess (the swap of `transformers.Trainer` is process-wide), also
under `torchrun --nproc_per_node 2` for the 2-process runs.
Usage: python st_train.py BASE OUT_DIR MODE [RESUME_FROM]
BASE: `hf` (sentence-transformers on `transformers.Trainer`) or `ours` (`hf_lightning.use_as_transformers_trainer()`
first). MODE: `train` (4 updates, an evaluator every 2, a checkpoint every 2), `resume` (the same run resumed from
RESUME_FROM), `best` (`train` with `load_best_model_at_end` on the evaluator's metric), `pairs` (`train` with a loss
that is a mean over pairs, `CosineSimilarityLoss`, and no dropout: 2 processes of 4 pairs then do the math of 1 of 8).
The model is a tiny BERT built from a config and a local word-level tokenizer (no hub), written to OUT_DIR/base once
so that both bases load the same weights. Writes OUT_DIR/result.json on the main process: the log history, the
global step and the model's weights after `train()` (to compare with the checkpoints' files).
"""

import json
import os
import random
import sys

BASE, OUT_DIR, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
RESUME_FROM = sys.argv[4] if len(sys.argv) > 4 else None

if BASE == "ours":
    import hf_lightning

    hf_lightning.use_as_transformers_trainer()  # before sentence-transformers is imported

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from sentence_transformers import (  # noqa: E402
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
)
from sentence_transformers.base.modules.transformer import Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator  # noqa: E402
from sentence_transformers.sentence_transformer.losses import (  # noqa: E402
    CosineSimilarityLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402

WORDS = [f"w{i}" for i in range(40)]
HIDDEN = 16


def write_base(folder: str, dropout: float) -> None:
    """A tiny BERT and its word-level tokenizer, saved for `Transformer(folder)`."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    core = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def sentences(n: int, rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 8))) for _ in range(n)]


def main() -> None:
    base = os.path.join(OUT_DIR, "base")
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0 and not os.path.isdir(base):
        write_base(base, dropout=0.0 if MODE == "pairs" else 0.1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every process loads the base once rank 0 has written it
        import time

        deadline = time.time() + 120
        while not os.path.isfile(os.path.join(base, "tokenizer_config.json")) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
    model = SentenceTransformer(modules=[Transformer(base), Pooling(HIDDEN)], device="cpu")
    rng = random.Random(0)
    train = Dataset.from_dict({"anchor": sentences(32, rng), "positive": sentences(32, rng)})
    loss = MultipleNegativesRankingLoss(model)  # in-batch negatives: a batch's loss is not a sum over its pairs
    if MODE == "pairs":
        train = train.add_column("score", [rng.random() for _ in range(32)])
        loss = CosineSimilarityLoss(model)
    evaluator = EmbeddingSimilarityEvaluator(sentences(8, rng), sentences(8, rng), [rng.random() for _ in range(8)],
                                             name="dev")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    extra = {}
    if MODE == "best":
        extra = {"load_best_model_at_end": True, "metric_for_best_model": "dev_spearman_cosine",
                 "greater_is_better": False}  # the step-2 checkpoint is the best: loading it shows
    args = SentenceTransformerTrainingArguments(
        output_dir=os.path.join(OUT_DIR, "run"), per_device_train_batch_size=8 // world, max_steps=4,
        save_steps=2, logging_steps=1, eval_strategy="steps", eval_steps=2, seed=3, learning_rate=1e-2,
        report_to="none", disable_tqdm=True, **extra,
    )
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                                         loss=loss, evaluator=evaluator)
    trainer.train(resume_from_checkpoint=RESUME_FROM if MODE == "resume" else None)
    if trainer.is_world_process_zero():
        weights = {name: value.tolist() for name, value in model.state_dict().items()}
        with open(os.path.join(OUT_DIR, "result.json"), "w") as f:
            json.dump({"log_history": trainer.state.log_history, "global_step": trainer.state.global_step,
                       "best_model_checkpoint": trainer.state.best_model_checkpoint,
                       "trainer_class": [c.__module__ for c in type(trainer).__mro__],
                       "weights": weights}, f)


if __name__ == "__main__":
    main()
