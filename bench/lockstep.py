"""Lock-step runs: several benchmark runners in separate processes, taking turns one optimizer update at a time.

Why: the machine these benchmarks ran on is a shared 2-vCPU VM whose speed drifts by +-10-30% over seconds to
minutes (host contention that no in-VM measure shows), so two runs made one after the other differ by more than the
effect being measured. In lock-step, runner A does update 1, then B does update 1, then C, then A does update 2, ...:
every runner sees the same machine speed within about one update, and only one process computes at any time.

How: each runner is a spawned process with its own `StepTimer`, which takes turns through a `_RingGate`
(`common.ACTIVE_GATE`): a process waits for its semaphore when an update starts and, at the update's end, releases
the next process's semaphore and waits for its own again. An update's duration runs from getting the turn to the
end of the update, so waiting is not counted; what happens between two updates (loader, hooks, callbacks) is. All
processes build their trainer first (a barrier), then the first one gets the turn; after their last update they
wait at a second barrier so no process's teardown overlaps another's timed updates.

Trade-off: between two updates of one runner the other runners' updates run, so each update starts with caches
holding someone else's data. This costs every runner alike, but the absolute rates are a little lower than in
sequential runs; compare ratios, not absolute numbers, across modes. The `train()` wall time includes the waiting
and is meaningless here.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import threading
from collections.abc import Callable
from typing import Any

import common
from common import RunResult

_TIMEOUT_S = 900.0


class _RingGate:
    """`common.TurnGate` over a ring of semaphores: process i waits on `mine`, then releases `following`."""

    def __init__(self, mine: Any, following: Any, ready: Any, done: Any) -> None:
        self.mine, self.following, self.ready, self.done = mine, following, ready, done
        self._started = False

    def wait_turn(self) -> None:
        if not self._started:  # first update: everybody has built its trainer
            self._started = True
            self.ready.wait(_TIMEOUT_S)
        if not self.mine.acquire(timeout=_TIMEOUT_S):
            raise TimeoutError("lock-step: no turn within the timeout (did another runner fail?)")

    def pass_turn(self, last: bool) -> None:
        self.following.release()
        if last:
            self.done.wait(_TIMEOUT_S)
        else:
            self.wait_turn()


def _worker(
    module: str, function: str, args: tuple, threads: int, gate_parts: tuple, results: Any, index: int
) -> None:
    """Child process: import the runner, install the gate, run, send back the `RunResult` (or the error)."""
    import importlib

    import torch

    try:
        bench = importlib.import_module("bench_throughput")
        bench.quiet()
        torch.set_num_threads(threads)
        common.ACTIVE_GATE = _RingGate(*gate_parts)
        runner = getattr(importlib.import_module(module), function)
        results.put((index, runner(*args)))
    except BaseException as exc:  # noqa: BLE001 - the parent must hear about any failure
        results.put((index, RuntimeError(f"{function} failed: {exc!r}")))
        for barrier in gate_parts[2:]:
            barrier.abort()  # release the parent and the other runners instead of letting them time out
        raise


def run_lockstep(runners: list[functools.partial], threads: int) -> list[RunResult]:
    """Run `runners` (picklable `partial`s of module-level runner functions taking a last `output_dir` argument)
    in lock-step, one process each, and return their results in the same order."""
    import tempfile

    ctx = mp.get_context("spawn")
    n = len(runners)
    semaphores = [ctx.Semaphore(0) for _ in range(n)]
    ready, done = ctx.Barrier(n + 1), ctx.Barrier(n)
    results: Any = ctx.Queue()
    processes = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, partial in enumerate(runners):
            fn: Callable[..., RunResult] = partial.func
            args = (*partial.args, f"{tmp}/{i}")
            gate_parts = (semaphores[i], semaphores[(i + 1) % n], ready, done)
            proc = ctx.Process(
                target=_worker, args=(fn.__module__, fn.__name__, args, threads, gate_parts, results, i), daemon=True
            )
            proc.start()
            processes.append(proc)
        collected: dict[int, Any] = {}
        try:
            ready.wait(_TIMEOUT_S)  # every runner has built its trainer and waits for its first turn
            semaphores[0].release()
            for _ in range(n):
                index, value = results.get(timeout=_TIMEOUT_S)
                collected[index] = value
        except threading.BrokenBarrierError:
            index, value = results.get(timeout=60)
            collected[index] = value
        finally:
            for proc in processes:
                proc.join(60)
                if proc.is_alive():
                    proc.terminate()
    errors = [v for v in collected.values() if isinstance(v, BaseException)]
    if errors:
        raise errors[0]
    return [collected[i] for i in range(n)]
