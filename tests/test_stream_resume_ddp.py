"""Streaming resume in O(1) with 2 processes (gloo): each process saves its own part of the `datasets` stream
(`split_dataset_by_node`) and resumes from it, with DataLoader workers too; the resumed run equals the uninterrupted
one and neither process processes the rows trained before the checkpoint again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stream_helpers import reads

SCRIPT = Path(__file__).parent / "scripts" / "stream_resume_ddp.py"
VOLATILE = ("runtime", "per_second", "train_loss", "total_flos")


def _run(tmp_path: Path, name: str, workers: int, resume: Path | None = None) -> list[dict]:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    command = [sys.executable, str(SCRIPT), str(tmp_path / name), str(out), str(workers)]
    result = subprocess.run(command + ([str(resume)] if resume else []), cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())["log_history"]


def _after(history: list[dict], step: int) -> list[dict]:
    return [{k: v for k, v in e.items() if not any(word in k for word in VOLATILE)}
            for e in history if e["step"] > step and "train_runtime" not in e]


@pytest.mark.parametrize("workers", [0, 2])
def test_two_processes_resume_their_stream_positions(tmp_path, workers):
    full = _run(tmp_path, "full", workers)
    checkpoint = tmp_path / "full" / "checkpoint-6"
    assert {p.name for p in checkpoint.glob("stream_position_*.pt")} == {"stream_position_0.pt",
                                                                        "stream_position_1.pt"}
    resumed = _run(tmp_path, "resumed", workers, resume=checkpoint)
    assert _after(resumed, 6) == _after(full, 6)
    for rank in (0, 1):  # 6 updates x 2 micro-batches x 2 rows per process were trained before the checkpoint
        assert reads(tmp_path / f"resumed.json.rank{rank}.log") <= reads(tmp_path / f"full.json.rank{rank}.log") - 24
