"""`auto_micro_batch` under DDP and FSDP2 on 2 CPU processes (gloo) where only rank 1 runs out of memory, in its
forward or in its backward (under DDP also from the second update on): ONE `torchrun` launch runs the scenarios of
tests/scripts/auto_micro_batch.py (`SCENARIOS`).

What must hold: no process is left waiting in a collective (the launch ends, within its timeout), both processes
agree on the new size (rank 0, which never failed, also ends at pieces of 2 rows), and the run equals the one started
at 2 x 4 per process: the same losses, gradient norms and weights (<= 1e-6). Evaluation runs no collective inside a
batch, so only the failing rank splits its evaluation batches.

Under FSDP2 every block's forward and backward all-gathers and every backward reduce-scatters: the agreement before
each of those collectives (parallel/oom_agreement.py) is what lets rank 0 stop its try where rank 1 stopped; without
it rank 0 waits in an all-gather that rank 1 never enters. Evaluation is agreed too (both processes split), with a
short last batch on rank 1 that runs as many forwards as rank 0's.

The rule is what keeps this from failing: with DDP's own gradient all-reduce in the last backward (no agreement
first), the "backward" scenario stops with gloo's "Received data size doesn't match expected size. Is there a
distributed collective mismatch" (rank 0's gradient bucket against rank 1's flag); on NCCL it would hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "auto_micro_batch.py"
LAUNCH = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("amb")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([*LAUNCH, str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("where", ["forward", "backward", "later"])
def test_one_rank_out_of_memory_ends_both_at_two_by_four_as_a_run_started_there(reports, where):
    for rank, report in enumerate(reports):
        run, reference = report[where], report["reference"]
        # rank 1: 8 and 4 rows failed once each in training (and in the first evaluation, which has no backward)
        assert run["raised"] == (2 if rank == 1 else 0) + (2 if rank == 1 and where != "backward" else 0)
        # both processes train in pieces of 2 (agreed); evaluation splits on the failing process only
        assert run["split"] == [4, 4 if rank == 1 and where != "backward" else 1]
        assert run["weight_diff"] <= 1e-6
        assert len(run["log"]) == len(reference["log"]) == 6
        for got, want in zip(run["log"], reference["log"]):
            assert got.keys() == want.keys()
            for key in got:
                assert got[key] == pytest.approx(want[key], abs=1e-6), (rank, want["step"], key)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_fsdp2_one_rank_out_of_memory_ends_both_at_two_by_four_as_a_run_started_there(reports, where):
    for rank, report in enumerate(reports):
        run, reference = report[f"fsdp2-{where}"], report["fsdp2-reference"]
        # rank 1: 8 and 4 rows failed once each in training, and a batch of 4 in the first evaluation (no backward)
        assert run["raised"] == (2 + (1 if where == "forward" else 0) if rank == 1 else 0)
        # both processes train in pieces of 2, and evaluate in pieces of 2 after rank 1's failure (agreed)
        assert run["split"] == [4, 2 if where == "forward" else 1]
        assert run["weight_diff"] <= 1e-6
        assert len(run["log"]) == len(reference["log"]) == 6
        for got, want in zip(run["log"], reference["log"]):
            assert got.keys() == want.keys()
            for key in got:
                assert got[key] == pytest.approx(want[key], abs=1e-6), (rank, want["step"], key)
