"""`bench/gpu/check.sh --dry-run` in a clean checkout (CI): no wheel folder, no GPU. It must say that the folder is
missing and how to make it, deselect DeepSpeed with the reason, verify this machine's versions against
constraints-cpu.txt, still collect the gpu tests and run the throughput bench on tiny CPU models, write check.json, and
exit 0. With an image's versions simulated (the GPU image's transformers 5.17.0) it must refuse: no test, no bench,
check.json naming the difference, exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_check_dry_runs_without_the_wheels(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "HF_LIGHTNING_GPU_WHEELS": str(tmp_path / "no_wheels"),
           "PYTHON": sys.executable,  # the interpreter (and so the versions) the tests run with
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu" / "check.sh"), "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert result["dry_run"] is True and result["ok"] is True
    parts = {p["part"]: p for p in result["parts"]}
    assert "missing: bench/gpu/wheels/ does not exist" in parts["wheels"]["note"]
    assert "fetch_wheels.sh" in parts["wheels"]["note"]
    assert "no deepspeed wheel" in result["deepspeed_skipped"]
    assert parts["install"]["note"] == "dry run: not run"
    assert parts["versions"]["rc"] == 0 and result["refused"] is None
    assert result["versions"]["verified"]["transformers"] == {"tested": "5.24.0", "installed": "5.24.0", "same": True}
    assert result["versions"]["not_verified"]["torch"]["why"]
    assert parts["pytest-collect"]["rc"] == 0 and parts["bench-tiny-cpu"]["rc"] == 0
    log = (tmp_path / "out" / "check.log").read_text()
    assert "tests collected" in log  # the gpu tests were found (DeepSpeed's deselected)
    assert "python -m pytest -m gpu -k not zero and not deepspeed" in log  # the command a GPU run would use
    bench = result["bench"]
    assert bench["tiny_cpu"] is True
    assert [c["case"] for c in bench["cases"]] == ["gpt2", "llama1b-lora", "gpt2-fsdp2"]  # families, PEFT, FSDP2


def test_the_gpu_check_refuses_versions_other_than_the_tested_ones(tmp_path):
    """The GPU image's transformers 5.17.0 (simulated): the check verifies before any test or bench and refuses."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "HF_LIGHTNING_GPU_WHEELS": str(tmp_path / "no_wheels"),
           "PYTHON": sys.executable,  # the interpreter (and so the versions) the tests run with
           "HF_LIGHTNING_GPU_FAKE_VERSIONS": "transformers=5.17.0,tokenizers=0.23.2"}
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu" / "check.sh"), "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "check.json").read_text())
    assert result["ok"] is False
    assert "transformers 5.17.0 (tested 5.24.0); tokenizers 0.23.2 (tested 0.23.3)" in result["refused"]
    assert result["versions"]["simulated"] == {"transformers": "5.17.0", "tokenizers": "0.23.2"}
    parts = {p["part"]: p for p in result["parts"]}
    assert parts["versions"]["rc"] == 3
    assert parts["pytest"]["note"].startswith("refused:") and parts["bench"]["note"].startswith("refused:")
    assert "pytest-collect" not in parts and "bench-tiny-cpu" not in parts
    assert "pytest" not in result and "bench" not in result  # no figure from untested versions
