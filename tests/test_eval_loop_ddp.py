"""`evaluation_loop` under DDP, and the accelerate collectives, in one 2-process CPU (gloo) launch.

tests/scripts/qa_loop.py runs HF's question-answering trainer pattern (`evaluate` / `predict` overridden, calling
`self.evaluation_loop`) on 2 processes with `learning_rate=0` (so the weights, hence the evaluations, do not depend
on how the training batches are split), then asks `trainer.accelerator` for `gather`, `gather_for_metrics`,
`pad_across_processes`, `reduce` and `wait_for_everyone`. Every rank must hold the single-process results, which
are `transformers.Trainer`'s (same script, this process): 10 eval rows in batches of 4 are uneven over 2 processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

import hf_lightning

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import qa_loop  # noqa: E402


def _no_epoch(entries):  # the epoch of a step differs: 2 processes read twice the rows per update
    return [{k: v for k, v in e.items() if k != "epoch"} for e in entries]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("qa_ddp")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "qa_loop.py"), str(tmp_path / "out"), "2"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"out.rank{r}.json").read_text()) for r in (0, 1)]
    ours = qa_loop.collect(hf_lightning.Trainer, str(tmp_path / "single"), learning_rate=0.0)
    hf = qa_loop.collect(transformers.Trainer, str(tmp_path / "hf"), learning_rate=0.0)
    return ours, hf, ranks


@pytest.mark.distributed
def test_qa_evaluation_loop_on_two_processes_equals_one_and_hf(runs):
    ours, hf, ranks = runs
    for key in ("evaluate", "predict_metrics", "spans", "ids", "weights"):
        assert ours[key] == hf[key], key
    assert _no_epoch(ours["eval_logs"]) == _no_epoch(hf["eval_logs"])
    for ddp in ranks:
        assert _no_epoch(ddp["eval_logs"]) == _no_epoch(ours["eval_logs"])  # during train() too
        assert _no_epoch([ddp["evaluate"]]) == _no_epoch([ours["evaluate"]])
        assert ddp["predict_metrics"] == ours["predict_metrics"]
        assert ddp["spans"] == ours["spans"] and ddp["ids"] == ours["ids"]  # every row once, in order


@pytest.mark.distributed
def test_accelerator_collectives_on_two_processes(runs):
    _, _, ranks = runs
    for rank, result in enumerate(ranks):
        surface = result["surface"]
        assert surface["process_index"] == rank and surface["num_processes"] == 2
        assert surface["is_main_process"] is (rank == 0) and surface["is_local_main_process"] is (rank == 0)
        assert surface["use_distributed"] is True
        assert surface["gather"] == [0, 10, 1, 11]
        assert surface["gather_scalar"] == [0.0, 1.0]
        assert surface["gather_for_metrics"] == [[0], [1]]
        assert surface["gather_for_metrics_object"] == ["r0", "r1"]
        assert surface["reduce_sum"] == [3.0] and surface["reduce_mean"] == [1.5]
        assert surface["split_batches"] is False and surface["even_batches"] is True
        assert surface["device"] == "cpu"
        # a data loader is sharded as accelerate shards it (batch i to rank i % 2); wrapping a model is Lightning's and
        # is refused by name, never returned unwrapped
        assert surface["prepared"] == [[rank * 2, rank * 2 + 1]]
        assert surface["refusals"] == ["accelerator.prepare_model"]
    # rank 0 held 1 row, rank 1 two: rank 0's is padded to 2 rows with -1; rank 1's is unchanged
    assert ranks[0]["surface"]["padded"] == [[0.0, 0.0], [-1.0, -1.0]]
    assert ranks[1]["surface"]["padded"] == [[1.0, 1.0], [1.0, 1.0]]
