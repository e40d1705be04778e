"""An HF example-style script (`run_glue.py` in miniature): the bundled sentiment CSVs, the bundled tokenizer, a tiny
BERT classifier from a config, `Trainer(...).train()`, with either `transformers.Trainer` or `hf_lightning.Trainer`
(the only difference between the two runs). The same task as `configs/text_classification.yaml`.

    python bench/scripts/text_classification.py --trainer hf|ours --output_dir DIR [--max_steps 60 --eval_steps 20
        --save_steps 20] [--exit_at_first_update] [--json OUT]

`--exit_at_first_update` prints `FIRST_UPDATE <time.time()>` at the end of the first optimizer update and exits at
once (start-up measurements); `--json` writes `train_runtime` and the process's peak RSS after training.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "configs" / "data"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", choices=["hf", "ours"], required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=-1)
    parser.add_argument("--eval_steps", type=int, default=None)
    parser.add_argument("--save_steps", type=int, default=None)
    parser.add_argument("--exit_at_first_update", action="store_true")
    parser.add_argument("--json", default=None)
    options = parser.parse_args()

    import datasets
    import numpy as np
    import transformers
    from transformers import BertConfig, BertForSequenceClassification, DataCollatorWithPadding, PreTrainedTokenizerFast

    if options.trainer == "hf":
        from transformers import Trainer, TrainingArguments
    else:
        from hf_lightning import Trainer, TrainingArguments

    raw = datasets.load_dataset("csv", data_files={"train": str(DATA / "sentiment_train.csv"),
                                                   "validation": str(DATA / "sentiment_validation.csv")})
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(DATA / "tokenizer.json"), pad_token="[PAD]",
                                        unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    labels = sorted(set(raw["train"]["label"]))
    label2id = {name: i for i, name in enumerate(labels)}

    def encode(batch):
        out = tokenizer(batch["text"], truncation=True, max_length=64)
        out["labels"] = [label2id[v] for v in batch["label"]]
        return out

    tokenized = raw.map(encode, batched=True, remove_columns=["text", "label"])
    transformers.set_seed(42)
    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, hidden_size=64,
                        num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, max_position_embeddings=128,
                        num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label2id)
    model = BertForSequenceClassification(config)

    def compute_metrics(pred):
        return {"accuracy": float((np.asarray(pred.predictions).argmax(-1) == pred.label_ids).mean())}

    steps = options.eval_steps is not None
    args = TrainingArguments(
        output_dir=options.output_dir, num_train_epochs=3, max_steps=options.max_steps,
        per_device_train_batch_size=32, per_device_eval_batch_size=64, learning_rate=3e-3, warmup_steps=0.1,
        logging_steps=8, eval_strategy="steps" if steps else "epoch", eval_steps=options.eval_steps,
        save_strategy="steps" if steps else "epoch", save_steps=options.save_steps or 500, save_total_limit=1,
        load_best_model_at_end=True, metric_for_best_model="accuracy", report_to="none", use_cpu=True,
    )
    callbacks = []
    if options.exit_at_first_update:
        class ExitAtFirstUpdate(transformers.TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                print(f"FIRST_UPDATE {time.time():.6f}", flush=True)
                sys.stdout.flush()
                os._exit(0)

        callbacks.append(ExitAtFirstUpdate())
    trainer = Trainer(model=model, args=args, train_dataset=tokenized["train"], eval_dataset=tokenized["validation"],
                      processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
                      compute_metrics=compute_metrics, callbacks=callbacks)
    output = trainer.train()
    trainer.save_model()
    if options.json:
        Path(options.json).write_text(json.dumps({
            "train_runtime": output.metrics["train_runtime"], "global_step": output.global_step,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "eval_accuracy": trainer.state.best_metric,
        }))


if __name__ == "__main__":
    main()
