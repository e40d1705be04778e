"""Generation evaluation throughput: `hf_lightning.Seq2SeqTrainer.evaluate` vs `transformers.Seq2SeqTrainer.evaluate`
vs hand-written loops calling `model.generate` on the same batches.

What runs
---------
A tiny T5 (`d_model` 64, 2 layers, 2 heads, vocab 1000) built from a config under a fixed seed (identical weights
for every runner), 512 synthetic samples (sources of 8-32 tokens, targets of 4-16), `per_device_eval_batch_size`
32 (16 batches), `max_length` 32, `num_beams` 1 and 4, `DataCollatorForSeq2Seq(model=...)` everywhere:

- `ours`: `hf_lightning.Seq2SeqTrainer(..., lightning_kwargs={"accelerator": "cpu", "logger": False,
  "enable_progress_bar": False})`, `predict_with_generate=True`, `evaluate()`.
- `hf`: `transformers.Seq2SeqTrainer` with the same arguments, `evaluate()`.
- `hand`: a `DataLoader` over the same dataset and collator; per batch `model.generate(...)` and the teacher-forced
  forward for the loss: the work both trainers do.
- `hand_gen`: the same loop with `model.generate` only (no loss).

Both trainers get `compute_metrics=lambda p: {}` (without one, `evaluate` is loss-only and does not generate).

Timing
------
`perf_counter()` and `process_time()` after each batch (HF's `on_prediction_step`, fired per batch by both
trainers; after the batch in the loops). Steady rate = `samples of batches 2..16 / (t[16] - t[1])`: trainer
construction, loop setup and the first batch are excluded; collation, generation, the loss forward, padding and
accumulation are included. Also reported: the wall time of the whole call (setup included), and the *CPU-time* rate
(samples per CPU-second of the process, one thread: time the process was pre-empted by other processes of a shared
machine does not count). Each repeat runs every runner once, the order rotated by one per repeat; medians over
repeats and per-repeat paired ratios are printed. One thread (`torch.set_num_threads`).

Targets: ours >= 1.0x hf, ours >= 0.9x hand (the loop doing the same work).

Usage::

    python bench/bench_generation.py                      # beams 1 and 4, 3 repeats (~1-2 min on 2 cores)
    python bench/bench_generation.py --beams 4 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from common import paired_ratios  # noqa: E402

NUM_SAMPLES, BATCH, MAX_LENGTH, VOCAB = 512, 32, 32, 1000
RUNNERS = ("ours", "hf", "hand", "hand_gen")


def build_model() -> Any:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=VOCAB, d_model=64, d_ff=128, d_kv=32, num_layers=2, num_heads=2, dropout_rate=0.0,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return T5ForConditionalGeneration(config).eval()


def build_dataset() -> Any:
    from datasets import Dataset

    rng = random.Random(0)
    rows: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": []}
    for _ in range(NUM_SAMPLES):
        n = rng.randint(8, 32)
        rows["input_ids"].append([rng.randrange(2, VOCAB) for _ in range(n - 1)] + [1])
        rows["attention_mask"].append([1] * n)
        rows["labels"].append([rng.randrange(2, VOCAB) for _ in range(rng.randint(3, 15))] + [1])
    return Dataset.from_dict(rows)


def tokenizer() -> Any:
    """A word-level tokenizer with T5's special ids (only its pad id / padding is used)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t2")), pad_token="<pad>",
                                   eos_token="</s>")


class BatchTimer:
    """HF `TrainerCallback` stamping each evaluation batch (`on_prediction_step`)."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        stamps = self.stamps = []

        class _CB(TrainerCallback):
            def on_prediction_step(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
                stamps.append((time.perf_counter(), time.process_time()))

        self.callback = _CB()


def _steady(stamps: list[tuple[float, float]]) -> tuple[float, float]:
    """Samples per wall second and per CPU second over batches 2..n (every batch is full: 512 = 16 x 32)."""
    samples = (len(stamps) - 1) * BATCH
    return samples / (stamps[-1][0] - stamps[0][0]), samples / (stamps[-1][1] - stamps[0][1])


def _trainer_args(cls: Any, out: str, beams: int, **extra: Any) -> Any:
    return cls(output_dir=out, per_device_eval_batch_size=BATCH, predict_with_generate=True,
               generation_max_length=MAX_LENGTH, generation_num_beams=beams, report_to="none", disable_tqdm=True,
               **extra)


def run_ours(beams: int, data: Any) -> tuple[tuple[float, float], float, float]:
    import hf_lightning
    from transformers import DataCollatorForSeq2Seq

    model, timer = build_model(), BatchTimer()
    with tempfile.TemporaryDirectory() as out:
        trainer = hf_lightning.Seq2SeqTrainer(
            model=model, args=_trainer_args(hf_lightning.Seq2SeqTrainingArguments, out, beams),
            data_collator=DataCollatorForSeq2Seq(tokenizer(), model=model), processing_class=tokenizer(),
            compute_metrics=lambda p: {}, callbacks=[timer.callback],
            lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False,
                              "enable_model_summary": False},
        )
        start = time.perf_counter()
        metrics = trainer.evaluate(data)
        total = time.perf_counter() - start
    return _steady(timer.stamps), total, metrics["eval_loss"]


def run_hf(beams: int, data: Any) -> tuple[tuple[float, float], float, float]:
    import transformers
    from transformers import DataCollatorForSeq2Seq

    model, timer = build_model(), BatchTimer()
    with tempfile.TemporaryDirectory() as out:
        trainer = transformers.Seq2SeqTrainer(
            model=model, args=_trainer_args(transformers.Seq2SeqTrainingArguments, out, beams, use_cpu=True),
            data_collator=DataCollatorForSeq2Seq(tokenizer(), model=model), processing_class=tokenizer(),
            compute_metrics=lambda p: {}, callbacks=[timer.callback],
        )
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # it prints the metrics dict
        start = time.perf_counter()
        metrics = trainer.evaluate(data)
        total = time.perf_counter() - start
    return _steady(timer.stamps), total, metrics["eval_loss"]


def run_hand(beams: int, data: Any, with_loss: bool) -> tuple[tuple[float, float], float, float]:
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForSeq2Seq

    model = build_model()
    start = time.perf_counter()
    loader = DataLoader(data, batch_size=BATCH, collate_fn=DataCollatorForSeq2Seq(tokenizer(), model=model))
    stamps, losses = [], []
    with torch.no_grad():
        for batch in loader:
            model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           max_length=MAX_LENGTH, num_beams=beams)
            if with_loss:
                losses.append(model(**batch).loss.item())
            stamps.append((time.perf_counter(), time.process_time()))
    total = time.perf_counter() - start
    return _steady(stamps), total, statistics.mean(losses) if losses else float("nan")


def main(argv: list[str] | None = None) -> None:
    global NUM_SAMPLES  # --samples sets the module's row count (build_dataset and the rates read it)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=str, default=None)
    parser.add_argument("--samples", type=int, default=NUM_SAMPLES, help=f"rows evaluated (default {NUM_SAMPLES})")
    args = parser.parse_args(argv)
    NUM_SAMPLES = args.samples
    torch.set_num_threads(args.threads)
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    data = build_dataset()
    run = {"ours": run_ours, "hf": run_hf, "hand": lambda b, d: run_hand(b, d, True),
           "hand_gen": lambda b, d: run_hand(b, d, False)}
    report: dict[str, Any] = {}
    for beams in args.beams:
        rates: dict[str, list[float]] = {r: [] for r in RUNNERS}
        cpu_rates: dict[str, list[float]] = {r: [] for r in RUNNERS}
        totals: dict[str, list[float]] = {r: [] for r in RUNNERS}
        for repeat in range(args.repeats):
            order = RUNNERS[repeat % len(RUNNERS):] + RUNNERS[: repeat % len(RUNNERS)]
            for runner in order:
                gc.collect()
                (rate, cpu_rate), total, loss = run[runner](beams, data)
                rates[runner].append(rate)
                cpu_rates[runner].append(cpu_rate)
                totals[runner].append(total)
                print(f"beams={beams} repeat={repeat} {runner:9s} {rate:8.1f} samples/s (steady)  "
                      f"{cpu_rate:8.1f} samples/CPU-s  {NUM_SAMPLES / total:8.1f} samples/s (whole call)  "
                      f"loss={loss:.4f}", flush=True)
        med = {r: statistics.median(v) for r, v in rates.items()}
        cpu = {r: statistics.median(v) for r, v in cpu_rates.items()}
        summary = {
            "median_steady": med,
            "median_cpu": cpu,
            "cpu_ours_vs_hf": cpu["ours"] / cpu["hf"],
            "cpu_ours_vs_hand": cpu["ours"] / cpu["hand"],
            "cpu_ours_vs_hand_gen": cpu["ours"] / cpu["hand_gen"],
            "median_whole_call": {r: NUM_SAMPLES / statistics.median(v) for r, v in totals.items()},
            "ours_vs_hf": med["ours"] / med["hf"],
            "ours_vs_hand": med["ours"] / med["hand"],
            "ours_vs_hand_gen": med["ours"] / med["hand_gen"],
            "paired_ours_vs_hf": paired_ratios(rates["ours"], rates["hf"]),
            "paired_ours_vs_hand": paired_ratios(rates["ours"], rates["hand"]),
        }
        report[f"beams_{beams}"] = summary
        print(f"\nbeams={beams}: median steady samples/s " + ", ".join(f"{r} {v:.1f}" for r, v in med.items()))
        print(f"  ours/hf {summary['ours_vs_hf']:.3f} (target >= 1.0)   ours/hand {summary['ours_vs_hand']:.3f} "
              f"(target >= 0.9)   ours/hand_gen {summary['ours_vs_hand_gen']:.3f}")
        print(f"  per CPU-second: " + ", ".join(f"{r} {v:.1f}" for r, v in cpu.items())
              + f"; ours/hf {summary['cpu_ours_vs_hf']:.3f}, ours/hand {summary['cpu_ours_vs_hand']:.3f}, "
              f"ours/hand_gen {summary['cpu_ours_vs_hand_gen']:.3f}\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
