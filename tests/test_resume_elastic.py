"""Resuming on another number of processes, per-device batch, accumulation or strategy (README "Resuming on another
number of processes or another strategy").

One module fixture runs tests/scripts/elastic_resume.py: the 1-process phases in this process, one `torchrun` launch
of 2 processes and one of 3 (gloo), each running many scenarios in a row; every test reads its scenario's files.
The runs train a tiny GPT-2 for 2 epochs on 24 rows whose first token names the row, saving every update, and log
the rows of each update from a `compute_loss` override: the oracle of "every row exactly once per epoch" is the row
count, not transformers.Trainer, which skips rows here (transformers#40245).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import load_script

SCRIPT = Path(__file__).parent / "scripts" / "elastic_resume.py"
ROWS = 24


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The four phases, in order; returns the output folder and the launches' output (for the log lines)."""
    out = tmp_path_factory.mktemp("elastic")
    script = load_script("elastic_resume")
    threads = torch.get_num_threads()
    try:
        script.main("one", str(out))
    finally:
        torch.set_num_threads(threads)
    outputs = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    for phase, processes in (("two", 2), ("three", 3)):
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
             str(SCRIPT), phase, str(out)], capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        outputs[phase] = done.stdout + done.stderr
    try:
        script.main("last", str(out))
    finally:
        torch.set_num_threads(threads)
    return out, outputs


def rows_by_update(out: Path, name: str) -> dict[int, list[int]]:
    """`{update: rows}` of a run, over its processes."""
    merged: dict[int, list[int]] = {}
    for path in sorted((out / name).glob("rows_*.json")):
        for step, rows in json.loads(path.read_text()):
            merged.setdefault(step, []).extend(rows)
    return merged


def result(out: Path, name: str) -> dict:
    return json.loads((out / name / "log.json").read_text())


def trained_rows(out: Path, saved: str, step: int, resumed: str) -> list[int]:
    """The rows of the saved run up to its checkpoint, then the resumed run's, in training order."""
    before = rows_by_update(out, saved)
    after = rows_by_update(out, resumed)
    assert min(after) == step + 1, (min(after), step)  # the resumed run starts at the update after its checkpoint
    return [r for s in sorted(before) if s <= step for r in sorted(before[s])] + [
        r for s in sorted(after) for r in sorted(after[s])]


def epochs_of(rows: list[int]) -> list[list[int]]:
    return [sorted(rows[i:i + ROWS]) for i in range(0, len(rows), ROWS)]


# scenario: (saved run, its checkpoint, resumed run, updates the resumed run ends at)
RESUMES = {
    "1->2 per-device batch kept, inside epoch 0": ("u1", 1, "r12", 7),
    "1->2 per-device batch kept, inside epoch 1": ("u1", 8, "r12_e1", 10),
    "1->2 global batch kept (resume_keep_global_batch)": ("u1_g8", 1, "r12_global", 6),
    "1->2 per-device batch 4->2, accumulation 1->2": ("u1", 3, "r12_accum2", 8),
    "2->3 per-device batch kept, inside epoch 0": ("u2", 1, "r23", 5),
    "2->3 per-device batch kept, inside epoch 1": ("u2", 4, "r23_e1", 6),
    "2->1 per-device batch kept, inside epoch 0": ("u2", 1, "r21", 11),
    "2->1 per-device batch kept, inside epoch 1": ("u2", 5, "r21_e1", 7),
    "2->1 global batch kept (resume_keep_global_batch)": ("u2", 1, "r21_global", 6),
    "DDP -> FSDP2 (2 processes)": ("u2", 1, "ddp_to_fsdp2", 6),
    "FSDP2 2 -> 1 process": ("u2_fsdp2", 1, "fsdp2_21", 11),
    "DDP -> FSDP1 (2 processes)": ("u2", 1, "ddp_to_fsdp1", 6),
    "transformers.Trainer 1 process -> FSDP2 2 processes": ("hf_u1", 1, "hf_to_fsdp2", 12),
    "1->2 into dispatch_batches=True": ("u1", 1, "r12_dispatch", 7),
    "2->1 from dispatch_batches=True": ("u2_dispatch", 1, "r21_dispatch", 11),
}
STRATEGY_ONLY = {  # the same geometry: the rows were right before too; the optimizer state was not loaded at all
    "FSDP2 -> DDP (2 processes)": ("u2_fsdp2", 1, "fsdp2_to_ddp", 6),
    "FSDP1 -> DDP (2 processes)": ("u2_fsdp1", 1, "fsdp1_to_ddp", 6),
}


def assert_finished_with_every_row_once(out: Path, saved: str, step: int, resumed: str, end: int) -> None:
    outcome = result(out, resumed)
    assert outcome["error"] is None and outcome["global_step"] == end, outcome["error"]
    assert epochs_of(trained_rows(out, saved, step, resumed)) == [list(range(ROWS))] * 2


@pytest.mark.parametrize("scenario", list(RESUMES))
def test_every_row_is_trained_exactly_once_per_epoch(runs, scenario):
    """Before: 1 -> 2 at the same per-device batch skipped rows (counted in the new loader's batches, as HF), and a
    DDP checkpoint under FSDP2 crashed at the first update."""
    out, _ = runs
    assert_finished_with_every_row_once(out, *RESUMES[scenario])


def test_dispatched_batches_are_the_sharded_ones_in_full_rounds(runs):
    """`dispatch_batches=True` on 2 processes: rank 0 reads every batch and sends each process its part; with rounds
    that divide, each update trains the rows the sharded run trains."""
    out, _ = runs
    assert result(out, "u2_dispatch")["error"] is None
    assert rows_by_update(out, "u2_dispatch") == rows_by_update(out, "u2")


@pytest.mark.parametrize(("resumed", "uninterrupted"), [("r12_global", "u1_g8"), ("r21_global", "u2")])
def test_keeping_the_global_batch_continues_the_uninterrupted_run(runs, resumed, uninterrupted):
    """`resume_keep_global_batch`: the accumulation is set so the global batch is the checkpoint's; then every
    update trains the uninterrupted run's rows, with its losses and learning rates."""
    out, _ = runs
    got, want = rows_by_update(out, resumed), rows_by_update(out, uninterrupted)
    assert {s: sorted(r) for s, r in got.items()} == {s: sorted(r) for s, r in want.items() if s > 1}

    def losses(name):
        return [(e["step"], e["loss"], e["learning_rate"]) for e in result(out, name)["log"] if "loss" in e]

    assert [x[0] for x in losses(resumed)] == [x[0] for x in losses(uninterrupted)]
    assert [v for x in losses(resumed) for v in x[1:]] == pytest.approx(
        [v for x in losses(uninterrupted) for v in x[1:]], rel=1e-5)


@pytest.mark.parametrize("scenario", [
    "DDP -> FSDP2 (2 processes)", "FSDP2 -> DDP (2 processes)", "FSDP2 2 -> 1 process", "DDP -> FSDP1 (2 processes)",
    "FSDP1 -> DDP (2 processes)", "transformers.Trainer 1 process -> FSDP2 2 processes"])
def test_the_optimizer_state_at_the_first_resumed_update_is_the_saved_one(runs, scenario):
    """The run finishes with every row once per epoch, and the gathered `exp_avg` / `exp_avg_sq` / `step` of every
    parameter at the start of update 2 of the resumed run equal the uninterrupted run's there. Before: plain tensors
    loaded into an optimizer over FSDP2 shards crashed with "aten.lerp_.Scalar got mixed torch.Tensor and DTensor" at
    that update, and a sharded state read by DDP or one process was not loaded at all (FSDP1 runs on CPU processes
    too)."""
    out, _ = runs
    saved, step, resumed, end = {**RESUMES, **STRATEGY_ONLY}[scenario]
    assert_finished_with_every_row_once(out, saved, step, resumed, end)
    uninterrupted = saved
    got = torch.load(out / resumed / "optimizer.pt")
    want = torch.load(out / uninterrupted / "optimizer.pt")
    assert sorted(got) == sorted(want) and len(want) == 28
    for name, state in want.items():
        assert sorted(got[name]) == ["exp_avg", "exp_avg_sq", "step"], name
        for key, value in state.items():
            assert torch.equal(got[name][key], value), (name, key)


def test_transformers_trainer_skips_rows_where_we_do_not(runs):
    """The same command on 2 processes, resumed from a 1-process checkpoint after update 1: transformers.Trainer
    skips the new loader's first batch of 8 rows, 4 of them never trained in epoch 0 (the oracle is the row count);
    hf_lightning trains each of the 24 rows once per epoch."""
    out, _ = runs
    ours = trained_rows(out, "u1", 1, "r12")
    theirs = trained_rows(out, "hf_u1", 1, "hf_r12")
    assert len(ours) == 2 * ROWS and epochs_of(ours) == [list(range(ROWS))] * 2
    first_epoch = set(theirs[:len(theirs) - ROWS])
    assert len(theirs) == 2 * ROWS - 4 and len(first_epoch) == ROWS - 4  # HF: 4 rows of epoch 0 never trained
    assert sorted(theirs[len(theirs) - ROWS:]) == list(range(ROWS))


def test_one_line_names_the_old_and_new_geometry(runs):
    out, outputs = runs
    line = next(line for line in outputs["two"].splitlines() if "u1/out/checkpoint-1'" in line
                and "another geometry" in line)
    assert ("world size 1 -> 2, per-device batch 4 -> 4, accumulation 1 -> 1, global batch 4 -> 8. By its sample "
            "position epoch 0 continues its order after sample 4 of 24 (the 20 rows left, in 3 update(s))") in line
    assert "updates per epoch 6 -> 3; num_train_epochs=2 still ends the run at the end of its last epoch, now after " \
           "7 updates (was 12); the learning-rate schedule is built for 7 updates" in line


def test_the_resumed_epoch_ends_at_a_whole_epoch(runs):
    """The resumed epoch has fewer windows in the new geometry (here 2 of 2 + 1 micro-batches): its last update
    still logs `epoch` 1.0, as the uninterrupted run's last update of an epoch does."""
    out, _ = runs
    epochs = {e["step"]: e["epoch"] for e in result(out, "r12_accum2")["log"] if "loss" in e}
    assert epochs[5] == 1.0 and epochs[8] == 2.0
