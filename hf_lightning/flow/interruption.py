"""How a run that was stopped from outside ends: `TrainingPreempted`, and the one line naming what to resume from.

A scheduler pre-empts a job with a signal (SIGTERM from SLURM, Kubernetes and spot instances; SIGUSR1 from SLURM's
`--signal` or Lightning's SLURM requeue); a person stops one with Ctrl-C. Either way the run prints one line naming
the last complete checkpoint and how to continue from it (`stop_line`), and `train()` raises: `TrainingPreempted`
for a signal (a `SystemExit`, so an uncaught one ends the process with 128 + the signal's number, 143 for SIGTERM,
as a process killed by that signal does), the `KeyboardInterrupt` itself for Ctrl-C (as `transformers.Trainer`).

Pure Python (no torch): `hf_lightning.TrainingPreempted` is importable before anything heavy is loaded.
"""

from __future__ import annotations

import signal

__all__ = ["TrainingPreempted", "exit_code", "signal_name", "stop_line"]


def exit_code(signum: int) -> int:
    """The exit status of a process ended by signal `signum` in a shell: 128 + its number (SIGTERM: 143)."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    """`SIGTERM`, `SIGUSR1`...; the number for a signal Python does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class TrainingPreempted(SystemExit):
    """`train()` stopped because the process received a pre-emption signal (SIGTERM, SIGUSR1 or SLURM's requeue
    signal); raised on every process, after the checkpoint of the last update is complete when
    `enable_jit_checkpoint=True`.

    A subclass of `SystemExit` (like Lightning's `SIGTERMException`), so `except Exception` in a script does not
    swallow it and an uncaught one ends the process with `code` (128 + the signal's number: 143 for SIGTERM), which
    tells a scheduler the job did not finish. Catch it to run your own clean-up, then re-raise.

    Attributes:
        code: the exit status (`SystemExit.code`).
        signum: the signal's number (the largest received by any process, when several were).
        step: the last update trained (`global_step`).
        checkpoint: the last complete `checkpoint-<n>` folder this run wrote, else the one it resumed from (None:
            neither; another run's checkpoints in the same `output_dir` are never named).
        saved: whether this stop wrote `checkpoint` (`enable_jit_checkpoint=True`).
        message: the line printed when training stopped (`str()` of the exception).
    """

    def __init__(self, signum: int, step: int, checkpoint: str | None, saved: bool, message: str) -> None:
        super().__init__(exit_code(signum))
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        self.saved = saved
        self.message = message

    def __str__(self) -> str:
        return self.message


def stop_line(cause: str, step: int, checkpoint: str | None, resume_hint: str,
              saved: bool = False, save_hint: str | None = None, head: str | None = None) -> str:
    """The one line a stopped run prints: what stopped it, at which update, the last complete checkpoint and how to
    continue from it.

    Args:
        cause: `"SIGTERM"`, `"Ctrl-C"`...
        step: the last update trained.
        checkpoint: the last complete checkpoint folder this run wrote or resumed from, or None.
        resume_hint: the entry point's way to resume, with `{path}` for the folder
            (`"trainer.train(resume_from_checkpoint={path!r})"`, the CLI's `--ckpt_path {path}`).
        saved: the stop itself wrote `checkpoint`.
        save_hint: said when nothing was saved by the stop (how to make a pre-emption save one).
        head: the line's start instead of "Training stopped by <cause> after update <step>".
    """
    head = head or f"Training stopped by {cause} after update {step}"
    if checkpoint is None:
        tail = "; this run wrote no checkpoint and resumed from none, so a new run starts from the beginning"
    else:
        kind = "written now" if saved else "the last complete checkpoint"
        tail = f"; {checkpoint} ({kind}); resume with {resume_hint.format(path=checkpoint)}"
    if not saved and save_hint:
        tail += f" ({save_hint})"
    return head + tail + "."
