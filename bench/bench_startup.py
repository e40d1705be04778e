"""Start-up: how long before anything useful happens, `hf_lightning` vs `transformers`, each in a fresh process.

Measurements (ours / HF's counterpart), run alternately in an order rotated every repeat, medians over `--repeats`:

- `import`: `python -c "import hf_lightning; hf_lightning.Trainer"` vs `python -c "import transformers;
  transformers.Trainer"`.
- `first update, CLI`: `hf-lightning fit --config configs/text_classification.yaml` vs the same task as an HF
  example-style script (`scripts/text_classification.py --trainer hf`), from the command's launch to the end of the
  first optimizer update (a callback prints the time and ends the process there).
- `first update, script`: the same script with `hf_lightning.Trainer` (`--trainer ours`) vs with
  `transformers.Trainer`.
- `fit --help`: `hf-lightning fit --help` with an empty help cache (`cold`) and with it filled (`warm`, see
  `hf_lightning/cli/help_cache.py`) vs `HfArgumentParser(TrainingArguments)`'s `--help` (what an HF script prints).

Each is timed as wall seconds and as CPU seconds of the child (user + system, `RUSAGE_CHILDREN`): on a shared machine
the CPU time is the figure that does not depend on what else runs. One untimed warm-up run of each command fills
the `datasets` caches (both tokenise with `datasets.map`, cached). `OMP_NUM_THREADS` is set to `--threads` (1).

    python bench/bench_startup.py --repeats 5 [--json out.json]
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
SCRIPTS = ROOT / "bench" / "scripts"
HF_HELP = ("from transformers import HfArgumentParser, TrainingArguments; "
           "HfArgumentParser(TrainingArguments).parse_args(['--help'])")


def _commands(work: Path) -> dict[str, dict[str, list[str]]]:
    """{measurement: {runner: argv}}; `{out}` is replaced by a fresh output folder per run."""
    script = [sys.executable, str(SCRIPTS / "text_classification.py"), "--exit_at_first_update",
              "--output_dir", "{out}"]
    cli = shutil.which("hf-lightning") or "hf-lightning"
    return {
        "import": {"ours": [sys.executable, "-c", "import hf_lightning; hf_lightning.Trainer"],
                   "hf": [sys.executable, "-c", "import transformers; transformers.Trainer"]},
        "first update, CLI": {
            # the callback's module is the bench's own: the config has to allow it (cli/config_code.py)
            "ours": [cli, "fit", "--config", "configs/text_classification.yaml", "--args.output_dir", "{out}",
                     "--allow_code_from", "[first_update]", "--trainer.callbacks+=first_update.FirstUpdateExit"],
            "hf": [*script, "--trainer", "hf"]},
        "first update, script": {"ours": [*script, "--trainer", "ours"], "hf": [*script, "--trainer", "hf"]},
        "fit --help": {"ours cold": [cli, "fit", "--help"], "ours warm": [cli, "fit", "--help"],
                       "hf": [sys.executable, "-c", HF_HELP]},
    }


def _run(argv: list[str], work: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds to the first update or to the exit, child CPU seconds)."""
    out = Path(tempfile.mkdtemp(dir=work))
    argv = [a.replace("{out}", str(out)) for a in argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    end = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{done.stderr[-3000:]}")
    stamps = [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("FIRST_UPDATE")]
    shutil.rmtree(out, ignore_errors=True)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return (stamps[0] if stamps else end) - start, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="measurement names to run (default: all)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs (a smoke run)")
    options = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    cache = work / "help_cache"
    env = {**os.environ, "OMP_NUM_THREADS": str(options.threads), "HF_LIGHTNING_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")])),
           "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "120"}
    commands = _commands(work)
    if options.only:
        commands = {k: v for k, v in commands.items() if k in options.only}
    results: dict[str, dict[str, list[tuple[float, float]]]] = {m: {r: [] for r in c} for m, c in commands.items()}
    for runners in commands.values():  # untimed warm-up: datasets caches, the help cache
        for runner, command in runners.items():
            if runner != "ours cold" and not options.no_warmup:
                _run(command, work, env)
    loads = []
    for repeat in range(options.repeats):
        loads.append(os.getloadavg()[0])
        for measurement, runners in commands.items():
            names = list(runners)
            names = names[repeat % len(names):] + names[:repeat % len(names)]
            for runner in names:
                if runner == "ours cold":
                    shutil.rmtree(cache, ignore_errors=True)
                results[measurement][runner].append(_run(runners[runner], work, env))
    summary = {}
    print(f"load average during the runs: median {statistics.median(loads):.1f} ({min(loads):.1f}-{max(loads):.1f})")
    for measurement, runners in results.items():
        print(f"\n{measurement}")
        summary[measurement] = {}
        for runner, values in runners.items():
            wall, cpu = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
            summary[measurement][runner] = {"wall_s": wall, "cpu_s": cpu, "runs": values}
            print(f"  {runner:10s} wall {wall:6.2f} s   cpu {cpu:6.2f} s")
        hf = summary[measurement]["hf"]
        for runner in runners:
            if runner != "hf":
                mine = summary[measurement][runner]
                print(f"  {runner}/hf: wall {mine['wall_s'] / hf['wall_s']:.3f}, cpu {mine['cpu_s'] / hf['cpu_s']:.3f}")
    if options.json:
        Path(options.json).write_text(json.dumps({"loads": loads, "summary": summary}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
