"""Faults with real processes and real files: nothing may leave a checkpoint that looks complete but is not, mix two
runs, delete what the run did not write, or make a resume lie; every bad input is named.

- SIGKILL at random moments over saves and rotations: the training process (tests/scripts/fault_train.py) kills
  itself just before its k-th file-system operation on the output folder (k drawn at random, seeded: every step of
  a save and of a rotation is such an operation), again and again, each time resuming from what survived. After
  every kill each remaining `checkpoint-*` folder is complete (`from_pretrained` loads it, every file is whole, its
  trainer state names its step); the chain ends with the weights of the uninterrupted run. The long loop (>= 20
  kills) is `slow`; a short chain runs by default.
- two runs on one output folder: the second is refused with one line naming the first (host, pid); a stale lock of
  a dead process is taken over with a warning; a lock of another host is refused with how to remove it.
- folders the run did not write (`checkpoint-abc`, `checkpoint-final`, ...): kept with their files, no refusal.
- every damaged file kind of a checkpoint: named, with the previous complete checkpoint suggested.
- a full disk (a small tmpfs, where this test may mount one): the error names the file and the cause.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import load_script
from safetensors.torch import load_file

from hf_lightning.checkpoint.integrity import DamagedCheckpointError, folder_problems
from hf_lightning.checkpoint.run_lock import LOCK_NAME, OutputDirLocked
from hf_lightning.checkpoint.find import check_checkpoint

SCRIPT = Path(__file__).parent / "scripts" / "fault_train.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                 os.environ.get("PYTHONPATH")]))}


def _script():
    return load_script("fault_train")


def _child(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], env={**ENV, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def assert_every_checkpoint_complete(out: Path) -> list[str]:
    """Each `checkpoint-*` folder (HF's glob) loads with `from_pretrained`, has whole files and its own step."""
    from transformers import AutoModelForCausalLM

    names = []
    for folder in sorted(out.glob("checkpoint-*")):
        check_checkpoint(folder)  # every file of a resumable checkpoint is there
        assert folder_problems(folder) == {}, folder
        AutoModelForCausalLM.from_pretrained(folder)
        state = json.loads((folder / "trainer_state.json").read_text())
        assert folder.name == f"checkpoint-{state['global_step']}"
        names.append(folder.name)
    return names


# ----- SIGKILL over saves and rotations -----
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run without a kill: how many file-system operations it makes, and its final weights."""
    root = tmp_path_factory.mktemp("uninterrupted")
    proc = _child("run", str(root / "out"), "0", str(root / "result.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((root / "result.json").read_text())
    return result["operations"], load_file(str(root / "out" / "checkpoint-8" / "model.safetensors"))


def _phase(operation: str, paths: str) -> str:
    """Which part of a run an operation belongs to, from the paths it touched (for the summary)."""
    if operation == "fsync":
        return "flush before/after a rename"
    if operation == "replace":
        return "rotation: rename out of the set" if "deleting-checkpoint" in paths else "save: rename into place"
    if "deleting-checkpoint" in paths or (operation in ("unlink", "rmdir") and "/" not in paths):
        return "rotation: removing the renamed folder"
    if "tmp-checkpoint" in paths:
        return "save: writing the temporary folder"
    if LOCK_NAME in paths:
        return "lock"
    return "other"


def _kill_chains(tmp_path: Path, uninterrupted, kills_wanted: int, seed: int,
                 points: tuple[str, ...] = ()) -> dict[str, int]:
    """Chains of killed runs, each resumed by the next, until `kills_wanted` kills; returns kills per operation.
    The kill points are `points` (see fault_train.py) in order, then random operation numbers."""
    operations, final_weights = uninterrupted
    rng = random.Random(seed)
    chosen = list(points)
    log = tmp_path / "kills.log"
    kills, chain = 0, 0
    while kills < kills_wanted:
        out = tmp_path / f"chain{chain}"
        chain += 1
        for _ in range(50):
            kill_at = (chosen.pop(0) if chosen else rng.randint(1, operations)) if kills < kills_wanted else 0
            proc = _child("run", str(out), str(kill_at), str(tmp_path / "result.json"),
                          env={"FAULT_KILL_LOG": str(log)})
            if proc.returncode == -signal.SIGKILL:
                kills += 1
                assert_every_checkpoint_complete(out)
                continue
            assert proc.returncode == 0, proc.stderr[-3000:]  # a resumed run that the kill point did not reach
            break
        assert json.loads((tmp_path / "result.json").read_text())["global_step"] == 8
        names = assert_every_checkpoint_complete(out)
        assert names[-1] == "checkpoint-8" and len(names) <= 2  # save_total_limit=2 held through the kills
        final = load_file(str(out / "checkpoint-8" / "model.safetensors"))
        assert all(torch.equal(final[k], final_weights[k]) for k in final_weights)  # bit-identical to no kill
        assert not [p for p in out.iterdir() if p.name != "checkpoint-7" and p.name != "checkpoint-8"], \
            sorted(os.listdir(out))  # no lock, no temporary or half-deleted folder left after the clean run
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        operation, _, path = line.partition(" ")
        counts[f"{operation} ({_phase(operation, path)})"] = counts.get(f"{operation} ({_phase(operation, path)})",
                                                                        0) + 1
    print(f"\nSIGKILL points over {kills} kills:", json.dumps(counts, sort_keys=True))
    return counts


# the moments issue 13 found dangerous, then the other steps of a save: each lands in one chain of resumed runs
TARGETED = ("replace:deleting-checkpoint:2", "unlink:model.safetensors:1", "replace:tmp-checkpoint:3", "fsync::5")


def test_sigkill_during_saves_and_rotations_short(tmp_path, uninterrupted):
    """Kills at a rotation's rename, in the middle of a rotation's removal, at a save's rename into place and at a
    flush: every folder left is complete, and resuming ends with the uninterrupted weights."""
    counts = _kill_chains(tmp_path, uninterrupted, kills_wanted=len(TARGETED), seed=13, points=TARGETED)
    assert counts == {"replace (rotation: rename out of the set)": 1, "unlink (rotation: removing the renamed "
                      "folder)": 1, "replace (save: rename into place)": 1, "fsync (flush before/after a rename)": 1}


def test_sigkill_during_saves_and_rotations_many(tmp_path, uninterrupted):
    assert sum(_kill_chains(tmp_path, uninterrupted, kills_wanted=24, seed=2024).values()) == 24


# ----- two runs, one output folder -----
def test_a_second_run_on_a_busy_output_dir_is_refused_naming_the_first(tmp_path):
    out, ready, go = tmp_path / "out", tmp_path / "ready", tmp_path / "go"
    first = subprocess.Popen([sys.executable, str(SCRIPT), "hold", str(out), str(ready), str(go)], env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(6000):  # until the first run holds the lock (it creates `ready`), at most 10 minutes
            if ready.exists() or first.poll() is not None:
                break
            subprocess.run(["sleep", "0.1"], timeout=60)
        assert ready.exists(), first.stderr.read()[-3000:] if first.poll() is not None else "no lock taken"
        second = _child("run", str(out), "0", str(tmp_path / "second.json"))
        assert second.returncode != 0
        message = [line for line in second.stderr.splitlines() if "OutputDirLocked" in line][-1]
        assert f"output_dir={str(out)!r} is in use by another training run: pid {first.pid} on host " \
               f"{socket.gethostname()!r}" in message
        go.touch()
        assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    finally:
        go.touch()
        if first.poll() is None:
            first.kill()
    # the first run's checkpoints are its own, whole, and the lock is gone
    assert assert_every_checkpoint_complete(out) == ["checkpoint-1", "checkpoint-2"]
    assert not (out / LOCK_NAME).exists() and not (tmp_path / "second.json").exists()


def test_two_runs_started_together_never_mix(tmp_path):
    """Whichever starts first trains; the other stops with one named reason (the lock) or, when the first has
    finished already, trains after it and replaces its checkpoints (as HF); every checkpoint left is whole and one
    run's."""
    out = tmp_path / "out"
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), "run", str(out), "0", str(tmp_path / f"r{i}.json")],
                              env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes)[0] == 0, errors
    for code, err in zip(codes, errors):
        if code != 0:
            assert "is in use by another training run" in err, err[-3000:]
    names = assert_every_checkpoint_complete(out)
    assert names[-1] == "checkpoint-8"
    args = [torch.load(out / name / "training_args.bin", weights_only=False).output_dir for name in names]
    assert set(args) == {str(out)}


def test_under_ddp_a_busy_output_dir_stops_every_rank(tmp_path):
    """Rank 0 checks the lock and tells the other ranks: both stop with the message, none waits at a barrier."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "run": "0123abcd",
                                             "created": 0}))  # this test process: alive
    proc = _child("run", str(out), "0", str(tmp_path / "r.json"), env={"FAULT_DDP": "1"}, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.count(f"is in use by another training run: pid {os.getpid()}") >= 2  # raised on both ranks
    assert sorted(os.listdir(out)) == [LOCK_NAME] and not (tmp_path / "r.json").exists()


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, caplog, one_thread):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "run": "deadbeef",
                                             "created": 0}))
    (out / "tmp-checkpoint-3-deadbeef").mkdir()  # the dead run's unfinished save
    with caplog.at_level("WARNING", logger="hf_lightning"):
        _script().make_trainer(str(out), max_steps=2).train()
    assert any("taking over the lock of a run that no longer exists" in r.getMessage() for r in caplog.records)
    assert sorted(os.listdir(out)) == ["checkpoint-1", "checkpoint-2"]


def test_a_lock_of_another_host_is_refused_with_how_to_remove_it(tmp_path, one_thread):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"host": "elsewhere", "pid": 1, "run": "0123abcd", "created": 0}))
    trainer = _script().make_trainer(str(out), max_steps=2)
    with pytest.raises(OutputDirLocked, match=r"pid 1 on host 'elsewhere' .*if that run is dead, delete .*"):
        trainer.train()
    assert sorted(os.listdir(out)) == [LOCK_NAME]


def test_train_twice_in_one_process_and_after_an_exception(tmp_path, one_thread):
    """The lock is given back at the end of `fit`, also when it ends in an exception: the same process trains again
    on that folder (here resuming), and a second Trainer object can take it."""
    from transformers import TrainerCallback

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise RuntimeError("boom")

    out = tmp_path / "out"
    failing = _script().make_trainer(str(out), [Boom()], max_steps=4)
    with pytest.raises(RuntimeError, match="boom"):
        failing.train()
    assert not (out / LOCK_NAME).exists()
    trainer = _script().make_trainer(str(out), max_steps=4)
    trainer.train(resume_from_checkpoint=True)
    trainer.train(resume_from_checkpoint=True)  # again: at the end, nothing left to train
    assert trainer.state.global_step == 4 and not (out / LOCK_NAME).exists()


# ----- folders the run did not write -----
FOREIGN = ["checkpoint-abc", "checkpoint-final", "checkpoint-5-backup", "checkpoint-4-good-copy", "checkpoint-"]


def test_foreign_folders_are_never_touched_nor_block_a_fresh_run(tmp_path, one_thread):
    out = tmp_path / "out"
    for name in FOREIGN:
        (out / name).mkdir(parents=True)
        (out / name / "notes.txt").write_text(name)
    trainer = _script().make_trainer(str(out), max_steps=5, save_total_limit=2)
    trainer.train()  # a fresh run: not refused, the folders are not checkpoints
    assert sorted(os.listdir(out)) == sorted(FOREIGN + ["checkpoint-4", "checkpoint-5"])
    assert all((out / name / "notes.txt").read_text() == name for name in FOREIGN)
    resumed = _script().make_trainer(str(out), max_steps=6, save_total_limit=1)
    resumed.train(resume_from_checkpoint=True)  # resume picks checkpoint-5, not checkpoint-final
    assert sorted(os.listdir(out)) == sorted(FOREIGN + ["checkpoint-6"])


# ----- damaged checkpoint files -----
@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("damaged") / "out"
    _script().make_trainer(str(out), max_steps=4, save_steps=2, save_total_limit=None).train()
    return out


DAMAGED = ["model.safetensors", "trainer_state.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
           "lightning_state.pt", "training_args.bin", "config.json"]


@pytest.mark.parametrize("name", DAMAGED)
@pytest.mark.parametrize("damage", ["truncated", "emptied"])
def test_every_damaged_file_is_named_with_the_previous_complete_checkpoint(two_checkpoints, tmp_path, name, damage,
                                                                           one_thread):
    out = tmp_path / "out"
    shutil.copytree(two_checkpoints, out)
    target = out / "checkpoint-4" / name
    with open(target, "r+b") as f:
        f.truncate(target.stat().st_size // 2 if damage == "truncated" else 0)
    trainer = _script().make_trainer(str(out), max_steps=6, save_steps=2, save_total_limit=None)
    with pytest.raises(DamagedCheckpointError) as info:
        trainer.train(resume_from_checkpoint=True)
    message = str(info.value)
    assert f"resume_from_checkpoint={str(out / 'checkpoint-4')!r}: {name} is damaged (" in message
    assert f"The previous complete checkpoint is {str(out / 'checkpoint-2')!r}" in message
    # following the advice works: move the damaged folder away, resume from the previous one
    shutil.move(out / "checkpoint-4", tmp_path / "damaged-checkpoint-4")
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6


def test_a_corrupted_file_that_passes_the_quick_check_is_named_when_it_fails_to_load(two_checkpoints, tmp_path,
                                                                                    one_thread):
    out = tmp_path / "out"
    shutil.copytree(two_checkpoints, out)
    target = out / "checkpoint-4" / "optimizer.pt"
    data = bytearray(target.read_bytes())
    data[200:400] = bytes(200)  # inside the archive: its directory at the end is intact
    target.write_bytes(bytes(data))
    trainer = _script().make_trainer(str(out), max_steps=6, save_steps=2, save_total_limit=None)
    with pytest.raises(DamagedCheckpointError, match=r"optimizer.pt is damaged \(.*The previous complete checkpoint"):
        trainer.train(resume_from_checkpoint=True)


def test_a_checkpoint_that_lost_its_optimizer_files_is_not_resumed_as_model_only(two_checkpoints, tmp_path):
    """A half-deleted folder (before deletion was atomic) could lose optimizer.pt and scheduler.pt only; its RNG
    and loop state show it was not saved with save_only_model, so it is refused, not resumed without optimizer."""
    folder = tmp_path / "checkpoint-4"
    shutil.copytree(two_checkpoints / "checkpoint-4", folder)
    (folder / "optimizer.pt").unlink()
    (folder / "scheduler.pt").unlink()
    with pytest.raises(FileNotFoundError, match="optimizer.pt and scheduler.pt are missing .*rng_state.pth"):
        check_checkpoint(folder)


# ----- a full disk, a read-only folder -----
def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or 'not permitted'}): run as root to test a "
                    "full or read-only disk")


def test_a_full_disk_names_the_file_and_keeps_earlier_checkpoints(tmp_path, two_checkpoints):
    checkpoint_bytes = sum(f.stat().st_size for f in (two_checkpoints / "checkpoint-2").iterdir())
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, f"size={int(checkpoint_bytes * 1.6)}")  # room for one checkpoint, not two
    try:
        proc = _child("disk", str(disk / "out"), str(tmp_path / "result.json"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads((tmp_path / "result.json").read_text())
        assert result["error"] == "CheckpointWriteError" and result["errno"] == 28, result
        assert result["message"].startswith("[Errno 28] No space left on device while writing ")
        assert f"{disk / 'out'}/tmp-checkpoint-2-" in result["message"]  # the file being written is named
        assert "earlier checkpoints are intact" in result["message"]
        assert sorted(os.listdir(disk / "out")) == ["checkpoint-1"]  # no lock, no unfinished folder left
        assert_every_checkpoint_complete(disk / "out")
    finally:
        subprocess.run(["umount", str(disk)], check=False, timeout=60)


def test_a_read_only_output_dir_is_refused_at_construction(tmp_path):
    readonly = tmp_path / "ro"
    _mount_tmpfs(readonly, "ro,size=1m")
    try:
        with pytest.raises(ValueError, match=r"output_dir='.*/ro/out' is not writable \(Read-only file system"):
            _script().make_trainer(str(readonly / "out"))
    finally:
        subprocess.run(["umount", str(readonly)], check=False, timeout=60)
    target = tmp_path / "a-file"
    target.write_text("")
    with pytest.raises(ValueError, match=r"output_dir='.*/a-file' is a file, not a folder"):
        _script().make_trainer(str(target))


def test_a_full_disk_at_the_clis_final_save_is_one_line_with_the_truth(tmp_path):
    """Issue 29: the CLI's final save (model, tokenizer, training_args.bin in output_dir) on a full disk: one
    `error:` line saying the final model is incomplete and the checkpoints untouched, exit status 1. (Before: a
    44-line traceback whose text said an unfinished folder was removed and to resume, neither true there.)"""
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "size=64k")  # the lock file fits, the model does not
    try:
        repo = Path(__file__).resolve().parents[1]
        proc = subprocess.run(
            [sys.executable, "-m", "hf_lightning", "fit", "--config", "configs/text_classification.yaml",
             "--args.output_dir", str(disk / "out"), "--args.max_steps", "1", "--args.save_strategy", "no",
             "--args.eval_strategy", "no", "--args.load_best_model_at_end", "false", "--args.report_to", "none",
             "--data.max_train_samples", "32", "--trainer.enable_progress_bar", "false"],
            cwd=repo, env={**ENV, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run(["umount", str(disk)], check=False, timeout=60)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert line.startswith("hf-lightning fit: error: [Errno 28] No space left on device while writing "), line
    assert f"The final model in {str(disk / 'out')!r} is incomplete; the checkpoint-<n> folders are untouched." in line
    assert "unfinished folder is removed" not in line and "resume_from_checkpoint" not in line
