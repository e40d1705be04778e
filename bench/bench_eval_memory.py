"""Peak memory and throughput of evaluating a GPT-2 LM: `hf_lightning` with streaming metrics vs `transformers.Trainer`
with `compute_metrics` on the full logits.

Case: `GPT2LMHeadModel` with vocab 8192 and sequences of 64 tokens (n_embd 64, 2 layers, 2 heads: a narrow model
keeps the run short; the logits, which are what HF accumulates, have the full vocab x sequence size), synthetic
token rows, `per_device_eval_batch_size=16`, one thread, CPU. Both runners report the same two metrics, token
accuracy and perplexity of the next token (labels = inputs, shifted):

- `ours`: `hf_lightning.Trainer(compute_metrics=...)` with torchmetrics `Perplexity` and
  `MulticlassAccuracy` fed per batch (`CombinedMetrics` of two `StreamingMetrics(..., shift_labels=True)`);
  nothing is accumulated but the per-sample batch losses.
- `hf`: `transformers.Trainer(compute_metrics=fn)` where `fn(EvalPrediction)` gets every logit of the eval set
  (samples x 64 x 8192 float32 = 2 MiB per sample) and computes the same two numbers row by row (so the metric
  itself adds no big temporary).

Memory: each (runner, size) runs in a fresh Python process; the number is the process's peak resident set size,
`resource.getrusage(RUSAGE_SELF).ru_maxrss` (Linux: KiB), over the whole process (imports, model, dataset,
evaluation). `rss_before_eval` (VmRSS just before `evaluate()`) is reported too, so the growth caused by the
evaluation itself is `peak - before`. Throughput: eval samples / wall time of the `evaluate()` call.

Allocator: glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which the 32 MiB
per-batch logits come from the heap. Anything small kept per batch then lands in the hole a freed logits block left,
the next batch's logits no longer fit there, and the heap grows with the number of batches (ours kept a 64-byte loss
array per batch until that became a Python float: 3 GiB at 16k samples before, 662 MiB after). `--malloc fixed`
(default) runs every worker with `MALLOC_MMAP_THRESHOLD_=65536` (what the runners keep, without allocator history);
`--malloc default` shows glibc's default behaviour, which is what users get.

HF sizes whose logits alone exceed `--hf-max-gib` (default 5 GiB: 2 GiB of logits at 1k samples, 8 GiB at 4k,
32 GiB at 16k, and HF's concatenation briefly holds two copies) are not run and reported as such.

Usage::

    python bench/bench_eval_memory.py                       # ours 1k/4k/16k, hf 1k/2k (~5 min on 2 cores)
    python bench/bench_eval_memory.py --sizes 1024 4096 --hf-max-gib 20 --json out.json
    python bench/bench_eval_memory.py --malloc default --hf-sizes           # ours only, glibc's default malloc
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

VOCAB, SEQ, BATCH = 8192, 64, 16
LOGIT_BYTES_PER_SAMPLE = SEQ * VOCAB * 4


def build_model() -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # HF then counts shifted labels in its eval loss too (see README "Differences")
    return model


def build_dataset(n: int) -> Any:
    import numpy as np
    from datasets import Dataset

    ids = np.random.default_rng(0).integers(0, VOCAB, size=(n, SEQ))
    return Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})


def hf_metrics(pred: Any) -> dict[str, float]:
    """Token accuracy and perplexity of the next token from the full logits, row by row (no large temporaries)."""
    import numpy as np

    logits, labels = pred.predictions, pred.label_ids
    nll, correct, count = 0.0, 0, 0
    for row, target in zip(logits, labels):
        row, target = row[:-1].astype(np.float64), target[1:]
        keep = target != -100
        row, target = row[keep], target[keep]
        top = row.max(-1, keepdims=True)
        log_norm = np.log(np.exp(row - top).sum(-1)) + top[:, 0]
        nll += float((log_norm - row[np.arange(len(target)), target]).sum())
        correct += int((row.argmax(-1) == target).sum())
        count += len(target)
    return {"accuracy": correct / count, "perplexity": float(np.exp(nll / count))}


def streaming_metrics() -> Any:
    from torchmetrics.classification import MulticlassAccuracy
    from torchmetrics.text import Perplexity

    from hf_lightning.module.metrics import CombinedMetrics, StreamingMetrics

    return CombinedMetrics(
        StreamingMetrics(MulticlassAccuracy(VOCAB, average="micro", ignore_index=-100), argmax=True, shift_labels=True,
                         name="accuracy"),
        StreamingMetrics(Perplexity(ignore_index=-100), shift_labels=True, name="perplexity"),
    )


def rss_now_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(runner: str, samples: int) -> dict[str, Any]:
    """One evaluation in this (fresh) process; returns its numbers."""
    import torch

    torch.set_num_threads(1)
    model, data = build_model(), build_dataset(samples)
    common = dict(output_dir=tempfile.mkdtemp(), per_device_eval_batch_size=BATCH, report_to="none",
                  disable_tqdm=True, use_cpu=True)
    if runner == "ours":
        import hf_lightning

        trainer = hf_lightning.Trainer(
            model=model, args=hf_lightning.TrainingArguments(**common), eval_dataset=data,
            compute_metrics=streaming_metrics(), eval_loss_weighting="tokens",
            lightning_kwargs={"accelerator": "cpu", "enable_progress_bar": False, "logger": False})
    else:
        import transformers

        trainer = transformers.Trainer(model=model, args=transformers.TrainingArguments(**common), eval_dataset=data,
                                       compute_metrics=hf_metrics)
    before = rss_now_mib()
    start = time.perf_counter()
    metrics = trainer.evaluate()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"runner": runner, "samples": samples, "peak_rss_mib": round(peak, 1),
            "rss_before_eval_mib": round(before, 1),
            "eval_seconds": round(seconds, 3), "samples_per_second": round(samples / seconds, 2),
            "accuracy": metrics["eval_accuracy"], "perplexity": metrics["eval_perplexity"],
            "eval_loss": metrics["eval_loss"]}


def run_fresh(runner: str, samples: int, malloc: str) -> dict[str, Any]:
    env = dict(os.environ)
    if malloc == "fixed":
        env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 16)  # see the module docstring: no dynamic threshold, no heap growth
    out = subprocess.run([sys.executable, __file__, "--worker", runner, str(samples)], capture_output=True, text=True,
                         check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{runner} {samples} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--hf-sizes", type=int, nargs="*", default=[1024, 2048, 4096, 16384])
    parser.add_argument("--malloc", choices=["fixed", "default"], default="fixed",
                        help="fixed: MALLOC_MMAP_THRESHOLD_=64KiB in the workers; default: glibc's dynamic threshold")
    parser.add_argument("--hf-max-gib", type=float, default=5.0, help="skip HF sizes whose logits exceed this")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", nargs=2, metavar=("RUNNER", "SAMPLES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]))))
        return
    results: list[dict[str, Any]] = []
    for samples in args.sizes:
        results.append({**run_fresh("ours", samples, args.malloc), "malloc": args.malloc})
        print(json.dumps(results[-1]), flush=True)
    for samples in args.hf_sizes:
        gib = samples * LOGIT_BYTES_PER_SAMPLE / 2**30
        if gib > args.hf_max_gib:
            skipped = f"logits alone {gib:.1f} GiB > --hf-max-gib"
            results.append({"runner": "hf", "samples": samples, "skipped": skipped})
        else:
            results.append({**run_fresh("hf", samples, args.malloc), "malloc": args.malloc})
        print(json.dumps(results[-1]), flush=True)
    ours = {r["samples"]: r for r in results if r["runner"] == "ours"}
    hf = {r["samples"]: r for r in results if r["runner"] == "hf" and "skipped" not in r}
    print("\nrunner  samples  peak RSS MiB  RSS before eval  growth MiB  samples/s")
    for r in results:
        if "skipped" in r:
            print(f"{r['runner']:6}  {r['samples']:7}  skipped: {r['skipped']}")
            continue
        print(f"{r['runner']:6}  {r['samples']:7}  {r['peak_rss_mib']:12.0f}  {r['rss_before_eval_mib']:15.0f}  "
              f"{r['peak_rss_mib'] - r['rss_before_eval_mib']:10.0f}  {r['samples_per_second']:9.1f}")
    if len(ours) > 1:
        lo, hi = ours[min(ours)], ours[max(ours)]
        ratio = hi["peak_rss_mib"] / lo["peak_rss_mib"]
        print(f"\nours peak {min(ours)} -> {max(ours)} samples: x{ratio:.3f} (target <= 1.10: "
              f"{'met' if ratio <= 1.10 else 'NOT met'})")
    if len(hf) > 1:
        lo, hi = hf[min(hf)], hf[max(hf)]
        print(f"hf   peak {min(hf)} -> {max(hf)} samples: x{hi['peak_rss_mib'] / lo['peak_rss_mib']:.3f}")
    for n in sorted(set(ours) & set(hf)):
        speed = ours[n]["samples_per_second"] / hf[n]["samples_per_second"]
        print(f"throughput ours/hf at {n}: x{speed:.2f} (target >= 1: {'met' if speed >= 1 else 'NOT met'}); "
              f"perplexity ours {ours[n]['perplexity']:.4f} hf {hf[n]['perplexity']:.4f}, accuracy ours "
              f"{ours[n]['accuracy']:.5f} hf {hf[n]['accuracy']:.5f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
