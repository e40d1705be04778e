"""Writing checkpoints in a background thread (`save_async=True`): one job in flight per process, errors re-raised
in the training thread, and the processes of a run told apart through marker files.

The training thread captures a `CheckpointContent` (copies in CPU memory) and hands it to `BackgroundWriter.start`;
the job writes this process's files into the run's temporary folder, and then:

- on the other ranks: writes `.rank-<r>-written` (or `.rank-<r>-failed` with the error) into the folder;
- on rank 0: waits until every other rank's marker is there (a failed one, or none within `timeout`, abandons the
  save), removes the markers, checks, flushes and renames the folder (`io.finalize_checkpoint`), then rotates.

Collectives cannot run from a second thread next to training's, hence the files: the folder is on the file system
every rank writes to anyway. A process that dies mid-write leaves the temporary folder, never a `checkpoint-<n>`.
`wait` joins the job and re-raises its error (the next save and the end of training call it, so at most one job is
in flight and the end of `train()` waits for the last one).
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

__all__ = ["BackgroundWriter", "mark_failed", "mark_written", "wait_for_ranks"]

_POLL_S = 0.02


def _marker(folder: Path, rank: int, outcome: str) -> Path:
    return folder / f".rank-{rank}-{outcome}"


def mark_written(folder: Path, rank: int) -> None:
    """Rank `rank` has written (and flushed) its files into `folder`."""
    _marker(folder, rank, "written").write_text("")


def mark_failed(folder: Path, rank: int, error: BaseException) -> None:
    """Rank `rank` could not write its files into `folder` (the marker holds the error)."""
    # the folder may be what failed: rank 0 then times out waiting and says so
    with contextlib.suppress(OSError):
        _marker(folder, rank, "failed").write_text(f"{type(error).__name__}: {error}")


def wait_for_ranks(folder: Path, world_size: int, timeout: float) -> None:
    """Wait until ranks 1..world_size-1 have marked `folder` written; remove their markers.

    Raises:
        RuntimeError: a rank marked it failed (its error is in the message), or not every rank did within `timeout`.
    """
    deadline = time.monotonic() + timeout
    pending = set(range(1, world_size))
    while pending:
        for rank in sorted(pending):
            failed = _marker(folder, rank, "failed")
            if failed.exists():
                raise RuntimeError(f"Rank {rank} failed to write its part of {folder}: {failed.read_text()}")
            if _marker(folder, rank, "written").exists():
                pending.discard(rank)
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"Ranks {sorted(pending)} did not finish writing their part of {folder} within "
                               f"{timeout:.0f} s; the checkpoint is not renamed into place.")
        if pending:
            time.sleep(_POLL_S)
    for rank in range(1, world_size):
        _marker(folder, rank, "written").unlink(missing_ok=True)


class BackgroundWriter:
    """At most one checkpoint job in flight, on a thread of its own; its error surfaces at the next `wait`."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._error_trace = ""

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, job: Callable[[], None], name: str) -> None:
        """Run `job` in the background (after `wait` returned: one job at a time)."""
        if self._thread is not None:
            raise RuntimeError("BackgroundWriter.start: the previous job was not waited for.")

        def run() -> None:
            try:
                job()
            except BaseException as error:  # kept for the training thread, which re-raises it
                self._error, self._error_trace = error, traceback.format_exc()

        # not a daemon: a process that ends normally finishes its checkpoint first
        self._thread = threading.Thread(target=run, name=name, daemon=False)
        self._thread.start()

    def wait(self, raise_errors: bool = True) -> None:
        """Block until the job in flight (if any) is done; re-raise its error (`raise_errors`), else drop it.

        Raises:
            the job's exception, with the background traceback in its notes.
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None and raise_errors:
            if hasattr(error, "add_note"):  # Python >= 3.11
                error.add_note(f"(raised while writing a checkpoint in the background)\n{self._error_trace}")
            raise error
