"""Optimizer updates per second: `hf_lightning.Trainer` vs a hand-written PyTorch loop vs `transformers.Trainer`.

What runs
---------
For each case (`bert`: tiny BERT classifier; `gpt2`: small GPT-2 LM, see `common.CASES`) three runners train the
same freshly initialised model (identical weights, built from a config under a fixed seed) on the same synthetic
`datasets.Dataset` for the same number of optimizer updates, one micro-batch per update:

- `ours`: `hf_lightning.Trainer` with `save_strategy="no"`, `logging_strategy="no"`, `report_to="none"`,
  `disable_tqdm=True` and `lightning_kwargs={"accelerator": "cpu", "enable_progress_bar": False, "logger": False}`.
- `raw`:  a hand-written loop: `DataLoader` over the dataset in HF's seeded order (`randperm(n, seed + epoch)`),
  `default_data_collator`, forward, backward, `clip_grad_norm_(1.0)`, `optimizer.step()`, `scheduler.step()`,
  `zero_grad()`; AdamW (fused, HF's default `adamw_torch_fused`, HF's two parameter groups) + linear schedule;
  `config.use_cache=False` as both trainers set it (GPT-2 would otherwise build a KV cache in every forward).
- `hf`:   `transformers.Trainer` with the same arguments as `ours` (minus `lightning_kwargs`; its
  `PrinterCallback`, which only prints the final summary after the timed span, is removed to keep the output clean).

The dataset holds exactly `steps * batch_size` samples, so every run is one epoch with full batches. A third case,
`overhead` (a nano BERT whose update is almost only framework code), is not a target case: it isolates each
trainer's per-update cost (see also `profile_overhead.py`).

Timing
------
Steady state (see `common.py`): `perf_counter()` at the end of each update (HF `on_step_end` for `ours` and `hf`,
after `zero_grad()` for `raw`); rate = `(steps - warmup) / (t[last] - t[warmup])` (under `--lockstep`, the sum
of the timed updates' own durations, waiting excluded). Trainer construction, `fit`
setup and the first `warmup` updates are excluded; everything between updates is included. Also reported: the
median-step rate, the CPU-time rate and the wall time of the whole `train()` call (setup included), see
`common.py`. Before every run: optionally wait for a quiet machine (`--quiet-wait`), `torch.set_num_threads(--threads)`
(1 by default, see `common.add_common_flags`), `gc.collect()`; during it, the CPU share that other processes took
is measured and printed (`others`). The three runners are interleaved: each repeat runs all three, in an order
rotated by one per repeat so no runner always goes first; with `--lockstep` the runners of a repeat run as separate
processes taking turns one update at a time (`lockstep.py`), which cancels the host's speed drift. `--heap-malloc`
re-runs under glibc settings that avoid the page faults of >= 32 MiB tensors (`common.use_heap_malloc`). Reported:
medians over repeats, ratios of the medians, and the per-repeat paired ratios (median and quartiles).

Targets (judged on the steady-state rate): (gpt2) ours >= 0.98x raw and ours >= 1.0x HF; (bert) ours >= 1.1x HF.

Usage::

    python bench/bench_throughput.py                       # bert + gpt2, 5 repeats, default steps, 1 thread
    python bench/bench_throughput.py --case gpt2 --repeats 3 --steps 40 --warmup 5 --threads 2
    python bench/bench_throughput.py --quiet-wait 120 --json out.json   # shared machine: wait for quiet runs
    python bench/bench_throughput.py --repeats 7 --lockstep             # the most precise ratios on a noisy host
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    CASES,
    SEED,
    TARGET_CASES,
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

Runner = Callable[[Case, int, int, str], RunResult]

TARGETS: dict[str, dict[str, float]] = {
    "gpt2": {"ours/raw": 0.98, "ours/hf": 1.0},
    "bert": {"ours/hf": 1.1},
}


def _common_args(case: Case, steps: int, output_dir: str) -> dict[str, Any]:
    """The `TrainingArguments` fields shared by `ours` and `hf`: no logging, saving, evaluation or progress bar."""
    return {
        "output_dir": output_dir,
        "max_steps": steps,
        "per_device_train_batch_size": case.batch_size,
        "seed": SEED,
        "save_strategy": "no",
        "logging_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
    }


def run_ours(case: Case, steps: int, warmup: int, output_dir: str) -> RunResult:
    """`hf_lightning.Trainer` (the facade) on the case."""
    import hf_lightning

    timer = StepTimer(steps)
    trainer = hf_lightning.Trainer(
        model=case.build_model(),
        args=hf_lightning.TrainingArguments(**_common_args(case, steps, output_dir)),
        train_dataset=case.build_dataset(steps * case.batch_size),
        callbacks=[timer],
        lightning_kwargs={"accelerator": "cpu", "enable_progress_bar": False, "logger": False},
    )
    start = time.perf_counter()
    out = trainer.train()
    total = time.perf_counter() - start
    return make_result("ours", timer, warmup, total, out.global_step, out.training_loss)


def run_hf(case: Case, steps: int, warmup: int, output_dir: str) -> RunResult:
    """`transformers.Trainer` on the case."""
    import transformers

    timer = StepTimer(steps)
    trainer = transformers.Trainer(
        model=case.build_model(),
        args=transformers.TrainingArguments(**_common_args(case, steps, output_dir)),
        train_dataset=case.build_dataset(steps * case.batch_size),
        callbacks=[timer],
    )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # prints the final summary (untimed)
    start = time.perf_counter()
    out = trainer.train()
    total = time.perf_counter() - start
    return make_result("hf", timer, warmup, total, out.global_step, out.training_loss)


def _raw_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """HF's default optimizer: fused AdamW over two groups (decay / no decay, both `weight_decay=0` by default)."""
    no_decay = ("bias", "LayerNorm", "layernorm", "ln_", "norm")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": 0.0},
        {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, fused=True)


def run_raw(case: Case, steps: int, warmup: int, output_dir: str) -> RunResult:
    """The hand-written loop: same data order, batch size, optimizer, schedule and clipping as the trainers."""
    from torch.utils.data import DataLoader
    from transformers import default_data_collator, get_linear_schedule_with_warmup, set_seed

    set_seed(SEED)
    model = case.build_model()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # what both trainers do (HF 5 forces `args.use_cache=False` onto the config)
    dataset = case.build_dataset(steps * case.batch_size)
    timer = StepTimer(steps)
    start = time.perf_counter()
    model.train()
    optimizer = _raw_optimizer(model, lr=5e-5)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=steps)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(SEED)).tolist()
    loader = DataLoader(dataset, batch_size=case.batch_size, sampler=order, collate_fn=default_data_collator)
    losses: list[torch.Tensor] = []
    timer.begin()
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
        timer.mark()
    total = time.perf_counter() - start
    return make_result("raw", timer, warmup, total, len(losses), float(torch.stack(losses).mean()))


RUNNERS: dict[str, Runner] = {"ours": run_ours, "raw": run_raw, "hf": run_hf}


def run_case(case: Case, steps: int, warmup: int, opts: argparse.Namespace) -> dict[str, list[RunResult]]:
    """All repeats of one case, the runners interleaved (order rotated every repeat)."""
    results: dict[str, list[RunResult]] = {name: [] for name in opts.runners}
    repeats, threads = opts.repeats, opts.threads
    for rep in range(repeats):
        order = rotate(opts.runners, rep)
        runs = [functools.partial(RUNNERS[name], case, steps, warmup) for name in order]
        if opts.lockstep:
            wait_for_quiet(opts.max_others, opts.quiet_wait)
            rep_results = run_lockstep(runs, threads)
        else:
            rep_results = [run_isolated(run, threads, opts.quiet_wait, opts.max_others) for run in runs]
        for name, result in zip(order, rep_results):
            results[name].append(result)
            print(
                f"  [{case.name} rep {rep + 1}/{repeats}] {name:4s} steady {result.steady_ups:7.2f} upd/s  "
                f"median-step {result.median_step_ups:7.2f}  cpu {result.cpu_ups:7.2f}  train() {result.total_s:6.2f} s  "
                f"steps {result.steps}  loss {result.loss:.4f}  others {_share(result.others_share)}",
                flush=True,
            )
    return results


def _share(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.0%}"


METRICS = {"steady": "steady_ups", "median-step": "median_step_ups", "cpu-time": "cpu_ups"}
"""Reported rates: name -> `RunResult` attribute (see `common.py`); targets are judged on `steady`."""


def summarize(case: Case, results: dict[str, list[RunResult]]) -> dict[str, Any]:
    """Medians per runner and metric, ratios of the medians (ours/raw, ours/hf), and the target verdicts."""
    rates = {
        metric: {name: median([getattr(r, attr) for r in runs]) for name, runs in results.items()}
        for metric, attr in METRICS.items()
    }
    rates["train() wall"] = {name: 1.0 / median([r.total_s for r in runs]) for name, runs in results.items()}
    ratios = {
        metric: {f"ours/{other}": values["ours"] / values[other] for other in ("raw", "hf") if {"ours", other} <= set(values)}
        for metric, values in rates.items()
    }
    paired = {
        f"ours/{other}": paired_ratios([r.steady_ups for r in results["ours"]], [r.steady_ups for r in results[other]])
        for other in ("raw", "hf")
        if "ours" in results and other in results
    }
    verdicts = {
        key: ratios["steady"][key] >= bound for key, bound in TARGETS.get(case.name, {}).items() if key in ratios["steady"]
    }
    return {
        "case": case.name,
        "description": case.description,
        "updates_per_s": {m: rates[m] for m in METRICS},
        "train_wall_s": {name: median([r.total_s for r in runs]) for name, runs in results.items()},
        "others_share": median_others_share(results),
        "ratios": ratios,
        "paired_steady_ratios": paired,
        "targets": TARGETS.get(case.name, {}),
        "targets_met": verdicts,
        "runs": {name: [vars(r) for r in runs] for name, runs in results.items()},
    }


def print_summary(summary: dict[str, Any]) -> None:
    """Human-readable summary of one case: medians, ratios, target verdicts."""
    rates = summary["updates_per_s"]
    print(f"\n== {summary['case']}: median over repeats (other processes used {_share(summary['others_share'])} "
          "of the CPU, median over runs) ==")
    print(f"{'runner':8s} {'steady upd/s':>13s} {'median-step upd/s':>18s} {'upd/CPU-s':>10s} {'train() s':>10s}")
    for name in rates["steady"]:
        print(
            f"{name:8s} {rates['steady'][name]:13.2f} {rates['median-step'][name]:18.2f} "
            f"{rates['cpu-time'][name]:10.2f} {summary['train_wall_s'][name]:10.2f}"
        )
    for metric, ratios in summary["ratios"].items():
        for key, value in ratios.items():
            target = summary["targets"].get(key) if metric == "steady" else None
            verdict = "" if target is None else f"   target >= {target:.2f}: {'MET' if value >= target else 'MISSED'}"
            print(f"  {key:9s} [{metric}] {value:.3f}x{verdict}")
    for key, stats in summary["paired_steady_ratios"].items():
        print(
            f"  {key:9s} [steady, per-repeat pairs] median {stats['median']:.3f}x, "
            f"quartiles {stats['q1']:.3f}x - {stats['q3']:.3f}x (n={stats['n']})"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="all",
                        help="`all` = bert + gpt2; `overhead` = a nano model, to measure per-update framework cost")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None, help="updates per run (default: per case, bert 200, gpt2 30)")
    parser.add_argument("--warmup", type=int, default=None, help="updates excluded from the steady rate (default: per case)")
    add_common_flags(parser)
    parser.add_argument("--runners", nargs="+", choices=list(RUNNERS), default=list(RUNNERS),
                        help="subset of runners (e.g. `--runners ours` to profile one)")
    parser.add_argument("--json", default=None, help="write the summaries to this JSON file")
    return parser.parse_args(argv)


def quiet() -> None:
    """Silence the trainers' info logs and warnings so the report stays readable."""
    import lightning.pytorch  # noqa: F401 - sets its loggers to INFO on import; lower them afterwards
    import transformers

    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.heap_malloc:
        use_heap_malloc()
    quiet()
    torch.set_num_threads(args.threads)
    summaries = []
    for name in TARGET_CASES if args.case == "all" else [args.case]:
        case = CASES[name]
        steps = args.steps or case.default_steps
        warmup = args.warmup if args.warmup is not None else case.default_warmup
        print(f"\n## {case.description}: {steps} updates ({warmup} warmup), {args.repeats} repeats, "
              f"{args.threads} threads, {run_mode(args)}, torch {torch.__version__}", flush=True)
        summary = summarize(case, run_case(case, steps, warmup, args))
        print_summary(summary)
        summaries.append(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summaries, f, indent=2)


if __name__ == "__main__":
    main()
