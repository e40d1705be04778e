"""`include_num_input_tokens_seen` under 2 processes (gloo): every log entry's `num_input_tokens_seen` counts the
tokens of both processes, as HF's gathered count does."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"


def test_tokens_are_summed_over_processes(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, str(SCRIPT), str(out), "2", "4", "tokens"], check=True, cwd=tmp_path,
                   capture_output=True, timeout=600)
    history = json.loads(out.read_text())["log_history"]
    # each entry (training, evaluation, summary): updates x micro-batches x processes x rows x tokens (classification
    # rows: 12 tokens, none padding)
    assert [e["num_input_tokens_seen"] for e in history] == [e["step"] * 2 * 2 * 4 * 12 for e in history]
    assert [e["step"] for e in history if "loss" in e] == [1, 2, 3, 4, 5, 6]
    # include_throughput (ours) counts from the same per-update counts: every training entry has a rate
    assert all(e["tokens_per_second"] > 0 for e in history if "loss" in e)
