"""A pre-emption signal before training starts: the stop line and exit status 128 + n, not a silent default death.

Lightning installs its (here: hf_lightning's, `flow/preemption.py`) signal handlers only once the fit loop is about
to run: after data preparation (tokenisation), the data checks, the model's setup and the resume's loading. A SIGTERM
in those minutes ended the process on the default handler, with no line saying what to resume from. `SetupStop`
covers them: from the start of `fit` (and of the CLI's construction) until Lightning's own handlers take over, the
signal stops the process at once with `TrainingPreempted` (nothing is half-written: no checkpoint is being saved
then) and the line naming the last complete checkpoint of this run (the one it resumes from, when it resumes).

Lightning keeps the handler it finds as the one to put back after `fit`, so `SetupStop` is active again between fit
and the end of its block; `close()` ends it early (the CLI closes it when its subcommand starts).

Pure Python (signal only): usable before anything heavy is imported.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from hf_lightning.flow.interruption import TrainingPreempted, signal_name, stop_line

__all__ = ["SetupStop", "setup_signals"]


def setup_signals() -> tuple[int, ...]:
    """SIGTERM, and SIGUSR1 where it exists (the signals `flow/preemption.py` treats as pre-emption by default)."""
    return tuple(int(s) for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s)


class SetupStop:
    """Until training starts, a pre-emption signal raises `TrainingPreempted` with its line (see the module docstring).

    Args:
        resume_hint: how the entry point resumes from a folder (`{path}`), as in `PreemptionStop`.
        checkpoint: the last complete checkpoint of this run (the one it resumes from), or None; called when the
            signal arrives.
        during: what was running, for the line (e.g. "setup: data checks, tokenisation, resume loading").
    """

    def __init__(self, resume_hint: str, checkpoint: Callable[[], str | None],
                 during: str = "setup: loading and checking the data, tokenising, loading the checkpoint") -> None:
        self.resume_hint = resume_hint
        self.checkpoint = checkpoint
        self.during = during
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SetupStop:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for signum in setup_signals():
                self._previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._stop)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Put the handlers found at `__enter__` back (idempotent)."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _stop(self, signum: int, _: FrameType | None) -> None:
        self.close()  # a second signal takes the default action
        try:
            checkpoint = self.checkpoint()
        except Exception:  # noqa: BLE001 - the stop must not fail on its own message
            checkpoint = None
        line = stop_line(signal_name(signum), 0, checkpoint, self.resume_hint,
                         head=f"Training stopped by {signal_name(signum)} before its first update (during "
                              f"{self.during})")
        if os.environ.get("RANK", "0") == "0":  # printed, not logged (as `PreemptionStop.say_stopped`)
            print(line, file=sys.stderr, flush=True)
        raise TrainingPreempted(signum, 0, checkpoint, False, line)
