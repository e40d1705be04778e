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
event files (must be one per update for `log1`). Each training log entry is also timed directly (the flow's
`steps._log_training`, wrapped on the trainer instance), which gives the logging cost without the run-to-run noise of
the throughput ratio.

Timing
------
As `bench_throughput.py` (see `common.py`): steady-state updates/s after `--warmup` updates, timed from HF
`on_step_end` (the logging of an update happens after its `on_step_end`, so it lands in the next interval and is
counted). The two variants are interleaved, order alternating per repeat (with `--lockstep`, they take turns
update by update in two processes, see `lockstep.py`); `torch.set_num_threads(--threads)` and
`gc.collect()` before every run. Reported: median over repeats, the ratio `log1 / log100` of the medians (target
>= 0.97, i.e. logging every update costs at most 3%) and the per-repeat paired ratios.

`--aa` runs `logging_steps=100` against itself instead: the ratio it reports is what this method gives for two
identical configurations, i.e. the noise floor a `log1 / log100` ratio must be read against.

`--throughput` compares `include_throughput=True` with `False`, both logging every update (the worst case: every
entry computes `tokens_per_second`, and the tokens are counted at every update); target: on / off >= 0.99. `--case bert`
runs the tiny BERT case instead of GPT-2 (an update is ~10 ms there, so per-update costs show most).

Usage::

    python bench/bench_logging_overhead.py --repeats 5 --steps 30 --warmup 5
    python bench/bench_logging_overhead.py --repeats 7 --lockstep      # turn-taking processes, see lockstep.py
    python bench/bench_logging_overhead.py --repeats 7 --lockstep --aa # the same method, A/A: the noise floor
    python bench/bench_logging_overhead.py --repeats 7 --lockstep --throughput [--case bert --steps 99 --warmup 9]
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
    paired_ratios,
    rotate,
    run_isolated,
    run_mode,
    use_heap_malloc,
    wait_for_quiet,
)
from lockstep import run_lockstep  # noqa: E402

VARIANTS: dict[str, tuple[int, bool]] = {"log1": (1, False), "log100": (100, False)}
"""Variant name -> (`logging_steps`, `include_throughput`); the reported ratio is first / second."""

AA_VARIANTS: dict[str, tuple[int, bool]] = {"log100a": (100, False), "log100b": (100, False)}
"""`--aa`: two identical variants, whose ratio shows the noise floor of the method on this machine."""

THROUGHPUT_VARIANTS: dict[str, tuple[int, bool]] = {"tput_on": (1, True), "tput_off": (1, False)}
"""`--throughput`: our tokens/s and MFU logging on and off, both logging every update."""

THROUGHPUT_TARGET = 0.99
"""`tput_on / tput_off` steady-state ratio must be at least this."""

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


def run_facade(case: Case, variant: tuple[int, bool], steps: int, warmup: int, output_dir: str) -> RunResult:
    """One facade run with TensorBoard logging every `logging_steps` updates (and `include_throughput`)."""
    logging_steps, throughput = variant
    import hf_lightning

    timer = StepTimer(steps)
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
        include_throughput=throughput,
    )
    trainer = hf_lightning.Trainer(
        model=case.build_model(),
        args=args,
        train_dataset=case.build_dataset(steps * case.batch_size),
        callbacks=[timer],
        lightning_kwargs={"accelerator": "cpu", "enable_progress_bar": False},
    )
    log_calls = time_log_entries(trainer)
    start = time.perf_counter()
    out = trainer.train()
    total = time.perf_counter() - start
    name = f"log{logging_steps}" + ("+tput" if throughput else "")
    result = make_result(name, timer, warmup, total, out.global_step, out.training_loss)
    result.extra = {
        "log_history_entries": len(trainer.state.log_history),
        "tensorboard_train_loss_scalars": count_tensorboard_scalars(output_dir),
        "ms_per_training_log_entry": 1e3 * median(log_calls) if log_calls else 0.0,
    }
    return result


def time_log_entries(trainer: Any) -> list[float]:
    """Time every training-loss log entry of this trainer (`HFLoopSteps._log_training`: reduce the loss window,
    read grad norm / LR, `log_history`, `on_log`, TensorBoard); returns the list the durations are appended to.

    The wrapper is set on this trainer's `flow.steps` instance only (the class is not touched). It gives the logging
    cost directly, free of the run-to-run noise of the throughput ratio.
    """
    durations: list[float] = []
    steps = trainer.flow.steps  # the flow's per-update work (hf_lightning/flow/steps.py) writes the log entries
    inner = steps._log_training

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - start)

    steps._log_training = timed
    return durations


def check_written(result: RunResult, logging_steps: int, steps: int) -> None:
    """Fail loudly if the run did not log what `logging_steps` asks for (the benchmark would measure nothing)."""
    expected = steps // logging_steps
    got = result.extra["tensorboard_train_loss_scalars"]
    if got != expected:
        raise RuntimeError(f"logging_steps={logging_steps}: expected {expected} train/loss scalars, found {got}.")


def run_all(
    case: Case, variants: dict[str, tuple[int, bool]], steps: int, warmup: int, opts: argparse.Namespace
) -> dict[str, list[RunResult]]:
    """All repeats, the two variants interleaved (order alternating)."""
    results: dict[str, list[RunResult]] = {name: [] for name in variants}
    repeats = opts.repeats
    for rep in range(repeats):
        order = rotate(list(variants), rep)
        runs = [functools.partial(run_facade, case, variants[name], steps, warmup) for name in order]
        if opts.lockstep:
            wait_for_quiet(opts.max_others, opts.quiet_wait)
            rep_results = run_lockstep(runs, opts.threads)
        else:
            rep_results = [run_isolated(run, opts.threads, opts.quiet_wait, opts.max_others) for run in runs]
        for name, result in zip(order, rep_results):
            check_written(result, variants[name][0], steps)
            results[name].append(result)
            print(
                f"  [rep {rep + 1}/{repeats}] {name:6s} steady {result.steady_ups:6.3f} upd/s  "
                f"median-step {result.median_step_ups:6.3f}  cpu {result.cpu_ups:6.3f}  "
                f"train() {result.total_s:6.2f} s  "
                f"log entries {result.extra['log_history_entries']:3d} {_entry_cost(result)}  "
                f"tb train/loss {result.extra['tensorboard_train_loss_scalars']:3d}  "
                f"others {_share(result.others_share)}",
                flush=True,
            )
    return results


def _entry_cost(result: RunResult) -> str:
    ms = result.extra["ms_per_training_log_entry"]
    return f"({ms:.2f} ms each)" if ms else "(no training entry)"


def summarize(results: dict[str, list[RunResult]]) -> dict[str, Any]:
    """Medians per variant and metric, and the first / second variant ratio of the medians (and per repeat)."""
    metrics = {"steady": "steady_ups", "median-step": "median_step_ups", "cpu-time": "cpu_ups"}
    rates = {m: {n: median([getattr(r, a) for r in runs]) for n, runs in results.items()} for m, a in metrics.items()}
    first, second = list(results)
    ratios = {m: values[first] / values[second] for m, values in rates.items()}
    paired = paired_ratios([r.steady_ups for r in results[first]], [r.steady_ups for r in results[second]])
    entry_ms = median([r.extra["ms_per_training_log_entry"] for r in results[first]])
    update_ms = 1e3 / rates["steady"][second]
    return {
        "ratio_name": f"{first}/{second}",
        "ms_per_training_log_entry": entry_ms,
        "log_entry_share_of_update": entry_ms / update_ms,
        "paired_steady_ratio": paired,
        "updates_per_s": rates,
        "others_share": median_others_share(results),
        "ratio": ratios,
        "target": _target(f"{first}/{second}"),
        "target_met": ratios["steady"] >= _target(f"{first}/{second}") if _target(f"{first}/{second}") else None,
        "runs": {name: [vars(r) for r in runs] for name, runs in results.items()},
    }


def _target(ratio_name: str) -> float | None:
    return {"log1/log100": TARGET, "tput_on/tput_off": THROUGHPUT_TARGET}.get(ratio_name)


def print_summary(summary: dict[str, Any]) -> None:
    """Human-readable summary."""
    rates = summary["updates_per_s"]
    print(f"\n== logging overhead: median over repeats (other processes used {_share(summary['others_share'])} of "
          "the CPU, median over runs) ==")
    name = summary["ratio_name"]
    print(f"{'variant':8s} {'steady upd/s':>13s} {'median-step upd/s':>18s} {'upd/CPU-s':>10s}")
    for variant in rates["steady"]:
        print(
            f"{variant:8s} {rates['steady'][variant]:13.3f} {rates['median-step'][variant]:18.3f} "
            f"{rates['cpu-time'][variant]:10.3f}"
        )
    for metric, ratio in summary["ratio"].items():
        target = _target(name) if metric == "steady" else None
        verdict = f"   target >= {target:.2f}: {'MET' if ratio >= target else 'MISSED'}" if target else ""
        print(f"  {name} [{metric}] {ratio:.3f}x{verdict}")
    if summary["ms_per_training_log_entry"]:
        print(f"  one training log entry costs {summary['ms_per_training_log_entry']:.3f} ms = "
              f"{summary['log_entry_share_of_update']:.3%} of an update (timed directly, median)")
    paired = summary["paired_steady_ratio"]
    print(f"  {name} [steady, per-repeat pairs] median {paired['median']:.3f}x, "
          f"quartiles {paired['q1']:.3f}x - {paired['q3']:.3f}x (n={paired['n']})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=CASES["gpt2"].default_steps, help="updates per run (< 100)")
    parser.add_argument("--warmup", type=int, default=CASES["gpt2"].default_warmup)
    add_common_flags(parser)
    parser.add_argument("--aa", action="store_true",
                        help="A/A run: logging_steps=100 against itself, to see the method's noise floor")
    parser.add_argument("--throughput", action="store_true",
                        help="include_throughput on vs off, both with logging_steps=1")
    parser.add_argument("--case", choices=["gpt2", "bert"], default="gpt2")
    parser.add_argument("--json", default=None, help="write the summary to this JSON file")
    args = parser.parse_args(argv)
    if args.steps >= 100:
        parser.error("--steps must be below 100 so that the logging_steps=100 variant logs nothing while timed.")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.heap_malloc:
        use_heap_malloc()
    quiet()
    torch.set_num_threads(args.threads)
    case = CASES[args.case]
    variants = AA_VARIANTS if args.aa else THROUGHPUT_VARIANTS if args.throughput else VARIANTS
    print(f"## {case.description}: {' vs '.join(variants)} ((logging_steps, include_throughput) "
          f"{' vs '.join(map(str, variants.values()))}), "
          f"TensorBoard on, {args.steps} updates ({args.warmup} warmup), {args.repeats} repeats, "
          f"{args.threads} threads, "
          f"{run_mode(args)}, torch {torch.__version__}", flush=True)
    summary = summarize(run_all(case, variants, args.steps, args.warmup, args))
    print_summary(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
