"""Generation evaluation with `hf_lightning.Seq2SeqTrainer` on 1 or 2 CPU processes; dumps results as JSON.

Run by tests/test_generation_ddp.py (Lightning's `ddp` launcher re-executes this script for rank 1). Eval sets of 5
samples in batches of 2 give rank 0 two batches and rank 1 one (different batches than on one process, so the
mean of batch losses differs: the loss is compared on an 8-sample set whose batches are the same).
With `synced_gpus=True` every `generate` call is collective, so a missing call on one rank would hang.
Usage: python ddp_generate.py OUT_PREFIX DEVICES
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from gen_helpers import prompt_completion_dataset, seq2seq_dataset, tiny_gpt2_lm, tiny_t5, word_tokenizer  # noqa: E402
from transformers import DataCollatorForSeq2Seq  # noqa: E402

import hf_lightning  # noqa: E402
from hf_lightning.tasks.text_metrics import build_text_metrics  # noqa: E402

STRIP = ("_runtime", "_samples_per_second", "_steps_per_second")


def _counting(model):
    model.generate_calls = 0
    original = model.generate

    def generate(*args, **kwargs):
        model.generate_calls += 1
        return original(*args, **kwargs)

    model.generate = generate
    return model


def _trainer(model, out_dir, devices):
    tok = word_tokenizer()
    args = hf_lightning.Seq2SeqTrainingArguments(
        output_dir=out_dir, per_device_eval_batch_size=2, predict_with_generate=True, generation_max_length=8,
        generation_num_beams=2, report_to="none", disable_tqdm=True,
    )
    kwargs = {"accelerator": "cpu", "devices": devices, "logger": False, "enable_model_summary": False}
    if devices > 1:
        kwargs["strategy"] = "ddp"
    return tok, hf_lightning.Seq2SeqTrainer(
        model=model, args=args, data_collator=DataCollatorForSeq2Seq(tok, model=model), processing_class=tok,
        compute_metrics=build_text_metrics(tok), lightning_kwargs=kwargs,
    )


def _metrics(metrics):
    return {k: v for k, v in metrics.items() if not k.endswith(STRIP)}


def main() -> None:
    prefix, devices = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    out_dir = os.path.join(os.path.dirname(prefix), f"run{devices}")
    tok, trainer = _trainer(_counting(tiny_t5()), out_dir, devices)
    result = {}
    five = seq2seq_dataset(tok, 5, seed=1)
    prediction = trainer.predict(five)
    result["t5_predictions"] = prediction.predictions.tolist()
    result["t5_labels"] = prediction.label_ids.tolist()
    result["t5_predict_metrics"] = _metrics(prediction.metrics)
    result["t5_eval_even"] = _metrics(trainer.evaluate(seq2seq_dataset(tok, 8, seed=2)))
    calls_before_synced = trainer.model.generate_calls
    result["t5_eval_synced"] = _metrics(trainer.evaluate(five, synced_gpus=True))
    synced_calls = trainer.model.generate_calls - calls_before_synced
    _, lm_trainer = _trainer(_counting(tiny_gpt2_lm()), out_dir + "_lm", devices)
    lm_prediction = lm_trainer.predict(prompt_completion_dataset(tok, 5, seed=3), max_new_tokens=4)
    result["lm_predictions"] = lm_prediction.predictions.tolist()
    result["lm_metrics"] = _metrics(lm_prediction.metrics)
    rank = trainer.lightning_trainer.global_rank if hasattr(trainer, "lightning_trainer") else 0
    rank = int(os.environ.get("LOCAL_RANK", rank))
    with open(f"{prefix}.rank{rank}.json", "w") as f:
        json.dump({"synced_calls": synced_calls, **(result if rank == 0 else {})}, f)


if __name__ == "__main__":
    main()
