"""`num_input_tokens_seen` and `tokens_per_second` under 2 processes (gloo) count the tokens of both: the counts equal
the single-process run's with the same global batch, as HF's gathered count does."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"


def _run(tmp_path: Path, devices: int, batch: int) -> list[dict]:
    out = tmp_path / f"out{devices}.json"
    subprocess.run([sys.executable, str(SCRIPT), str(out), str(devices), str(batch), "tokens"], check=True,
                   cwd=tmp_path, capture_output=True, timeout=600)
    return json.loads(out.read_text())["log_history"]


def test_tokens_are_summed_over_processes(tmp_path: Path) -> None:
    single, ddp = _run(tmp_path, devices=1, batch=8), _run(tmp_path, devices=2, batch=4)
    assert [e.get("num_input_tokens_seen") for e in ddp] == [e.get("num_input_tokens_seen") for e in single]
    assert ddp[-1]["num_input_tokens_seen"] == 6 * 2 * 8 * 12  # updates x micro-batches x rows x tokens
    assert all(e["tokens_per_second"] > 0 for e in ddp if "loss" in e)
