"""CPU threads: warn when torch's intra-op threads outnumber the free cores; never change them behind your back.

torch runs one intra-op thread per core by default (or `OMP_NUM_THREADS`, or what `torch.set_num_threads` set).
When other processes keep some of those cores busy, every parallel operation waits for its descheduled threads:
on a busy 2-core machine the same small fit ran 2-20x slower with 2 threads than with 1 (bench/bench_threads.py,
README "CPU threads"). hf_lightning leaves the thread count alone, because it changes the last bits of the results
(same arguments must give the same numbers, whatever the machine's load), and instead warns at the start of a CPU
fit, with the number to set.

The rule (`oversubscription`, pure): the other processes' share of our cores is the 1-minute load average minus this
run's own processes, scaled to the cores this process may use (a container sees the whole host's load); the free
cores are ours minus that share (rounded), and the warning fires when the run's threads (threads x local
processes) exceed them and more than one thread per process is used.
"""

from __future__ import annotations

import math
import os
import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.accelerators import CPUAccelerator

__all__ = ["ThreadOversubscriptionWarning", "available_cores", "oversubscription", "warn_if_oversubscribed"]


class ThreadOversubscriptionWarning(UserWarning):
    """More torch threads than free CPU cores (filter it with `warnings.filterwarnings`)."""


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota when there is one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def oversubscription(threads: int, local_processes: int, cores: int, host_cpus: int, load: float) -> str | None:
    """The warning text when `threads` per process x `local_processes` exceed the free cores, else None.

    Args:
        threads: `torch.get_num_threads()` of this process.
        local_processes: processes of this run on this machine (DDP on CPU: one per device).
        cores: cores this process may use (`available_cores()`).
        host_cpus: cores of the whole machine (`os.cpu_count()`), whose load `load` measures.
        load: the 1-minute load average (`os.getloadavg()[0]`), which counts this run's own processes too.
    """
    if threads <= 1:
        return None  # one thread per process is the least there is: nothing to advise
    others = max(0.0, load - local_processes) * min(1.0, cores / max(host_cpus, 1))
    free = max(0, cores - round(others))
    if threads * local_processes <= free:
        return None
    suggested = max(1, free // local_processes)
    per_process = f" per process x {local_processes} processes" if local_processes > 1 else ""
    return (
        f"torch uses {threads} threads{per_process} but only about {free} of the {cores} CPU cores are free "
        f"(1-minute load average {load:.1f}). With more threads than free cores every update waits for descheduled "
        f"threads and training can run several times slower. Set OMP_NUM_THREADS={suggested} (or call "
        f"torch.set_num_threads({suggested})) before starting; hf_lightning does not change the thread count "
        "itself, since that changes the last bits of the results."
    )


def warn_if_oversubscribed(trainer: pl.Trainer) -> None:
    """Warn (`ThreadOversubscriptionWarning`, global rank 0) at the start of a fit on CPU; see `oversubscription`."""
    if not isinstance(trainer.accelerator, CPUAccelerator) or not trainer.is_global_zero:
        return
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return
    local = max(1, trainer.world_size // max(trainer.num_nodes, 1))
    message = oversubscription(torch.get_num_threads(), local, available_cores(), os.cpu_count() or 1, load)
    if message:
        warnings.warn(message, ThreadOversubscriptionWarning, stacklevel=2)
