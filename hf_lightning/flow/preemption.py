"""Pre-emption signals during `fit`: noted by a handler, agreed by every rank at an update boundary.

Lightning 2.6 turns SIGTERM into `SIGTERMException` (a `SystemExit` with status 0: a scheduler sees success), raised
at the next batch, and its handler runs a `broadcast` from rank 0 inside the signal handler: a collective that pairs
with whatever collective another rank runs next, when the signal reaches one rank only or lands in an evaluation
or a save. Here the handler only notes the signal; `PreemptionGuard.agreed` runs one all-reduce per update at the
same point on every rank (after the update's log / evaluate / save pass), so every rank learns together that one of
them was signalled, whichever rank it was and whatever it was doing. `HFTrainerFlow` then writes the checkpoint
through the normal save path (`enable_jit_checkpoint=True`) and raises `TrainingPreempted` (flow/interruption.py):
`PreemptionStop`, which also prints the line naming where to resume after Ctrl-C or a signal outside training.

`PreemptionConnector` is Lightning's `_SignalConnector` with the SIGTERM / requeue-signal handlers replaced; the
original handlers are put back by Lightning's own teardown at the end of `fit`. Under Lightning's
`SLURMEnvironment(auto_requeue=True)` the job is requeued once the checkpoint is complete, when the signal was the
environment's requeue signal (SIGUSR1 by default), as Lightning's own handler does (Lightning's writes a `.ckpt` from
inside the handler instead).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

from hf_lightning._lightning_compat import (
    SignalConnector,
    cluster_environment,
    replace_signal_connector,
    signal_connector,
)
from hf_lightning.args import TrainingArguments
from hf_lightning.checkpoint.lifecycle import Checkpoints
from hf_lightning.flow.interruption import TrainingPreempted, signal_name, stop_line
from hf_lightning.flow.steps import HFLoopSteps, HFRun

__all__ = ["PreemptionConnector", "PreemptionGuard", "PreemptionStop", "preemption_signals", "requeue_signal"]

log = logging.getLogger(__name__)


def requeue_signal(environment: Any) -> int | None:
    """The signal after which the job is requeued: Lightning's `SLURMEnvironment(auto_requeue=True)`'s
    `requeue_signal` (SIGUSR1 unless set), else None."""
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue and environment.requeue_signal:
        return int(environment.requeue_signal)
    return None


def preemption_signals(environment: Any) -> tuple[int, ...]:
    """The signals that pre-empt a run: SIGTERM (SLURM, Kubernetes, spot instances) and SIGUSR1, or the SLURM
    environment's own `requeue_signal` in its place (`SLURMEnvironment(requeue_signal=...)` configures it)."""
    if sys.platform == "win32":  # no SIGUSR1 there
        return (int(signal.SIGTERM),)
    second = requeue_signal(environment)
    if second is None and isinstance(environment, SLURMEnvironment) and environment.requeue_signal:
        second = int(environment.requeue_signal)
    return tuple(dict.fromkeys([int(signal.SIGTERM), second if second is not None else int(signal.SIGUSR1)]))


class PreemptionConnector(SignalConnector):
    """Lightning's signal connector whose pre-emption handlers only note the signal (see the module docstring).

    Attributes:
        signum: the first pre-emption signal this process received during this `fit` (None: none).
        count: how many it received (a second one while the checkpoint is written changes nothing).
    """

    def __init__(self, trainer: pl.Trainer) -> None:
        super().__init__(trainer)
        self.signum: int | None = None
        self.count = 0

    def register_signal_handlers(self) -> None:
        """Called by Lightning when the fit loop is about to run; `_SignalConnector.teardown` restores the originals."""
        self.received_sigterm = False  # Lightning's loops never raise `SIGTERMException`: the flow stops the run
        self.signum, self.count = None, 0
        self._original_handlers = self._get_current_signal_handlers()
        for signum in preemption_signals(cluster_environment(self.trainer)):
            self._register_signal(signum, self._note)

    def _note(self, signum: int, _: FrameType | None) -> None:
        # No logging, no collective, no I/O here: the handler may interrupt any line of training, a save included.
        self.count += 1
        if self.signum is not None:
            return
        self.signum = int(signum)
        launcher = self.trainer.strategy.launcher
        if launcher is not None:  # Lightning's own handler does this: rank 0 passes it to the processes it started
            launcher.kill(signum)


class PreemptionGuard:
    """The pre-emption state of one `HFTrainerFlow`: installs the connector, and agrees at update boundaries."""

    def __init__(self) -> None:
        self.connector: PreemptionConnector | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A copied flow (`hyperparameter_search`, pickling) does not carry the trainer the connector points at."""
        return {"connector": None}

    def install(self, trainer: pl.Trainer) -> None:
        """Replace `trainer`'s signal connector by a `PreemptionConnector` (in `setup`, before Lightning registers
        its handlers)."""
        connector = signal_connector(trainer)
        if not isinstance(connector, PreemptionConnector):
            connector = PreemptionConnector(trainer)
            replace_signal_connector(trainer, connector)
        self.connector = connector

    @property
    def local_signal(self) -> int | None:
        """The signal this process received during the current fit (no agreement)."""
        return None if self.connector is None else self.connector.signum

    def agreed(self, trainer: pl.Trainer) -> int:
        """The pre-emption signal any rank received (its number; 0: none). One all-reduce (MAX) under several
        processes: every rank must call this at the same point of the same update."""
        local = self.local_signal or 0
        if trainer.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return local
        flag = torch.tensor([local], dtype=torch.int32, device=trainer.strategy.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    @staticmethod
    def requeue(trainer: pl.Trainer, signum: int) -> None:
        """Under `SLURMEnvironment(auto_requeue=True)`, after its requeue signal: `scontrol requeue <job>` on global
        rank 0 (the job id as Lightning reads it, array jobs included)."""
        if not trainer.is_global_zero or requeue_signal(cluster_environment(trainer)) != signum:
            return
        array_job = os.getenv("SLURM_ARRAY_JOB_ID")
        job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.getenv("SLURM_JOB_ID", "")
        if not re.fullmatch(r"[0-9_]+", job):
            log.warning(f"SLURM job id {job!r} not understood: the job is not requeued.")
            return
        result = subprocess.call(["scontrol", "requeue", job])
        if result == 0:
            log.warning(f"Requeued SLURM job {job}.")
        else:
            log.warning(f"Requeuing SLURM job {job} failed: `scontrol requeue` exited with {result}.")


class PreemptionStop:
    """Stops a run on a pre-emption signal (after this update's checkpoint) and prints where to resume from.

    Args:
        args: the training arguments (`enable_jit_checkpoint`, `output_dir`).
        hf: the run's HF state (its `global_step` names the stop).
        steps: the flow's steps (their `save` writes the pre-emption checkpoint, as a scheduled save).
        checkpoints: the run's checkpoints (the last saved step; waiting for a background save).
        resume_hint: how the entry point resumes from a checkpoint folder (`{path}`), in the line a stopped run
            prints (`hf_lightning.Trainer`: `trainer.train(resume_from_checkpoint=...)`, the CLI: `--ckpt_path`).
    """

    def __init__(self, args: TrainingArguments, hf: HFRun, steps: HFLoopSteps, checkpoints: Checkpoints,
                 resume_hint: str) -> None:
        self.args = args
        self.hf = hf
        self.steps = steps
        self.checkpoints = checkpoints
        self.resume_hint = resume_hint
        self.guard = PreemptionGuard()

    def after_update(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """At the end of every update, on every rank (one collective): when any rank received a pre-emption signal,
        write this update's checkpoint through the normal save (`enable_jit_checkpoint=True`, unless this update's
        own save wrote it), wait until it is complete, and raise `TrainingPreempted`: no further update runs.

        Raises:
            TrainingPreempted: a rank was signalled (every rank raises it, after the same save).
        """
        signum = self.guard.agreed(trainer)
        if not signum:
            return
        jit = bool(self.args.enable_jit_checkpoint)
        if jit and self.checkpoints.last_saved_step != self.hf.state.global_step:
            self.steps.save(trainer, pl_module)
        self.checkpoints.wait(trainer)  # `save_async`: the checkpoint in flight is in place before the process ends
        self.guard.requeue(trainer, signum)  # Lightning's SLURM auto-requeue, once the checkpoint is complete
        raise self.preempted(trainer, signum, saved=jit)

    def preempted(self, trainer: pl.Trainer, signum: int, saved: bool, during: str = "") -> TrainingPreempted:
        """The exception for a run stopped by `signum` (`during`: where, after the signal's name); its one line
        printed on global rank 0."""
        checkpoint = self.checkpoints.this_runs_checkpoint()
        save_hint = None if self.args.enable_jit_checkpoint else \
            "enable_jit_checkpoint=True writes a checkpoint when a run is pre-empted"
        step = self.hf.state.global_step
        line = stop_line(signal_name(signum) + during, step, checkpoint, self.resume_hint, saved, save_hint)
        self.say_stopped(trainer, line)
        return TrainingPreempted(signum, step, checkpoint, saved, line)

    @contextmanager
    def outside_training(self, trainer: pl.Trainer) -> Iterator[None]:
        """`evaluate()` / `predict()`: Lightning ends them at the next batch after a SIGTERM with its
        `SIGTERMException` (a `SystemExit` with status 0: a scheduler would see success); `TrainingPreempted`
        (status 143, with the line) instead.

        Raises:
            TrainingPreempted: Lightning stopped the run on SIGTERM.
        """
        try:
            yield
        except SIGTERMException:
            raise self.preempted(trainer, int(signal.SIGTERM), saved=False, during=" during evaluate() / predict()"
                                 ) from None

    def interrupted_line(self, trainer: pl.Trainer) -> None:
        """Ctrl-C: print the line naming the last complete checkpoint (global rank 0)."""
        checkpoint = self.checkpoints.this_runs_checkpoint()
        self.say_stopped(trainer, stop_line("Ctrl-C (KeyboardInterrupt)", self.hf.state.global_step, checkpoint,
                                            self.resume_hint))

    @staticmethod
    def say_stopped(trainer: pl.Trainer, line: str) -> None:
        # printed, not logged: the run's log level (`log_level="error"`...) must not hide where to resume from
        if trainer.is_global_zero:
            print(line, file=sys.stderr, flush=True)
