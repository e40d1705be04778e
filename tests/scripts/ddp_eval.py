"""Evaluate and predict with `hf_lightning.Trainer` on 1 or 2 CPU processes; dump every rank's results as JSON.

Run by tests/test_evaluation_ddp.py: once as a 2-process subprocess (Lightning's `ddp` launcher re-executes this
script for rank 1), and `collect(1)` in-process for the single-process reference. 101 eval samples with a
per-device batch of 4 do not divide over 2 processes. Three evaluations share the run:
- BERT classification, `compute_metrics` a function that also checks every sample arrives once, in order;
  two named eval sets; then `predict`.
- the same with a streaming torchmetrics `MetricCollection` (state synced across processes).
- GPT-2 on unpadded rows of different lengths (batches of different widths, padded across ranks): `eval_loss`
  sample-weighted (HF) and token-weighted, then `predict` (logits padded with -100).
Usage: python ddp_eval.py OUT_PREFIX DEVICES
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from helpers import classification_dataset, tiny_bert, tiny_gpt2  # noqa: E402
from test_eval_parity import pad_collator, token_rows  # noqa: E402

import hf_lightning  # noqa: E402
from hf_lightning.module.metrics import StreamingMetrics  # noqa: E402

RUNTIME = ("_runtime", "_samples_per_second", "_steps_per_second")


def _trainer(model: Any, devices: int, out_dir: str, **kwargs: Any) -> hf_lightning.Trainer:
    lightning_kwargs: dict[str, Any] = {"accelerator": "cpu", "devices": devices, "enable_progress_bar": False}
    if devices > 1:
        lightning_kwargs["strategy"] = "ddp"
    include = kwargs.pop("include_for_metrics", [])
    args = hf_lightning.TrainingArguments(output_dir=out_dir, per_device_eval_batch_size=4, report_to="none",
                                          disable_tqdm=True, include_for_metrics=include)
    return hf_lightning.Trainer(model=model, args=args, lightning_kwargs=lightning_kwargs, **kwargs)


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not k.endswith(RUNTIME)}


def collect(devices: int, out_dir: str) -> dict[str, Any]:
    """Every result of the three evaluations, as JSON-able values."""
    torch.set_num_threads(1)
    evals = {"main": classification_dataset(101, seed=1), "small": classification_dataset(7, seed=2)}
    expected_inputs = {len(ds): np.array(ds["input_ids"]) for ds in evals.values()}

    def metrics(pred: Any) -> dict[str, float]:
        inputs = expected_inputs[len(pred.label_ids)]
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean()), "n": len(pred.label_ids),
                "in_order": float(np.array_equal(pred.inputs, inputs)), "logit_sum": float(pred.predictions.sum())}

    trainer = _trainer(tiny_bert(), devices, out_dir, eval_dataset=evals, compute_metrics=metrics,
                       include_for_metrics=["inputs"])
    out: dict[str, Any] = {"function": _plain(trainer.evaluate())}
    prediction = trainer.predict(evals["main"])
    out["predictions"] = prediction.predictions.tolist()
    out["label_ids"] = prediction.label_ids.tolist()
    out["predict_metrics"] = _plain(prediction.metrics)
    out["log_entries"] = len(trainer.state.log_history)

    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    collection = MetricCollection({"accuracy": MulticlassAccuracy(2, average="micro"),
                                   "f1": MulticlassF1Score(2, average="macro")})
    trainer = _trainer(tiny_bert(), devices, out_dir, eval_dataset=evals["main"], compute_metrics=collection)
    out["streaming"] = _plain(trainer.evaluate())

    lm_rows = token_rows(101, seed=3, causal=True)
    model = tiny_gpt2()
    model.loss_type = "ForCausalLM"
    from torchmetrics.text import Perplexity

    perplexity = StreamingMetrics(Perplexity(ignore_index=-100), shift_labels=True, name="perplexity")
    trainer = _trainer(model, devices, out_dir, eval_dataset=lm_rows, data_collator=pad_collator,
                       compute_metrics=perplexity)
    out["lm_samples"] = _plain(trainer.evaluate())
    trainer.module.eval_loss_weighting = "tokens"
    out["lm_tokens"] = _plain(trainer.evaluate())
    lm_prediction = trainer.predict(lm_rows)
    out["lm_predictions_shape"] = list(lm_prediction.predictions.shape)
    out["lm_predictions_sha"] = hashlib.sha256(lm_prediction.predictions.tobytes()).hexdigest()
    out["lm_label_ids"] = lm_prediction.label_ids.tolist()
    out["rank"] = int(os.environ.get("LOCAL_RANK", 0))
    return out


def main() -> None:
    prefix, devices = sys.argv[1], int(sys.argv[2])
    result = collect(devices, os.path.join(os.path.dirname(prefix), f"run{devices}"))
    with open(f"{prefix}.rank{result['rank']}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
