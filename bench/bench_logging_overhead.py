"""Cost of logging every update: `hf_lightning.Trainer` with `logging_steps=1` vs `logging_steps=100`.

What runs
---------
The small GPT-2 case of `bench_throughput.py` (`common.CASES["gpt2"]`), trained by the facade with the TensorBoard
logger enabled (`report_to="tensorboard"`, the default Lightning `TensorBoardLogger` that hf_lightning builds, writing
into a fresh temporary `output_dir`), `logging_strategy="steps"`, no saving, no evaluation, no progress bar, and
`lightning_kwargs={"accelerator": "cpu", "enable_progress_bar": False}`. The two variants differ only in
`logging_steps`:

- `log1`:   every update writes a log entry (`loss`, `grad_norm`, `learning_rate`, `epoch`) to `log_history`, to
  HF callbacks' `on_log` and to TensorBoard;
- `log100`: no entry during a run of fewer than 100 updates (only the final train summary, after the timed span).

Each run checks what it wrote: `len(state.log_history)` and the number of `train/loss` scalars in the TensorBoard
event files (must be one per update for `log1`).

Timing
------
As `bench_throughput.py` (see `common.py`): steady-state updates/s after `--warmup` updates, timed from HF
`on_step_end` (the logging of an update happens after its `on_step_end`, so it lands in the next interval and is
counted). The two variants are interleaved, order alternating per repeat; `torch.set_num_threads(--threads)` and
`gc.collect()` before every run. Reported: median over repeats and the ratio `log1 / log100` (target >= 0.97, i.e.
logging every update costs at most 3%).

Usage::

    python bench/bench_logging_overhead.py --repeats 5 --steps 30 --warmup 5
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_throughput import _share, quiet  # noqa: E402
from common import (  # noqa: E402
    CASES,
    SEED,
    Case,
    RunResult,
    StepTimer,
    add_common_flags,
    make_result,
    median,
    median_others_share,
    rotate,
    run_isolated,
)

VARIANTS: dict[str, int] = {"log1": 1, "log100": 100}
"""Variant name -> `logging_steps`."""

TARGET = 0.97
"""`log1 / log100` steady-state ratio must be at least this (within 3%)."""


def count_tensorboard_scalars(log_dir: str, tag: str = "train/loss") -> int:
    """Number of `tag` scalars in the TensorBoard event files under `log_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    count = 0
    for path in glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            count += len(acc.Scalars(tag))
    return count


def run_facade(case: Case, logging_steps: int, steps: int, warmup: int, output_dir: str) -> RunResult:
    """One facade run with TensorBoard logging every `logging_steps` updates."""
    import hf_lightning

    timer = StepTimer()
    args = hf_lightning.TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=case.batch_size,
        seed=SEED,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="steps",
        logging_steps=logging_steps,
        report_to="tensorboard",
        disable_tqdm=True,
    )
    trainer = hf_lightning.Trainer(
        model=case.build_model(),
        args=args,
        train_dataset=case.build_dataset(steps * case.batch_size),
        callbacks=[timer],
        lightning_kwargs={"accelerator": "cpu", "enable_progress_bar": False},
    )
    start = time.perf_counter()
    out = trainer.train()
    total = time.perf_counter() - start
    result = make_result(f"log{logging_steps}", timer, warmup, total, out.global_step, out.training_loss)
    result.extra = {
        "log_history_entries": len(trainer.state.log_history),
        "tensorboard_train_loss_scalars": count_tensorboard_scalars(output_dir),
    }
    return result


def check_written(result: RunResult, logging_steps: int, steps: int) -> None:
    """Fail loudly if the run did not log what `logging_steps` asks for (the benchmark would measure nothing)."""
    expected = steps // logging_steps
    got = result.extra["tensorboard_train_loss_scalars"]
    if got != expected:
        raise RuntimeError(f"logging_steps={logging_steps}: expected {expected} train/loss scalars, found {got}.")


def run_all(case: Case, steps: int, warmup: int, opts: argparse.Namespace) -> dict[str, list[RunResult]]:
    """All repeats, the two variants interleaved (order alternating)."""
    results: dict[str, list[RunResult]] = {name: [] for name in VARIANTS}
    repeats = opts.repeats
    for rep in range(repeats):
        for name in rotate(list(VARIANTS), rep):
            run = functools.partial(run_facade, case, VARIANTS[name], steps, warmup)
            result = run_isolated(run, opts.threads, opts.quiet_wait, opts.max_others)
            check_written(result, VARIANTS[name], steps)
            results[name].append(result)
            print(
                f"  [rep {rep + 1}/{repeats}] {name:6s} steady {result.steady_ups:6.3f} upd/s  "
                f"median-step {result.median_step_ups:6.3f}  cpu {result.cpu_ups:6.3f}  train() {result.total_s:6.2f} s  "
                f"log entries {result.extra['log_history_entries']:3d}  "
                f"tb train/loss {result.extra['tensorboard_train_loss_scalars']:3d}  others {_share(result.others_share)}",
                flush=True,
            )
    return results


def summarize(results: dict[str, list[RunResult]]) -> dict[str, Any]:
    """Medians per variant and metric, and the `log1 / log100` ratio of the medians."""
    metrics = {"steady": "steady_ups", "median-step": "median_step_ups", "cpu-time": "cpu_ups"}
    rates = {m: {n: median([getattr(r, a) for r in runs]) for n, runs in results.items()} for m, a in metrics.items()}
    ratios = {m: values["log1"] / values["log100"] for m, values in rates.items()}
    return {
        "updates_per_s": rates,
        "others_share": median_others_share(results),
        "ratio_log1_over_log100": ratios,
        "target": TARGET,
        "target_met": ratios["steady"] >= TARGET,
        "runs": {name: [vars(r) for r in runs] for name, runs in results.items()},
    }


def print_summary(summary: dict[str, Any]) -> None:
    """Human-readable summary."""
    rates = summary["updates_per_s"]
    print(f"\n== logging overhead: median over repeats (other processes used {_share(summary['others_share'])} of "
          "the CPU, median over runs) ==")
    print(f"{'variant':8s} {'steady upd/s':>13s} {'median-step upd/s':>18s} {'upd/CPU-s':>10s}")
    for name in VARIANTS:
        print(f"{name:8s} {rates['steady'][name]:13.3f} {rates['median-step'][name]:18.3f} {rates['cpu-time'][name]:10.3f}")
    for metric, ratio in summary["ratio_log1_over_log100"].items():
        verdict = f"   target >= {TARGET:.2f}: {'MET' if ratio >= TARGET else 'MISSED'}" if metric == "steady" else ""
        print(f"  log1/log100 [{metric}] {ratio:.3f}x{verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=CASES["gpt2"].default_steps, help="updates per run (< 100)")
    parser.add_argument("--warmup", type=int, default=CASES["gpt2"].default_warmup)
    add_common_flags(parser)
    parser.add_argument("--json", default=None, help="write the summary to this JSON file")
    args = parser.parse_args(argv)
    if args.steps >= 100:
        parser.error("--steps must be below 100 so that the logging_steps=100 variant logs nothing while timed.")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet()
    torch.set_num_threads(args.threads)
    case = CASES["gpt2"]
    print(f"## {case.description}: logging_steps 1 vs 100, TensorBoard on, {args.steps} updates ({args.warmup} "
          f"warmup), {args.repeats} repeats, {args.threads} threads, torch {torch.__version__}", flush=True)
    summary = summarize(run_all(case, args.steps, args.warmup, args))
    print_summary(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
