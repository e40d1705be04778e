"""README "Multi-node": two `torchrun --nnodes 2` launches (one process each, both on this machine, one shared
`output_dir`) train exactly as one node with 2 processes, and resume exactly (tests/scripts/checkpoint_train.py
`resume OUT launched RESULT`: 6 updates saving every 2, then a run from other weights resumed from checkpoint-4).

Every launch is bounded: a launch that has not finished after `TIMEOUT` seconds is killed with its node's other
processes (the test then fails naming it), so a rendezvous that never completes cannot hang the suite.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from test_checkpoint_processes import _losses

SCRIPT = Path(__file__).parent / "scripts" / "checkpoint_train.py"
TIMEOUT = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nnodes: int, node_rank: int, nproc: int, port: int, out: Path, result: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node_rank", str(node_rank),
               "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(port),
               str(SCRIPT), "resume", str(out), "launched", str(result)]
    # a session of its own: on a timeout the launcher and the workers it started are killed together
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait(launches: list[subprocess.Popen]) -> None:
    for number, proc in enumerate(launches):
        try:
            _, stderr = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for other in launches:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
                    other.communicate(timeout=30)
            raise AssertionError(f"launch {number} did not finish within {TIMEOUT} s (killed)") from None
        assert proc.returncode == 0, f"launch {number}:\n{stderr[-4000:]}"


def test_two_nodes_train_and_resume_exactly_like_one_node(tmp_path):
    one_node, two_nodes = tmp_path / "one_node", tmp_path / "two_nodes"
    _wait([_launch(1, 0, 2, _free_port(), one_node, tmp_path / "one_node.json")])
    port = _free_port()
    _wait([_launch(2, rank, 1, port, two_nodes, tmp_path / "two_nodes.json") for rank in (0, 1)])
    single = json.loads((tmp_path / "one_node.json").read_text())
    multi = json.loads((tmp_path / "two_nodes.json").read_text())  # written by global rank 0 (node 0)
    assert single["world_size"] == multi["world_size"] == 2
    assert multi["strategy"] == single["strategy"] == "DDPStrategy"
    full = _losses(multi["full"])
    assert [e[0] for e in full] == [1, 2, 3, 4, 5, 6]
    assert full == _losses(single["full"])  # exact: the same two processes, only on two "nodes"
    assert _losses(multi["resumed"], after=4) == _losses(multi["full"], after=4)  # resume finds and continues it
    assert sorted(os.listdir(two_nodes / "full")) == ["checkpoint-4", "checkpoint-6"]
