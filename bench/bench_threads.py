"""The same small fit with torch's default thread count vs one thread, on this machine as it is (and loaded more).

Each run is a fresh `hf-lightning fit --config configs/text_classification.yaml` process (the shipped config: a
2-layer BERT, 96 updates, 3 evaluations, 3 checkpoint saves), with `OMP_NUM_THREADS` unset (torch's default: one
thread per core) or `OMP_NUM_THREADS=1`, alternating (ABAB...) so both see the same background load. `--busy N`
starts N extra processes that spin on the CPU for the whole measurement: a stand-in for the other jobs of a shared
machine, so the loaded case can be reproduced anywhere.

Reported per run: wall time of the process, `train_runtime` (HF's train time, setup excluded), the 1-minute load
average at its start and whether hf_lightning printed its ThreadOversubscriptionWarning; then the medians and the
ratio default / one thread. The final metrics of the two settings are compared too: thread counts change the last
bits of the results, which is why hf_lightning warns instead of changing the thread count itself.

Usage: python bench/bench_threads.py [--repeats 5] [--busy 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _spin(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def run_once(workdir: Path, threads: str, index: int, max_steps: int | None = None) -> dict:
    """One fit in a fresh process; `threads` is "default" or a number for OMP_NUM_THREADS."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads != "default":
        env["OMP_NUM_THREADS"] = threads
    out = workdir / f"run-{index}-{threads}"
    load = os.getloadavg()[0]
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "hf_lightning", "fit", "--config", "configs/text_classification.yaml",
         "--args.output_dir", str(out), "--args.report_to", "none", "--trainer.enable_progress_bar", "false",
         *(["--args.max_steps", str(max_steps)] if max_steps is not None else [])],
        cwd=workdir, env=env, capture_output=True, text=True,
    )
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    train = json.loads((out / "train_results.json").read_text())
    state = json.loads(sorted(out.glob("checkpoint-*"))[-1].joinpath("trainer_state.json").read_text())
    evals = [e for e in state["log_history"] if "eval_loss" in e]
    shutil.rmtree(out)
    return {"threads": threads, "wall_s": wall, "train_runtime_s": float(train["train_runtime"]), "load": load,
            "warned": "ThreadOversubscription" in result.stderr or "threads but only about" in result.stderr,
            "train_loss": float(train["train_loss"]), "eval_loss": evals[-1]["eval_loss"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="extra CPU-spinning processes during the runs")
    parser.add_argument("--json", default=None)
    parser.add_argument("--max-steps", type=int, default=None, help="updates per fit (default: the config's run)")
    opts = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench_threads_"))
    (workdir / "configs").symlink_to(REPO / "configs")
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(opts.busy)]
    for p in spinners:
        p.start()
    runs = []
    try:
        for i in range(opts.repeats):
            for threads in (("default", "1") if i % 2 == 0 else ("1", "default")):
                run = run_once(workdir, threads, i, opts.max_steps)
                runs.append(run)
                print(f"{threads:>7} threads: wall {run['wall_s']:6.1f} s, "
                      f"train_runtime {run['train_runtime_s']:6.1f} s, load {run['load']:.1f}, warned={run['warned']}, eval_loss {run['eval_loss']:.10f}",
                      flush=True)
    finally:
        stop.set()
        for p in spinners:
            p.join()
        shutil.rmtree(workdir, ignore_errors=True)
    import torch

    summary = {"cores": os.cpu_count(), "default_threads": torch.get_num_threads(), "busy": opts.busy}
    for key in ("wall_s", "train_runtime_s"):
        default = statistics.median(r[key] for r in runs if r["threads"] == "default")
        one = statistics.median(r[key] for r in runs if r["threads"] == "1")
        summary[key] = {"default": default, "one_thread": one, "ratio_default_over_one": default / one}
    summary["same_results"] = len({(r["train_loss"], r["eval_loss"]) for r in runs}) == 1
    summary["results_by_threads"] = {t: sorted({r["eval_loss"] for r in runs if r["threads"] == t})
                                     for t in ("default", "1")}
    print(json.dumps(summary, indent=2))
    if opts.json:
        Path(opts.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
