"""Every script in `bench/` runs, at tiny sizes, with all its runners and cases (issue 35: `profile_overhead.py` had
failed since the redesign with `KeyError: 'compute_loss'`, and nothing ran the scripts, so nobody noticed).

The numbers are not checked (a few updates measure nothing); what is checked is that each script gets through every
runner to its summary. One child process runs them all in turn (their `main(argv)`), so torch, transformers and
Lightning are imported once; the scripts that measure fresh processes start their own, as they do when measuring.
`bench/gpu/` needs a GPU (tests/test_gpu_check.py runs its `--dry-run`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"

# script -> (argv at tiny sizes, a line of its summary that only prints once every runner has run)
RUNS: list[tuple[str, list[str], str]] = [
    ("profile_overhead", ["--case", "overhead", "--repeats", "1", "--steps", "3", "--warmup", "1"],
     r"hf_lightning: module\.compute_loss\s+[0-9.]+\s+0\.000\s+0\.000"),
    ("bench_throughput", ["--case", "all", "--repeats", "1", "--steps", "3", "--warmup", "1"], r"ours/hf"),
    # lockstep.py: the runners of a repeat in separate processes taking turns
    ("bench_throughput", ["--case", "overhead", "--repeats", "1", "--steps", "3", "--warmup", "1", "--lockstep"],
     r"ours/hf"),
    ("bench_logging_overhead", ["--repeats", "1", "--steps", "3", "--warmup", "1"],
     r"one training log entry costs [0-9.]+ ms"),
    ("bench_finetune", ["--part", "all", "--repeats", "1", "--steps", "3", "--warmup", "1"], r"steady_speedup"),
    ("bench_generation", ["--beams", "1", "4", "--repeats", "1", "--samples", "64"], r"beams=4: median steady"),
    ("bench_row_checks", ["--rows", "200", "--repeats", "1"], r"check_dataset on a shuffled view"),
    ("bench_checkpoint_save", ["--repeats", "1"], r"cost of the manifest"),
    ("bench_eval_memory", ["--sizes", "16", "--hf-sizes", "16"], r"throughput ours/hf at 16"),
    ("bench_async_save", ["--repeats", "1", "--steps", "2", "--layers", "1"], r"with saves / without"),
    ("bench_short_runs", ["--repeats", "1", "--steps", "2", "--every", "1", "--no-warmup"],
     r"train_runtime .* ours/hf"),
    ("bench_startup", ["--repeats", "1", "--no-warmup"], r"fit --help\n(.*\n)*  ours warm/hf"),
    ("bench_stream_resume", ["--repeats", "1", "--near", "2", "--far", "3"], r"hf: resume at 3 / at 2"),
    ("bench_threads", ["--repeats", "1", "--max-steps", "2"], r'"same_results"'),
    ("bench_micro_batch_guard", ["--repeats", "1", "--steps", "3", "--warmup", "1"], r"guard/plain"),
    ("bench_memory_plan", ["--layers", "1", "--hidden", "64", "--intermediate", "128", "--heads", "4", "--vocab",
                           "500", "--seq-len", "16", "--repeats", "1"],
     r"largest micro-batch under the budget: median [0-9.]+ s \(CPU [0-9.]+ s"),
    ("bench_grpo", ["--repeats", "1", "--steps", "2", "--warmup", "1"],
     r"update +wall: ours .* ours/hf .*CPU: ours .* ours/hf"),
]
NOT_SCRIPTS = {"common.py", "lockstep.py"}  # modules of the scripts (lockstep.py: the `--lockstep` run above)

DRIVER = """
import importlib, json, sys, traceback
sys.path.insert(0, sys.argv[1])
for name, argv in json.loads(sys.argv[2]):
    print(f"### run {name} {' '.join(argv)}", flush=True)
    try:
        importlib.import_module(name).main(argv)
        print(f"### ok {name}", flush=True)
    except BaseException:
        print(f"### failed {name}", flush=True)
        traceback.print_exc(file=sys.stdout)
"""


def test_every_bench_script_has_a_smoke_run():
    scripts = {p.stem for p in BENCH.glob("*.py") if p.name not in NOT_SCRIPTS}
    assert scripts == {name for name, _, _ in RUNS}


@pytest.mark.timeout(1500)
def test_every_bench_script_runs_every_runner_at_tiny_sizes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    # bench_startup.py times the `hf-lightning` command: this environment's (as tests/test_readme_examples.py)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    runs = [(name, argv) for name, argv, _ in RUNS]
    result = subprocess.run([sys.executable, "-c", DRIVER, str(BENCH), json.dumps(runs)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=1400)
    assert result.returncode == 0, result.stderr[-5000:]
    parts = re.split(r"^### run ", result.stdout, flags=re.M)[1:]  # one part per run, in RUNS order
    assert len(parts) == len(RUNS), result.stdout[-5000:]
    for (name, argv, summary), part in zip(RUNS, parts):
        assert f"### ok {name}" in part, f"bench/{name}.py {' '.join(argv)} failed:\n{part[-5000:]}"
        assert re.search(summary, part), f"bench/{name}.py printed no summary ({summary!r}):\n{part[-3000:]}"
