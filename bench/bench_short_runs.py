"""Short runs, whole process: an HF example-style script (tiny BERT classifier, 60 updates, evaluate and save every
20) with `hf_lightning.Trainer` vs with `transformers.Trainer` (`scripts/text_classification.py`, where the trainer
class is the only difference).

Each run is a fresh process; the two alternate, in an order rotated every repeat. Reported per runner (medians over
`--repeats`): the whole process's wall time and CPU time (user + system of the child, which another process on the
machine does not inflate), `train_runtime` (the `train()` call) and the peak RSS; then ours / HF for each. One untimed
run of each fills the `datasets` caches first. `OMP_NUM_THREADS=--threads` (1).

    python bench/bench_short_runs.py --repeats 7 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "scripts" / "text_classification.py"
RUNNERS = ("ours", "hf")


def run_once(runner: str, work: Path, env: dict[str, str], steps: int, every: int) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(dir=work))
    report = out / "report.json"
    argv = [sys.executable, str(SCRIPT), "--trainer", runner, "--output_dir", str(out / "run"), "--max_steps",
            str(steps), "--eval_steps", str(every), "--save_steps", str(every), "--json", str(report)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{runner} failed:\n{done.stderr[-3000:]}")
    result = json.loads(report.read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            "train_runtime": result["train_runtime"], "max_rss_mb": result["max_rss_mb"],
            "eval_accuracy": result["eval_accuracy"], "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20, help="eval_steps = save_steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs (a smoke run)")
    options = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_short_"))
    env = {**os.environ, "OMP_NUM_THREADS": str(options.threads), "TOKENIZERS_PARALLELISM": "false"}
    for runner in RUNNERS if not options.no_warmup else ():  # untimed: the datasets caches
        run_once(runner, work, env, options.steps, options.every)
    runs: dict[str, list[dict[str, float]]] = {r: [] for r in RUNNERS}
    for repeat in range(options.repeats):
        order = RUNNERS[repeat % 2:] + RUNNERS[:repeat % 2]
        for runner in order:
            runs[runner].append(run_once(runner, work, env, options.steps, options.every))
            r = runs[runner][-1]
            print(f"  [rep {repeat + 1}/{options.repeats}] {runner:4s} wall {r['wall_s']:6.2f} s  "
                  f"cpu {r['cpu_s']:6.2f} s  "
                  f"train_runtime {r['train_runtime']:6.2f} s  rss {r['max_rss_mb']:5.0f} MB  load {r['load']:.1f}",
                  flush=True)
    keys = ("wall_s", "cpu_s", "train_runtime", "max_rss_mb")
    medians = {r: {k: statistics.median(x[k] for x in runs[r]) for k in keys} for r in RUNNERS}
    paired = {k: statistics.median(o[k] / h[k] for o, h in zip(runs["ours"], runs["hf"])) for k in keys}
    loads = [x["load"] for r in RUNNERS for x in runs[r]]
    print(f"\n== {options.steps} updates, evaluate + save every {options.every}; medians of {options.repeats} "
          f"(load average {statistics.median(loads):.1f}, {min(loads):.1f}-{max(loads):.1f}) ==")
    for key in keys:
        print(f"  {key:14s} ours {medians['ours'][key]:8.2f}  hf {medians['hf'][key]:8.2f}  "
              f"ours/hf {medians['ours'][key] / medians['hf'][key]:.3f} (paired median {paired[key]:.3f})")
    if options.json:
        Path(options.json).write_text(json.dumps({"medians": medians, "paired": paired, "runs": runs}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
