"""Streaming resume: the start-up of a run resumed at update 10 vs at update 5,000 of a streaming dataset, ours and HF.

The data: 48,000 generated sentences (Arrow, `save_to_disk`), streamed as a `datasets.IterableDataset` in 16 shards,
shuffled with a 1,000-row buffer and tokenised by `map` on the fly; a tiny GPT-2, batch 8
(`scripts/stream_train.py`). For each trainer, two runs write a checkpoint at update 10 and at update 5,000 (the
trainer's own checkpoints: ours resumes ours, HF resumes HF's). Then, timed, each checkpoint is resumed in a fresh
process, from the command's launch to the end of the first resumed update (a callback prints the time and ends the
process), the four resumes alternating in an order rotated every repeat; medians over `--repeats`, as wall seconds
and as CPU seconds of the child (the figure other processes on the machine do not inflate).

Target: ours at 5,000 / ours at 10 <= 1.2 (HF skips by reading: its ratio grows with the position).

    python bench/bench_stream_resume.py --repeats 5 [--far 5000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "scripts" / "stream_train.py"
WORDS = ["the", "film", "was", "quite", "good", "and", "plot", "dull", "but", "cast", "lovely", "music", "ending",
         "story", "acting", "great", "bad", "tedious", "wonderful", "honestly", "truly", "somewhat", "not", "very"]


def make_data(folder: Path, rows: int) -> None:
    import datasets

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(8, 40))) for _ in range(rows)]
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(folder))


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{done.stderr[-3000:]}")
    stamp = next((line for line in done.stdout.splitlines() if line.startswith("FIRST_UPDATE")), None)
    wall = (float(stamp.split()[1]) if stamp else time.time()) - start
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, stamp or ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--near", type=int, default=10)
    parser.add_argument("--far", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    options = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_stream_"))
    env = {**os.environ, "OMP_NUM_THREADS": str(options.threads), "TOKENIZERS_PARALLELISM": "false"}
    data = work / "data"
    make_data(data, rows=8 * (options.far + 1000))
    base = [sys.executable, str(SCRIPT), "--data", str(data)]
    checkpoints = {}
    for trainer in ("ours", "hf"):
        for step in (options.near, options.far):
            out = work / f"{trainer}-{step}"
            started = time.time()
            run([*base, "--trainer", trainer, "--output_dir", str(out), "--max_steps", str(step), "--save_steps",
                 str(step)], env)
            checkpoints[(trainer, step)] = out / f"checkpoint-{step}"
            print(f"  {trainer} trained to update {step} in {time.time() - started:.0f} s", flush=True)
    runs: dict[str, list[tuple[float, float]]] = {f"{t} @{s}": [] for t, s in checkpoints}
    loads = []
    for repeat in range(options.repeats):
        keys = list(checkpoints)
        keys = keys[repeat % len(keys):] + keys[:repeat % len(keys)]
        for trainer, step in keys:
            loads.append(os.getloadavg()[0])
            out = Path(tempfile.mkdtemp(dir=work))
            wall, cpu, stamp = run([*base, "--trainer", trainer, "--output_dir", str(out), "--max_steps",
                                    str(step + 10), "--resume", str(checkpoints[(trainer, step)]),
                                    "--exit_at_first_update"], env)
            assert stamp.endswith(f"step {step + 1}"), stamp
            shutil.rmtree(out, ignore_errors=True)
            runs[f"{trainer} @{step}"].append((wall, cpu))
            print(f"  [rep {repeat + 1}/{options.repeats}] {trainer:4s} resume at {step:5d}: first update after "
                  f"{wall:6.2f} s wall, {cpu:6.2f} s CPU", flush=True)
    medians = {k: {"wall_s": statistics.median(w for w, _ in v), "cpu_s": statistics.median(c for _, c in v)}
               for k, v in runs.items()}
    print(f"\n== time to the first resumed update, medians of {options.repeats} (load average "
          f"{statistics.median(loads):.1f}, {min(loads):.1f}-{max(loads):.1f}) ==")
    for key, value in medians.items():
        print(f"  {key:12s} wall {value['wall_s']:6.2f} s   cpu {value['cpu_s']:6.2f} s")
    ratios = {}
    for trainer in ("ours", "hf"):
        far, near = medians[f"{trainer} @{options.far}"], medians[f"{trainer} @{options.near}"]
        ratios[trainer] = {k: far[k] / near[k] for k in ("wall_s", "cpu_s")}
        print(f"  {trainer}: resume at {options.far} / at {options.near}: wall {ratios[trainer]['wall_s']:.3f}, "
              f"cpu {ratios[trainer]['cpu_s']:.3f}" + ("   (target <= 1.2)" if trainer == "ours" else ""))
    if options.json:
        Path(options.json).write_text(json.dumps({"medians": medians, "ratios": ratios, "runs": runs,
                                                  "loads": loads}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
