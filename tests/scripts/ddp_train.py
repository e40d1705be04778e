"""Train a tiny BERT with `hf_lightning.Trainer` on 1 or 2 CPU processes and dump the log history as JSON.

Run by tests/test_ddp.py as a subprocess (Lightning's `ddp` launcher re-executes this script for rank 1).
Usage: python ddp_train.py OUT_JSON DEVICES PER_DEVICE_BATCH [MODE[,MODE...]]
Several modes, comma-separated, run one after another in ONE launch (the processes and the process group are shared:
a launch costs more than a run); each writes OUT_JSON with `-MODE` before its suffix (`out.json` -> `out-ddp.json`).
MODE: `ddp` (default: `lightning_kwargs={"strategy": "ddp"}`), `hf-ddp` (no strategy given: Lightning chooses DDP and
gets HF's `ddp_*` options), `hf-fsdp2` (`fsdp="full_shard auto_wrap"`: FSDP2 with the default per-layer sharding),
`tokens` (`ddp` with `include_num_input_tokens_seen="all"` and `include_throughput=True`), `split` (`ddp` with
`accelerator_config` `split_batches`, `even_batches=False` and `sync_each_batch`: the per-device batch sizes are those
of all processes together, each process reads its part).
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from helpers import classification_dataset, tiny_bert  # noqa: E402

import hf_lightning  # noqa: E402


def main(out_json: str, devices: int, batch: int, mode: str) -> None:
    strategy_args = {
        "ddp": {},
        "tokens": {"include_num_input_tokens_seen": "all", "include_throughput": True},
        "hf-ddp": {"ddp_find_unused_parameters": False, "ddp_bucket_cap_mb": 1, "ddp_broadcast_buffers": False,
                   "ddp_static_graph": True, "ddp_timeout": 600},
        "hf-fsdp2": {"fsdp": "full_shard auto_wrap", "fsdp_config": {"transformer_layer_cls_to_wrap": ["BertLayer"]}},
        "split": {"accelerator_config": {"split_batches": True, "even_batches": False,
                                         "gradient_accumulation_kwargs": {"sync_each_batch": True}}},
    }[mode]
    split = devices if mode == "split" else 1  # the batch sizes given are those of all processes together
    args = hf_lightning.TrainingArguments(
        output_dir=os.path.join(os.path.dirname(out_json), f"run{devices}-{mode}"),
        per_device_train_batch_size=batch * split, per_device_eval_batch_size=4 * split, learning_rate=1e-3,
        max_steps=6, logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="no",
        gradient_accumulation_steps=2, disable_tqdm=True, report_to="none", optim="adamw_torch", max_grad_norm=1.0,
        **strategy_args,
    )

    def metrics(pred):
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean()), "n": len(pred.label_ids)}

    kwargs = {"accelerator": "cpu", "devices": devices}
    if devices > 1 and mode in ("ddp", "tokens", "split"):
        kwargs["strategy"] = "ddp"
    trainer = hf_lightning.Trainer(
        model=tiny_bert(), args=args, train_dataset=classification_dataset(64),
        eval_dataset=classification_dataset(21, seed=1), compute_metrics=metrics, lightning_kwargs=kwargs,
    )
    trainer.train()
    prediction = trainer.predict(classification_dataset(21, seed=1))
    strategy = trainer.lightning_trainer.strategy
    timeout = getattr(strategy, "_timeout", None)
    if trainer.lightning_trainer.is_global_zero:
        with open(out_json, "w") as f:
            json.dump({"log_history": trainer.state.log_history,
                       "predictions": prediction.predictions.tolist(),
                       "strategy": type(strategy).__name__,
                       "batch_sizes": [trainer.get_train_dataloader().batch_sampler.batch_size,
                                       trainer.get_train_dataloader().total_batch_size],
                       "ddp_kwargs": getattr(strategy, "_ddp_kwargs", None),
                       "timeout_s": timeout.total_seconds() if timeout is not None else None,
                       "sharded": sorted({type(m).__name__ for m in trainer.model.modules()
                                          if type(m).__name__.startswith("FSDP")})}, f)


if __name__ == "__main__":
    modes = (sys.argv[4] if len(sys.argv) > 4 else "ddp").split(",")
    for name in modes:
        stem, suffix = os.path.splitext(sys.argv[1])
        main(sys.argv[1] if len(modes) == 1 else f"{stem}-{name}{suffix}", int(sys.argv[2]), int(sys.argv[3]), name)
