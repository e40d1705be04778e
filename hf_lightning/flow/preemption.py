"""Pre-emption signals during `fit`: noted by a handler, agreed by every rank at an update boundary.

Lightning 2.6 turns SIGTERM into `SIGTERMException` (a `SystemExit` with status 0: a scheduler sees success), raised
at the next batch, and its handler runs a `broadcast` from rank 0 inside the signal handler: a collective that pairs
with whatever collective another rank runs next, when the signal reaches one rank only or lands in an evaluation
or a save. Here the handler only notes the signal; `PreemptionGuard.agreed` runs one all-reduce per update at the
same point on every rank (after the update's log / evaluate / save pass), so every rank learns together that one of
them was signalled, whichever rank it was and whatever it was doing. `HFTrainerFlow` then writes the checkpoint
through the normal save path (`enable_jit_checkpoint=True`) and raises `TrainingPreempted` (flow/interruption.py).

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
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment

from hf_lightning._lightning_compat import SignalConnector, cluster_environment, replace_signal_connector

__all__ = ["PreemptionConnector", "PreemptionGuard", "preemption_signals", "requeue_signal"]

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
        if not isinstance(getattr(trainer, "_signal_connector", None), PreemptionConnector):
            replace_signal_connector(trainer, PreemptionConnector(trainer))
        self.connector = trainer._signal_connector  # type: ignore[assignment]  # set just above

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
