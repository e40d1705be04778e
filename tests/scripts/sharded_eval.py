"""Evaluation, prediction, generation and saving under FSDP2 on 1 or 2 CPU processes (gloo); dumps results as JSON.

Run by tests/test_sharded_eval.py: once as a 2-process subprocess (Lightning's launcher re-executes this script for
rank 1; every later trainer of the script joins the same two processes), and `collect(1)` in-process for the
single-process reference. Under FSDP2 every forward all-gathers weights, so a rank with fewer eval batches than the
other must run padding steps (`module/eval_run.py`); before that fix the first uneven evaluation died with gloo's
"collective mismatch". One launch covers:

- the facade with HF's `fsdp="full_shard auto_wrap"`: four eval sets of 1, 3, 9 and 101 rows in one `evaluate()`
  (the padding runs between datasets too), with per-device batches of 2 (divides none) and 3 (divides 3 and 9),
  `compute_metrics` checking each row arrives once in order, then `predict()` on each set;
- the CLI's `validate` and `predict` on `configs/causal_lm.yaml`'s own validation set, FSDP2 through `--args.fsdp`
  and through a plain `ModelParallelStrategy` in `trainer.strategy`;
- generation evaluation (`predict_with_generate`, `synced_gpus` by default under FSDP2) of a T5 and of a
  decoder-only GPT-2 on 5 rows in batches of 2 (3 + 2 rows), counting each rank's `generate` calls;
- `save_model()` of the FSDP2 GPT-2 (tied `lm_head.weight`), whose file must hold the single-process tensors;
- `train()` with an evaluation after each of its 2 updates on 9 rows (the evaluations inside training).

tests/test_gpu_uneven_eval.py runs the same with FSDP1 and DeepSpeed ZeRO-3 on GPUs (no CLI part there).

Usage: python sharded_eval.py OUT_DIR DEVICES [STRATEGY [ACCELERATOR]] (from the repository root: the CLI config
names data files there). STRATEGY: a key of `STRATEGY_ARGS`, default "fsdp2" on several devices, else "plain";
ACCELERATOR: "cpu" (default) or "gpu".
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `sharded_eval.RecordForwards` for the CLI runs

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gen_helpers import prompt_completion_dataset, seq2seq_dataset, tiny_gpt2_lm, tiny_t5, word_tokenizer  # noqa: E402
from helpers import tiny_gpt2  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402
from test_eval_parity import pad_collator, token_rows  # noqa: E402
from transformers import DataCollatorForSeq2Seq  # noqa: E402

import hf_lightning  # noqa: E402
from hf_lightning.tasks.text_metrics import build_text_metrics  # noqa: E402

RUNTIME = ("_runtime", "_samples_per_second", "_steps_per_second")
SIZES = (1, 3, 9, 101)
BATCH_SIZES = (2, 3)
FSDP = "full_shard auto_wrap"
STRATEGY_ARGS: dict[str, dict[str, Any]] = {
    "plain": {}, "fsdp2": {"fsdp": FSDP}, "fsdp1": {"fsdp": FSDP, "fsdp_config": {"version": 1}},
    "zero3": {"deepspeed": {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                            "train_batch_size": "auto", "zero_optimization": {"stage": 3}}},
}
"""The HF arguments of each strategy (FSDP1 and DeepSpeed need CUDA)."""
MP_STRATEGY = ("trainer:\n  strategy:\n    class_path: lightning.pytorch.strategies.ModelParallelStrategy\n"
               "    init_args: {data_parallel_size: 2, tensor_parallel_size: 1}\n")


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not k.endswith(RUNTIME)}


def _sha(array: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _lightning(devices: int, accelerator: str) -> dict[str, Any]:
    return {"accelerator": accelerator, "devices": devices, "enable_progress_bar": False, "logger": False,
            "enable_model_summary": False}


def _facade(devices: int, out_dir: str, result: dict[str, Any], strategy: str, accelerator: str) -> None:
    evals = {f"n{n}": token_rows(n, seed=n, causal=True) for n in SIZES}
    expected = {len(ds): ds["input_ids"] for ds in evals.values()}

    def metrics(pred: Any) -> dict[str, float]:
        rows = [[int(t) for t in row if t not in (0, -100)] for row in pred.inputs]  # ids >= 3; pads: 0, -100
        return {"n": len(rows), "in_order": float(rows == expected[len(rows)]),
                "logit_sum": float(pred.predictions.astype(np.float64).sum())}

    for batch_size in BATCH_SIZES:
        model = tiny_gpt2()
        model.loss_type = "ForCausalLM"
        args = hf_lightning.TrainingArguments(
            output_dir=os.path.join(out_dir, f"facade{batch_size}"), per_device_eval_batch_size=batch_size,
            report_to="none", disable_tqdm=True, include_for_metrics=["inputs"], **STRATEGY_ARGS[strategy],
        )
        trainer = hf_lightning.Trainer(model=model, args=args, eval_dataset=evals, data_collator=pad_collator,
                                       compute_metrics=metrics, lightning_kwargs=_lightning(devices, accelerator))
        result[f"facade_bs{batch_size}"] = _plain(trainer.evaluate())
        for name, dataset in evals.items():
            prediction = trainer.predict(dataset)
            result[f"predict_bs{batch_size}_{name}"] = {
                "shape": list(prediction.predictions.shape), "sha": _sha(prediction.predictions),
                "sum": float(prediction.predictions.astype(np.float64).sum()),
                "label_ids": prediction.label_ids.tolist(), "metrics": _plain(prediction.metrics)}
        if batch_size == BATCH_SIZES[0]:
            result["strategy"] = type(trainer.lightning_trainer.strategy).__name__
            if strategy == "fsdp2":  # the run was sharded (else this test proves nothing about FSDP2)
                from torch.distributed.tensor import DTensor

                result["facade_sharded"] = any(isinstance(p, DTensor) for p in trainer.model.parameters())
            saved = os.path.join(out_dir, "saved_model")
            trainer.save_model(saved)  # every rank: the gather is a collective
            result["saved_model"] = saved


def _fit(devices: int, out_dir: str, result: dict[str, Any], strategy: str, accelerator: str) -> None:
    """Evaluations inside `train()` (every update, on the 9-row set: 3 + 2 batches) reach their log entries."""
    model = tiny_gpt2()
    model.loss_type = "ForCausalLM"
    args = hf_lightning.TrainingArguments(
        output_dir=os.path.join(out_dir, "fit"), per_device_train_batch_size=2, per_device_eval_batch_size=2,
        max_steps=2, eval_strategy="steps", eval_steps=1, save_strategy="no", logging_steps=1, report_to="none",
        disable_tqdm=True, **STRATEGY_ARGS[strategy],
    )
    trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=token_rows(16, seed=5, causal=True),
                                   eval_dataset=token_rows(9, seed=9, causal=True), data_collator=pad_collator,
                                   lightning_kwargs=_lightning(devices, accelerator))
    trainer.train()
    result["fit_eval_steps"] = [e["step"] for e in trainer.state.log_history if "eval_loss" in e]


class RecordForwards(Callback):
    """For the CLI runs (`trainer.callbacks`): count this rank's forwards of the model (padding steps included) in each
    `validate` / `predict`, and whether its weights were FSDP2 shards; appended to `forwards.rank<R>.jsonl` in
    `output_dir` at `teardown`, after every hook of the run."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.forwards = 0

        def count(*_: Any) -> None:
            self.forwards += 1

        self.handle = pl_module.model.register_forward_pre_hook(count)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from torch.distributed.tensor import DTensor

        self.handle.remove()
        sharded = any(isinstance(p, DTensor) for p in pl_module.model.parameters())
        out = pl_module.args.resolved_output_dir
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"forwards.rank{trainer.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps({"stage": stage, "forwards": self.forwards, "sharded": sharded}) + "\n")


def _cli(devices: int, out_dir: str, result: dict[str, Any]) -> None:
    from hf_lightning.cli import main

    callbacks = os.path.join(out_dir, "callbacks.yaml")
    with open(callbacks, "w") as f:
        # the config names this script's module: allowed by name, as a user allows their own package
        f.write("allow_code_from: [sharded_eval]\ntrainer:\n  callbacks: [{class_path: sharded_eval.RecordForwards}]\n")
    strategies = {"args_fsdp": ["--args.fsdp", FSDP]} if devices > 1 else {"single": []}
    if devices > 1:
        strategy_file = os.path.join(out_dir, "mp_strategy.yaml")
        with open(strategy_file, "w") as f:
            f.write(MP_STRATEGY)
        strategies["model_parallel"] = ["--config", strategy_file]
    for name, extra in strategies.items():
        out = os.path.join(out_dir, f"cli_{name}")
        common = ["--config", "configs/causal_lm.yaml", "--config", callbacks, *extra,
                  "--trainer.devices", str(devices), "--trainer.enable_progress_bar", "false",
                  "--args.report_to", "none", "--args.output_dir", out]
        argv, sys.argv = sys.argv, sys.argv[:1]  # the CLI's arguments are given: Lightning warns about others
        try:  # (the processes were launched by the first trainer above: nothing re-reads sys.argv now)
            main(["validate", *common])
            main(["predict", *common])
        finally:
            sys.argv = argv
        rank = int(os.environ.get("LOCAL_RANK", 0))
        with open(os.path.join(out, f"forwards.rank{rank}.jsonl")) as f:
            result[f"cli_{name}_forwards"] = [json.loads(line) for line in f]
        if rank == 0:
            with open(os.path.join(out, "eval_results.json")) as f:
                result[f"cli_{name}_eval"] = _plain(json.load(f))
            with np.load(os.path.join(out, "predictions.npz")) as saved:
                result[f"cli_{name}_predictions"] = {key: _sha(saved[key]) for key in saved.files}


def _counting(model: Any) -> Any:
    model.generate_calls = 0
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        model.generate_calls += 1
        model.synced = kwargs.get("synced_gpus")
        return original(*args, **kwargs)

    model.generate = generate
    return model


def _generation(devices: int, out_dir: str, result: dict[str, Any], strategy: str, accelerator: str) -> None:
    tok = word_tokenizer()
    sets = {"t5": (tiny_t5, seq2seq_dataset(tok, 5, seed=1)), "gpt2": (tiny_gpt2_lm, prompt_completion_dataset(tok, 5,
                                                                                                              seed=3))}
    for name, (make, dataset) in sets.items():
        model = _counting(make())
        args = hf_lightning.Seq2SeqTrainingArguments(
            output_dir=os.path.join(out_dir, f"gen_{name}"), per_device_eval_batch_size=2, predict_with_generate=True,
            generation_max_length=12, generation_num_beams=2, report_to="none", disable_tqdm=True,
            **STRATEGY_ARGS[strategy],
        )
        trainer = hf_lightning.Seq2SeqTrainer(
            model=model, args=args, data_collator=DataCollatorForSeq2Seq(tok, model=model), processing_class=tok,
            compute_metrics=build_text_metrics(tok), lightning_kwargs=_lightning(devices, accelerator),
        )
        result[f"gen_{name}_eval"] = _plain(trainer.evaluate(dataset))
        prediction = trainer.predict(dataset)
        result[f"gen_{name}_predictions"] = prediction.predictions.tolist()
        result[f"gen_{name}_labels"] = prediction.label_ids.tolist()
        result[f"gen_{name}_calls"] = model.generate_calls
        result[f"gen_{name}_synced"] = model.synced


def collect(devices: int, out_dir: str, strategy: str | None = None, accelerator: str = "cpu") -> dict[str, Any]:
    """Every result of the run, as JSON-able values (each rank computes the gathered results)."""
    torch.set_num_threads(1)
    os.makedirs(out_dir, exist_ok=True)
    strategy = strategy or ("fsdp2" if devices > 1 else "plain")
    result: dict[str, Any] = {}
    _facade(devices, out_dir, result, strategy, accelerator)
    _generation(devices, out_dir, result, strategy, accelerator)
    _fit(devices, out_dir, result, strategy, accelerator)
    if accelerator == "cpu":
        _cli(devices, out_dir, result)
    result["rank"] = int(os.environ.get("LOCAL_RANK", 0))
    return result


def main() -> None:
    out_dir, devices = sys.argv[1], int(sys.argv[2])
    strategy = sys.argv[3] if len(sys.argv) > 3 else None
    result = collect(devices, out_dir, strategy, sys.argv[4] if len(sys.argv) > 4 else "cpu")
    with open(os.path.join(out_dir, f"rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
