"""Cost of the `auto_micro_batch` out-of-memory guard per update when nothing fails: `hf_lightning.Trainer` with
`auto_micro_batch=True` vs the same run without it, in the same process.

What runs
---------
A `common.CASES` case (default `bert`: the tiny BERT, ~10 ms an update, where a per-update cost shows most; `gpt2`
for a larger one), trained by the facade on the CPU, no saving, no evaluation, no logger, no progress bar, one
update per micro-batch. The two variants differ only in `auto_micro_batch`; no update runs out of memory, so the
guard's work is all overhead: an RNG snapshot, the window's split at the size in effect (one piece: the micro-batch
itself), the agreement (no collective on one process) and a call to the (empty) gradient reduction.

What is reported
----------------
- the guard's own time per update, measured directly: `MicroBatchGuard.run_update` minus the try it runs (the
  forwards and backwards), timed on the trainer's guard instance; as a share of the median update of the runs
  without the guard (target <= 1%). This number is free of the run-to-run noise of a throughput ratio.
- steady-state updates/s of both variants (see `common.py`), interleaved, order alternating per repeat, and the
  ratio `guard / plain` of the medians and its paired per-repeat ratios (target >= 0.99; read it against the
  machine's noise, which on a shared 2-core machine is often larger than 1%).

Usage::

    python bench/bench_micro_batch_guard.py --repeats 5 --steps 200 --warmup 20
    python bench/bench_micro_batch_guard.py --case gpt2 --repeats 3 --steps 30 --warmup 5
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    CASES,
    SEED,
    Case,
    RunResult,
    StepTimer,
    add_common_flags,
    make_result,
    median,
    paired_ratios,
    rotate,
    run_isolated,
)

VARIANTS = {"guard": True, "plain": False}
"""Variant name -> `auto_micro_batch`; the reported ratio is guard / plain."""

TARGET = 0.01
"""The guard's own time per update, as a share of an update, must be at most this."""


def time_guard(trainer: Any) -> list[float]:
    """Wrap this trainer's `MicroBatchGuard.run_update` (the instance only) so that each update appends the guard's
    own time: the whole call minus the try (forwards and backwards) it runs."""
    own: list[float] = []
    guard = trainer.module.micro_batch_guard
    if guard is None:
        return own
    inner = guard.run_update

    def timed(window: Any, try_update: Any, *args: Any, **kwargs: Any) -> Any:
        tried = [0.0]

        def timed_try(pieces: Any) -> Any:
            start = time.perf_counter()
            try:
                return try_update(pieces)
            finally:
                tried[0] += time.perf_counter() - start

        start = time.perf_counter()
        try:
            return inner(window, timed_try, *args, **kwargs)
        finally:
            own.append(time.perf_counter() - start - tried[0])

    guard.run_update = timed
    return own


def run_facade(case: Case, auto: bool, steps: int, warmup: int, output_dir: str) -> RunResult:
    """One facade run with or without the guard."""
    import hf_lightning

    timer = StepTimer(steps)
    args = hf_lightning.TrainingArguments(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=case.batch_size, seed=SEED,
        save_strategy="no", eval_strategy="no", logging_steps=max(steps, 1), report_to="none", disable_tqdm=True,
        auto_micro_batch=auto)
    trainer = hf_lightning.Trainer(
        model=case.build_model(), args=args, train_dataset=case.build_dataset(steps * case.batch_size),
        callbacks=[timer], lightning_kwargs={"accelerator": "cpu", "enable_progress_bar": False, "logger": False,
                                             "enable_model_summary": False})
    own = time_guard(trainer)
    start = time.perf_counter()
    out = trainer.train()
    total = time.perf_counter() - start
    result = make_result("guard" if auto else "plain", timer, warmup, total, out.global_step, out.training_loss)
    result.extra = {"guard_ms_per_update": 1e3 * median(own[warmup:] or own) if own else 0.0,
                    "splits": trainer.module.micro_batch_guard.split.train if auto else None}
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), default="bert")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the results to this file")
    add_common_flags(parser)
    opts = parser.parse_args(argv)
    case = CASES[opts.case]
    steps = opts.steps or case.default_steps
    warmup = opts.warmup if opts.warmup is not None else case.default_warmup
    print(f"auto_micro_batch guard overhead: {case.description}, {steps} updates ({warmup} warm-up), "
          f"{opts.repeats} repeat(s), {opts.threads} thread(s)")
    results: dict[str, list[RunResult]] = {name: [] for name in VARIANTS}
    for rep in range(opts.repeats):
        for name in rotate(list(VARIANTS), rep):
            run = functools.partial(run_facade, case, VARIANTS[name], steps, warmup)
            result = run_isolated(run, opts.threads, opts.quiet_wait, opts.max_others)
            if name == "guard" and result.extra["splits"] != 1:
                raise RuntimeError("the guard split a micro-batch: something ran out of memory, nothing is measured")
            results[name].append(result)
            print(f"  [rep {rep + 1}/{opts.repeats}] {name:5s} steady {result.steady_ups:7.2f} upd/s  "
                  f"median-step {result.median_step_ups:7.2f}  guard {result.extra['guard_ms_per_update']:.4f} ms")
    guard_ms = median([r.extra["guard_ms_per_update"] for r in results["guard"]])
    update_ms = 1e3 / median([r.median_step_ups for r in results["plain"]])
    share = guard_ms / update_ms
    ratio = median([r.steady_ups for r in results["guard"]]) / median([r.steady_ups for r in results["plain"]])
    paired = paired_ratios([r.steady_ups for r in results["guard"]], [r.steady_ups for r in results["plain"]])
    print(f"guard's own time per update: {guard_ms:.4f} ms of a {update_ms:.2f} ms update = {100 * share:.3f}% "
          f"(target <= {100 * TARGET:.0f}%: {'met' if share <= TARGET else 'NOT met'})")
    print(f"steady updates/s guard/plain: {ratio:.4f} (paired median {paired['median']:.4f}, "
          f"q1 {paired['q1']:.4f}, q3 {paired['q3']:.4f}, n={paired['n']})")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"guard_ms_per_update": guard_ms, "update_ms": update_ms, "share": share, "ratio": ratio,
                       "paired": paired}, f, indent=1)


if __name__ == "__main__":
    main()
