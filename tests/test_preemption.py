"""Pre-emption and Ctrl-C with real processes and real signals (tests/scripts/preempt_train.py signals itself at a
chosen phase and step, so every instant is reproducible: no timers, no races).

- SIGTERM / SIGUSR1 with `enable_jit_checkpoint=True`: the update in progress finishes, `checkpoint-<step>` is written
  through the normal save (complete, atomic), no further update runs, `train()` raises `TrainingPreempted` (exit
  status 143 / 138 when uncaught), one line names the checkpoint and how to resume; the resumed run's losses,
  evaluations and weights are the uninterrupted run's. A second signal during that save changes nothing; a
  SIGKILL during it leaves only complete checkpoints; a failing write raises its error.
- `enable_jit_checkpoint=False`: the same stop and status, nothing written.
- Ctrl-C: `train()` raises `KeyboardInterrupt` (not Lightning's `SystemExit(1)`); the line names the checkpoint.
- The CLI: status 143 with the `--ckpt_path` line, which resumes the run; Ctrl-C: status 130 with the line.
- HF's own JIT-checkpoint tests' behaviours: the handler is installed for training and the original put back after,
  a second signal does not save twice, the checkpoint is at the current step with nothing unfinished left, a failure
  in the save is raised, no second save when the update's own save wrote that step, training stops.
- 2 gloo processes: the signal to one rank or to both, at random phases (in a step, in an evaluation, in a save, in
  a `save_async` write): every rank stops after the same update, every resumed run equals the uninterrupted one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import load_script

import hf_lightning
from hf_lightning.checkpoint.integrity import folder_problems
from hf_lightning.checkpoint.find import check_checkpoint

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts"
SCRIPT = SCRIPTS / "preempt_train.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(SCRIPTS),
                                                                 os.environ.get("PYTHONPATH")]))}


def _script():
    return load_script("preempt_train")


def _child(tmp_path: Path, timeout: int = 300, env: dict | None = None, **spec
           ) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the script once (`mode: once`) into tmp_path/out; its process and its result file."""
    spec = {"mode": "once", "out": str(tmp_path / "out"), "result": str(tmp_path / "result.json"), **spec}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(path)], env={**ENV, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    result = json.loads(Path(spec["result"]).read_text()) if Path(spec["result"]).exists() else {}
    return proc, result


def _folders(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))


def _assert_complete(out: Path) -> None:
    for name in _folders(out):
        check_checkpoint(out / name)
        assert folder_problems(out / name) == {}, name
        state = json.loads((out / name / "trainer_state.json").read_text())
        assert name == f"checkpoint-{state['global_step']}"


def _stop_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Training stopped by")]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The uninterrupted run (this process): its output_dir (checkpoint-2, -4, -6), its losses and evaluation losses
    as the script records them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    script = _script()
    out = tmp_path_factory.mktemp("reference") / "out"
    trainer = script.make_trainer(str(out))
    trainer.train()
    torch.set_num_threads(threads)
    history = trainer.state.log_history
    return out, script.losses(history), script.eval_losses(history)


@pytest.fixture(scope="module")
def reference(reference_run):
    return reference_run[1:]


def _resume_here(out: Path) -> tuple[list, list]:
    script = _script()
    trainer = script.make_trainer(str(out))
    trainer.train(resume_from_checkpoint=True)
    return script.losses(trainer.state.log_history), script.eval_losses(trainer.state.log_history)


# ----- one process -----
def test_sigterm_writes_the_checkpoint_ends_with_143_and_the_resume_is_exact(tmp_path, reference, one_thread):
    """SIGTERM while update 3 runs, and twice more while its checkpoint is written: update 3 completes, one
    `checkpoint-3` (complete), no update 4, the process ends with 143 (`TrainingPreempted` uncaught, no traceback)
    after one line naming the folder and `resume_from_checkpoint`; resuming continues exactly. (Before: status 0,
    nothing saved.)"""
    triggers = [{"rank": 0, "phase": "step_begin", "step": 2, "signal": "SIGTERM"},
                {"rank": 0, "phase": "save", "step": 3, "signal": "SIGTERM", "count": 2}]
    proc, result = _child(tmp_path, triggers=triggers)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    out = tmp_path / "out"
    assert _folders(out) == ["checkpoint-2", "checkpoint-3"]
    _assert_complete(out)
    assert result["global_step"] == 3 and result["saves"] == [2, 3]  # one save of step 3, whatever the 2nd signal
    (line,) = _stop_lines(proc.stderr)
    assert line == (f"Training stopped by SIGTERM after update 3; {out}/checkpoint-3 (written now); resume with "
                    f"trainer.train(resume_from_checkpoint='{out}/checkpoint-3').")
    losses, evals = _resume_here(out)
    assert (losses, evals) == reference


class _WritesAFile:
    """A pickle that creates `path` when it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_fresh_run_into_another_runs_output_dir_names_its_own_checkpoint_and_runs_no_pickle(tmp_path,
                                                                                               reference_run):
    """Issue 29 items 1 and 3: output_dir holds an earlier run's `checkpoint-6`, whose `training_args.bin` writes a
    file when unpickled; a fresh run, SIGTERM after update 1, `enable_jit_checkpoint=True`: nothing runs, the line
    and `TrainingPreempted.checkpoint` name `checkpoint-1`, the folder this run wrote. (Before: the pickle ran at
    the start, and the line said "checkpoint-6 (written now)": resuming from it returned the old run's weights.)"""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copytree(reference_run[0] / "checkpoint-6", out / "checkpoint-6")
    marker = tmp_path / "pwned"
    torch.save(_WritesAFile(marker), out / "checkpoint-6" / "training_args.bin")
    triggers = [{"rank": 0, "phase": "step_end", "step": 1, "signal": "SIGTERM"}]
    proc, result = _child(tmp_path, triggers=triggers, catch=True, settings={"save_steps": 100, "eval_steps": 100})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists()
    stopped = result["stopped"]
    assert stopped["step"] == 1 and stopped["saved"]
    assert stopped["checkpoint"] == str(out / "checkpoint-1")
    assert stopped["message"] == (f"Training stopped by SIGTERM after update 1; {out}/checkpoint-1 (written now); "
                                  f"resume with trainer.train(resume_from_checkpoint='{out}/checkpoint-1').")
    check_checkpoint(out / "checkpoint-1")


def test_sigterm_during_setup_ends_with_143_and_names_the_checkpoint_being_resumed(tmp_path, reference_run):
    """Issue 29: SIGTERM in Lightning's setup of a resuming fit (after the data checks, before the checkpoint is
    loaded): exit 143, one line naming the checkpoint the run resumes from, no traceback. (Before: the default
    handler ended the process with no line.)"""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copytree(reference_run[0] / "checkpoint-4", out / "checkpoint-4")
    proc, _ = _child(tmp_path, triggers=[{"rank": 0, "phase": "setup", "step": 0, "signal": "SIGTERM"}], resume=True)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = _stop_lines(proc.stderr)
    assert line.startswith("Training stopped by SIGTERM before its first update (during setup"), line
    assert line.endswith(f"; {out}/checkpoint-4 (the last complete checkpoint); resume with "
                         f"trainer.train(resume_from_checkpoint='{out}/checkpoint-4')."), line


def test_train_raises_training_preempted_which_a_script_can_catch(tmp_path, one_thread):
    """SIGUSR1 (SLURM's `--signal=USR1@...`) during the evaluation of step 3: `train()` raises
    `hf_lightning.TrainingPreempted`, a `SystemExit` with code 138 (128 + SIGUSR1), after `checkpoint-3`; the
    script's `except` runs; the signal handlers are the original ones again."""
    triggers = [{"rank": 0, "phase": "eval", "step": 3, "signal": "SIGUSR1"}]
    proc, result = _child(tmp_path, triggers=triggers, catch=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stopped = result["stopped"]
    assert stopped["type"] == "TrainingPreempted" and stopped["is_system_exit"]
    assert stopped["code"] == 138 and stopped["signum"] == 10 and stopped["step"] == 3 and stopped["saved"]
    assert stopped["checkpoint"] == str(tmp_path / "out" / "checkpoint-3")
    assert stopped["message"].startswith("Training stopped by SIGUSR1 after update 3;")
    assert result["eval_losses"] and result["eval_losses"][-1][0] == 3  # the evaluation in progress completed
    assert result["handlers_restored"]
    _assert_complete(tmp_path / "out")
    assert issubclass(hf_lightning.TrainingPreempted, SystemExit)


def test_without_enable_jit_checkpoint_the_run_stops_with_143_and_writes_nothing(tmp_path, one_thread):
    """`enable_jit_checkpoint=False` (HF's default): the same stop after the update and status 143, no checkpoint
    written by the stop; the line names the last complete one and the argument that would have saved."""
    triggers = [{"rank": 0, "phase": "forward", "step": 2, "signal": "SIGTERM"}]
    proc, result = _child(tmp_path, triggers=triggers, settings={"enable_jit_checkpoint": False})
    assert proc.returncode == 143, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert _folders(out) == ["checkpoint-2"] and result["global_step"] == 3
    (line,) = _stop_lines(proc.stderr)
    assert f"{out}/checkpoint-2 (the last complete checkpoint)" in line
    assert "enable_jit_checkpoint=True writes a checkpoint" in line


def test_sigkill_during_the_preemption_save_leaves_only_complete_checkpoints(tmp_path, reference, one_thread):
    """SIGTERM, then SIGKILL in the middle of writing `checkpoint-3` (a scheduler's grace period running out): no
    `checkpoint-3`, `checkpoint-2` complete, and the resume from it is exact (today's SIGKILL guarantees)."""
    triggers = [{"rank": 0, "phase": "step_end", "step": 3, "signal": "SIGTERM"},
                {"rank": 0, "phase": "save", "step": 3, "signal": "SIGKILL"}]
    proc, _ = _child(tmp_path, triggers=triggers)
    assert proc.returncode == -9, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert _folders(out) == ["checkpoint-2"]
    _assert_complete(out)
    assert _resume_here(out) == reference


def test_a_failing_preemption_save_raises_its_error(tmp_path, one_thread):
    """A write of `checkpoint-3` that fails (HF: the error is raised, not swallowed): the run ends with that error,
    no `checkpoint-3`, `checkpoint-2` intact."""
    triggers = [{"rank": 0, "phase": "step_begin", "step": 2, "signal": "SIGTERM"},
                {"rank": 0, "phase": "save", "step": 3, "signal": "RAISE"}]
    proc, result = _child(tmp_path, triggers=triggers, catch=True)
    assert proc.returncode == 1
    assert "simulated by the test's trigger" in proc.stderr and "CheckpointWriteError" in proc.stderr
    assert _folders(tmp_path / "out") == ["checkpoint-2"]
    _assert_complete(tmp_path / "out")


def test_no_second_save_when_the_update_saved_its_own_step(tmp_path, one_thread):
    """SIGTERM during update 4, whose regular save writes `checkpoint-4`: the stop writes nothing more (one
    `on_save` for step 4), as HF's callback turns `should_save` off when it saved."""
    triggers = [{"rank": 0, "phase": "pre_optimizer_step", "step": 3, "signal": "SIGTERM"}]
    proc, result = _child(tmp_path, triggers=triggers, catch=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["stopped"]["step"] == 4 and result["saves"] == [2, 4]
    assert _folders(tmp_path / "out") == ["checkpoint-2", "checkpoint-4"]


def test_ctrl_c_raises_keyboard_interrupt_and_names_the_last_checkpoint(tmp_path, one_thread):
    """SIGINT while update 5 runs: `train()` raises `KeyboardInterrupt` (as `transformers.Trainer`; before:
    `SystemExit(1)`), after one line naming `checkpoint-4` and `resume_from_checkpoint`; Ctrl-C works again after."""
    triggers = [{"rank": 0, "phase": "forward", "step": 4, "signal": "SIGINT"}]
    proc, result = _child(tmp_path, triggers=triggers, catch=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["stopped"]["type"] == "KeyboardInterrupt", result
    assert result["handlers_restored"]
    out = tmp_path / "out"
    (line,) = _stop_lines(proc.stderr)
    assert line.startswith("Training stopped by Ctrl-C (KeyboardInterrupt) after update 4;")
    assert f"resume with trainer.train(resume_from_checkpoint='{out}/checkpoint-4')" in line


def test_sigterm_during_evaluate_ends_with_143_not_0(tmp_path):
    """A standalone `evaluate()`: Lightning stops it at the next batch with its `SIGTERMException` (status 0);
    ours ends with `TrainingPreempted`, status 143."""
    proc, result = _child(tmp_path, triggers=[{"rank": 0, "phase": "eval", "step": 0, "signal": "SIGTERM"}],
                          evaluate=True, settings={"per_device_eval_batch_size": 1})
    assert proc.returncode == 143, proc.stderr[-3000:]
    (line,) = _stop_lines(proc.stderr)
    # (issue 29: only a checkpoint this run wrote or resumed from is named; an evaluate() wrote none)
    assert line.startswith("Training stopped by SIGTERM during evaluate() / predict() after update 0; this run wrote "
                           "no checkpoint")


def test_the_handler_is_installed_for_training_only(tmp_path, one_thread):
    """As HF's JIT callback: a SIGTERM handler of the run's own during training, the previous handler after."""
    import signal

    from transformers import TrainerCallback

    seen = []

    class Look(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    trainer = _script().make_trainer(str(tmp_path / "out"), max_steps=1, eval_strategy="no")
    trainer.add_callback(Look())
    trainer.train()
    assert seen and seen[0] is not before and getattr(seen[0], "__self__", None) is not None
    assert type(seen[0].__self__).__name__ == "PreemptionConnector"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("signal_name", ["SIGUSR1", "SIGTERM"])
def test_under_slurm_auto_requeue_the_requeue_signal_requeues_after_the_checkpoint(tmp_path, signal_name):
    """Lightning's `SLURMEnvironment(auto_requeue=True)`: its requeue signal (SIGUSR1) writes the checkpoint, then
    rank 0 runs `scontrol requeue <job id>` (a stand-in `scontrol` on PATH records its arguments and what the output
    folder held then), and the process ends with 138. SIGTERM (`scancel`) stops the same way without a requeue."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol.txt"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@ $(ls {tmp_path / 'out'} | grep '^checkpoint-' | tr '\\n' ' ')\" "
                        f">> {record}\n")
    scontrol.chmod(0o755)
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "0", "SLURM_JOB_NAME": "train", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    triggers = [{"rank": 0, "phase": "step_begin", "step": 2, "signal": signal_name}]
    proc, _ = _child(tmp_path, triggers=triggers, slurm=True, env=slurm)
    assert proc.returncode == (138 if signal_name == "SIGUSR1" else 143), proc.stderr[-3000:]
    assert _folders(tmp_path / "out") == ["checkpoint-2", "checkpoint-3"]
    if signal_name == "SIGUSR1":
        assert record.read_text().split() == ["requeue", "4242", "checkpoint-2", "checkpoint-3"]
    else:
        assert not record.exists()


# ----- the command line -----
def _cli(tmp_path: Path, step: int, signal_name: str, *extra: str) -> subprocess.CompletedProcess:
    config = tmp_path / "signal.yaml"
    config.write_text("hf_callbacks:\n  - class_path: signal_callback.SignalAtStep\n"
                      f"    init_args: {{step: {step}, signal: {signal_name}}}\nallow_code_from: [signal_callback]\n")
    argv = ["fit", "--config", "configs/text_classification.yaml", "--config", str(config),
            "--args.output_dir", str(tmp_path / "out"), "--args.max_steps", "6", "--args.logging_steps", "1",
            "--args.save_strategy", "steps", "--args.save_steps", "2", "--args.save_total_limit", "null",
            "--args.load_best_model_at_end", "false",
            "--args.per_device_train_batch_size", "8", "--args.enable_jit_checkpoint", "true",
            "--data.max_train_samples", "48",
            "--data.max_eval_samples", "8", "--trainer.enable_progress_bar", "false", *extra]
    return subprocess.run([sys.executable, "-m", "hf_lightning", *argv], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=300, preexec_fn=_sigint_as_from_a_terminal)


def _sigint_as_from_a_terminal() -> None:
    """The child's SIGINT at its default: a job a shell started in the background without job control (`cmd &` in a
    script: how some CI runners start the suite) ignores SIGINT, every process below inherits that, and Python then
    keeps ignoring it: Ctrl-C would do nothing in the child, whatever hf_lightning does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_cli_sigterm_ends_with_143_and_the_printed_ckpt_path_resumes(tmp_path):
    proc = _cli(tmp_path, 2, "SIGTERM")
    assert proc.returncode == 143, proc.stderr[-3000:]
    out = tmp_path / "out"
    (line,) = _stop_lines(proc.stderr)
    assert line.endswith(f"resume with the same command and --ckpt_path {out}/checkpoint-3.")
    _assert_complete_cli(out, ["checkpoint-2", "checkpoint-3"])
    resumed = _cli(tmp_path, 99, "SIGTERM", "--ckpt_path", f"{out}/checkpoint-3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    state = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3, 4, 5, 6]


def test_cli_sigterm_while_the_run_is_built_ends_with_143_and_one_line(tmp_path):
    """Issue 29: SIGTERM while the CLI builds the run (data loaded and checked, before tokenising): exit 143, one
    line, no traceback. (Before: the default handler, no line.)"""
    config = tmp_path / "signal.yaml"
    config.write_text("hf_callbacks:\n  - class_path: signal_callback.SignalAtInit\n"
                      "allow_code_from: [signal_callback]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "hf_lightning", "fit", "--config", "configs/text_classification.yaml", "--config",
         str(config), "--args.output_dir", str(tmp_path / "out"), "--data.max_train_samples", "16"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = _stop_lines(proc.stderr)
    assert line == ("Training stopped by SIGTERM before its first update (during setup: loading and checking the "
                    "data, tokenising, loading the checkpoint); this run wrote no checkpoint and resumed from none, "
                    "so a new run starts from the beginning.")


def _assert_complete_cli(out: Path, names: list[str]) -> None:
    assert _folders(out) == names
    for name in names:
        check_checkpoint(out / name)
        assert folder_problems(out / name) == {}


def test_cli_ctrl_c_ends_with_130_and_one_line(tmp_path):
    proc = _cli(tmp_path, 2, "SIGINT")
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = _stop_lines(proc.stderr)
    out = tmp_path / "out"
    assert line.startswith("Training stopped by Ctrl-C (KeyboardInterrupt) after update 2;")
    assert line.endswith(f"resume with the same command and --ckpt_path {out}/checkpoint-2.")


# ----- two processes -----
STEP_PHASES = ("step_begin", "substep_end", "pre_optimizer_step", "forward")  # at global_step g: update g + 1 runs
CATEGORIES = ("step", "eval", "save", "save_async")


def _random_trigger(rng: random.Random, rank: int, category: str | None) -> tuple[dict, int]:
    """A trigger at a random phase of `category` (None: any) and step of the 6-update run (evaluations at 3 and 6,
    saves at 2, 4, 6), and the update after which the run must stop (for a background write: at the earliest)."""
    if category is None:
        category = rng.choice(CATEGORIES[:3])
    if category == "step":
        phase = rng.choice([*STEP_PHASES, "step_end"])
        step = rng.randrange(1, 7) if phase == "step_end" else rng.randrange(0, 6)
        return {"rank": rank, "phase": phase, "step": step, "signal": "SIGTERM"}, step + (phase != "step_end")
    phase = "eval" if category == "eval" else "save"
    step = rng.choice([3, 6] if phase == "eval" else [2, 4, 6])
    return {"rank": rank, "phase": phase, "step": step, "signal": "SIGTERM"}, step


def _trials(count: int, seed: int) -> list[dict]:
    """`count` trials; trial i signals rank 0, rank 1 or both (i % 3), the first of them in a step, an evaluation,
    a save or a `save_async` background write (i % 4: 12 trials cover every pair); the other rank of a "both" trial
    at the same instant or a random one."""
    rng = random.Random(seed)
    trials = []
    for index in range(count):
        ranks = [[0], [1], [0, 1]][index % 3]
        category = CATEGORIES[index % 4]
        save_async = category == "save_async" or rng.random() < 0.3
        drawn = [_random_trigger(rng, ranks[0], category)]
        if len(ranks) == 2:
            same = rng.random() < 0.5
            drawn.append(({**drawn[0][0], "rank": 1}, drawn[0][1]) if same else _random_trigger(rng, 1, None))
        expected = [None if save_async and t["phase"] == "save" else step for t, step in drawn]
        trials.append({"triggers": [t for t, _ in drawn], "save_async": save_async, "expected": expected})
    return trials


def _run_trials(tmp_path: Path, count: int, seed: int) -> list[dict]:
    spec = {"mode": "trials", "ddp": True, "root": str(tmp_path), "result": str(tmp_path / "result.json"),
            "trials": _trials(count, seed)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "spec.json")], env=ENV, capture_output=True,
                          text=True, timeout=780)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "result.json").read_text())
    assert len(results) == count
    for outcome in results:
        trial = outcome["trial"]
        fixed = [step for step in trial["expected"] if step is not None]
        assert outcome["stopped_at"] is not None, outcome
        if fixed:  # the signalled rank's stop is agreed by both: after the first signalled update at the latest
            assert outcome["stopped_at"] <= min(fixed), outcome
        if len(fixed) == len(trial["expected"]):  # no background write involved: exactly there
            assert outcome["stopped_at"] == min(fixed), outcome
        else:  # a signal from a background write lands while training goes on: at that update or a later one
            assert outcome["stopped_at"] >= min(t["step"] for t in trial["triggers"]), outcome
        assert outcome["code"] == 143 and outcome["checkpoint"] == f"checkpoint-{outcome['stopped_at']}", outcome
        assert outcome["complete"] and outcome["losses_equal"] and outcome["evals_equal"], outcome
        assert outcome["weights_equal"], outcome
    return results


def test_two_processes_stop_together_and_resume_exactly(tmp_path):
    """3 trials (the signal to rank 0 / rank 1 / both) on 2 gloo processes."""
    _run_trials(tmp_path, 3, seed=1)


def test_two_processes_at_random_instants_many(tmp_path):
    """24 trials at random phases (in a step, an evaluation, a save, a `save_async` write), to one rank or both:
    each stops every rank after the same update with a complete checkpoint, and each resume is exact."""
    results = _run_trials(tmp_path, 24, seed=2026)
    print(f"SIGTERM trials: tried {len(results)}, stopped with a complete checkpoint "
          f"{sum(r['complete'] and r['stopped_at'] is not None for r in results)}, resumed exactly "
          f"{sum(r['losses_equal'] and r['evals_equal'] and r['weights_equal'] for r in results)}")
