"""One training run per `output_dir` at a time: the lock file `<output_dir>/.hf_lightning.lock`.

A run takes the lock before it looks at or writes anything in `output_dir` (start-up checks, leftover cleanup,
checkpoints, rotation) and gives it back when `fit` ends, normally or by an exception. The file is created
atomically (`O_CREAT | O_EXCL`) and holds the host, the process id, the process start time and the run id; the
run id also names the run's temporary folders (`folders.py`), and every rename into `checkpoint-<n>` first checks
that the lock still names this run.

- Held by a live process: the second run is refused with one line naming the holder (host, pid, since when).
- Held by a process of this host that no longer exists (a killed run): taken over, with a warning. The start
  time guards against a recycled pid.
- Held by another host: it cannot be checked from here, so the run is refused and the message says how to
  remove the file if that run is known to be dead.

Checking a stale lock and replacing it happen under an `flock` on the directory, so two runs starting together
after a crash cannot both take it over. Under DDP only rank 0 calls this (the callers broadcast the outcome).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LOCK_NAME", "OutputDirLocked", "RunLock", "read_lock"]

log = logging.getLogger(__name__)

LOCK_NAME = ".hf_lightning.lock"
_HELD_HERE: set[str] = set()  # run ids whose lock this process holds now (a lock of this pid not in it leaked)


class OutputDirLocked(RuntimeError):
    """Another run holds the lock of this `output_dir` (the message names it)."""


def _process_start(pid: int) -> str | None:
    """The kernel's start time of process `pid` (field 22 of `/proc/<pid>/stat`), None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the run named by a lock of this host still runs (the same process, not a recycled pid; in this
    process, a run that has not released it yet)."""
    pid = int(holder.get("pid", -1))
    if pid <= 0:
        return False
    if pid == os.getpid():
        return holder.get("run") in _HELD_HERE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    started = holder.get("process_start")
    return started is None or _process_start(pid) in (None, started)


def read_lock(output_dir: str | Path) -> dict[str, Any] | None:
    """The holder recorded in the lock file, `{}` for an unreadable one, None when there is no lock."""
    try:
        text = (Path(output_dir) / LOCK_NAME).read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "an unknown process (the lock file is empty or unreadable)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("created", 0)))
    return f"pid {holder.get('pid')} on host {holder.get('host')!r} (run {holder.get('run')}, since {since})"


@contextmanager
def _directory_guard(output_dir: Path) -> Iterator[None]:
    """An exclusive `flock` on the directory itself: serialises stale-lock checks between runs on this host."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the O_EXCL creation alone still refuses a second live run
        yield
        return
    fd = os.open(output_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


@dataclass
class RunLock:
    """The lock of one run on `output_dir`; `run` is this run's id (hex)."""

    output_dir: Path
    run: str

    @property
    def path(self) -> Path:
        return self.output_dir / LOCK_NAME

    @classmethod
    def acquire(cls, output_dir: str | Path) -> RunLock:
        """Create `output_dir` if needed and take its lock.

        Raises:
            OutputDirLocked: another live run (or a run on another host) holds it.
        """
        root = Path(output_dir)
        root.mkdir(parents=True, exist_ok=True)
        lock = cls(root, secrets.token_hex(4))
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
                  "run": lock.run, "created": time.time()}
        with _directory_guard(root):
            existing = read_lock(root)
            if existing is not None:
                lock._take_over(existing)
            fd = os.open(lock.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump(holder, f)
                f.flush()
                os.fsync(f.fileno())
        _HELD_HERE.add(lock.run)
        return lock

    def _take_over(self, existing: dict[str, Any]) -> None:
        """Remove a stale lock (a dead process of this host), else raise naming the holder."""
        same_host = existing.get("host") == socket.gethostname()
        if same_host and existing and not _alive(existing):
            log.warning("output_dir=%r: taking over the lock of a run that no longer exists (%s); its unfinished "
                        "checkpoint folders are cleaned up.", str(self.output_dir), _describe(existing))
            self.path.unlink()
            return
        if same_host or not existing:
            advice = "wait for it to finish, stop it, or choose another output_dir"
        else:
            advice = (f"if that run is dead, delete {self.path}; otherwise wait for it, or choose another "
                      "output_dir")
        raise OutputDirLocked(
            f"output_dir={str(self.output_dir)!r} is in use by another training run: {_describe(existing)}; {advice}."
        )

    def held(self) -> bool:
        """Whether the lock file still names this run (checked before every rename into `checkpoint-<n>`)."""
        holder = read_lock(self.output_dir)
        return holder is not None and holder.get("run") == self.run and holder.get("pid") == os.getpid()

    def check_held(self) -> None:
        """Raise when the lock no longer names this run (removed by hand, taken by another run).

        Raises:
            OutputDirLocked: naming the current holder.
        """
        if self.held():
            return
        holder = read_lock(self.output_dir)
        now = "nobody" if holder is None else _describe(holder)
        raise OutputDirLocked(
            f"output_dir={str(self.output_dir)!r}: this run (run {self.run}) no longer holds the lock {self.path} "
            f"(now held by {now}); its checkpoint was not renamed into place so that it cannot mix with another "
            "run's. Run one training per output_dir at a time."
        )

    def release(self) -> None:
        """Remove the lock file if it still names this run."""
        _HELD_HERE.discard(self.run)
        if self.held():
            with suppress(FileNotFoundError):
                self.path.unlink()
