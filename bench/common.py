"""Shared pieces of the benchmarks: the model/data cases, a step timer, run isolation and summary statistics.

Timing method (used by every benchmark here)
--------------------------------------------
Every runner records `time.perf_counter()` at the end of each optimizer update: the HF-style trainers through a
`transformers.TrainerCallback.on_step_end` (fired by `transformers.Trainer` and by `hf_lightning.Trainer` at the
same point of the update), the hand-written loop right after `zero_grad()`. The *steady-state* rate is

    (steps - warmup) / (t_end_of_last_update - t_end_of_update_number_warmup)

(in general: the number of updates after the warm-up over the sum of their durations, an update lasting from the
end of the previous one, or from the moment its process got the turn under `lockstep.py`, to its own end),

so setup (trainer construction, `fit` setup, optimizer creation, the first loader iterator) and the first `warmup`
updates are excluded, and everything that happens between two updates (data loading, collation, loop hooks,
callbacks) is included. Three secondary numbers are kept:

- the *median-step* rate `1 / median(t[i] - t[i-1])` over the same updates: insensitive to the occasional update
  stretched by another process taking the CPU (the benchmark machine is shared), but blind to work done only
  every k-th update;
- the *CPU-time* rate `(steps - warmup) / (process CPU seconds over those updates)`: time this process was
  pre-empted by other processes of the machine does not count (a slower host still does); with `--threads 1` all
  the work runs on the calling thread, with more threads it also counts OpenMP spinning;
- the wall time of the whole `train()` call (setup included).
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from transformers import TrainerCallback

__all__ = [
    "CASES",
    "Case",
    "RunResult",
    "StepTimer",
    "TurnGate",
    "TARGET_CASES",
    "ContentionMeter",
    "add_common_flags",
    "fresh_process_state",
    "use_heap_malloc",
    "run_isolated",
    "run_mode",
    "wait_for_quiet",
    "make_result",
    "median",
    "median_others_share",
    "paired_ratios",
    "rotate",
]

SEED = 42
MODEL_SEED = 0


@dataclass(frozen=True)
class Case:
    """One benchmark workload: a model built from a config, synthetic data, a batch size and default step counts.

    Attributes:
        name: CLI name of the case.
        description: one line for reports.
        batch_size: `per_device_train_batch_size` (one micro-batch = one update, no accumulation).
        default_steps: optimizer updates per run.
        default_warmup: leading updates excluded from the steady-state rate.
        build_model: returns a freshly initialised model (same weights on every call).
        build_dataset: `(num_samples) -> datasets.Dataset` with the model's input columns and `labels`.
    """

    name: str
    description: str
    batch_size: int
    default_steps: int
    default_warmup: int
    build_model: Callable[[], nn.Module]
    build_dataset: Callable[[int], Any]


def _seeded(builder: Callable[[], nn.Module]) -> nn.Module:
    """Build a model under a fixed seed so every runner starts from identical weights."""
    torch.manual_seed(MODEL_SEED)
    return builder()


def _tiny_bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, num_labels=2,
    )
    return _seeded(lambda: BertForSequenceClassification(config))


def _nano_bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=1000, hidden_size=4, num_hidden_layers=1, num_attention_heads=1, intermediate_size=4,
        max_position_embeddings=64, num_labels=2,
    )
    return _seeded(lambda: BertForSequenceClassification(config))


def _small_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=8192, n_positions=128, n_embd=256, n_layer=4, n_head=4)
    return _seeded(lambda: GPT2LMHeadModel(config))


def _bert_dataset(num_samples: int, seq_len: int = 32, vocab: int = 1000) -> Any:
    """`input_ids`, an all-ones `attention_mask` and binary `labels`, uniformly random (fixed seed)."""
    import datasets

    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab, (num_samples, seq_len), generator=g)
    labels = torch.randint(0, 2, (num_samples,), generator=g)
    return datasets.Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist(), "labels": labels.tolist()}
    )


def _nano_dataset(num_samples: int) -> Any:
    return _bert_dataset(num_samples, seq_len=8)


def _gpt2_dataset(num_samples: int, seq_len: int = 128, vocab: int = 8192) -> Any:
    """Random `input_ids` with `labels = input_ids` (the model shifts them), fixed seed."""
    import datasets

    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab, (num_samples, seq_len), generator=g).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


CASES: dict[str, Case] = {
    "bert": Case(
        name="bert",
        description="tiny BERT classifier (hidden 32, 2 layers, 2 heads, ffn 64, seq 32, batch 16)",
        batch_size=16, default_steps=200, default_warmup=20,
        build_model=_tiny_bert, build_dataset=_bert_dataset,
    ),
    "gpt2": Case(
        name="gpt2",
        description="small GPT-2 LM (n_embd 256, 4 layers, 4 heads, seq 128, batch 8, vocab 8192)",
        batch_size=8, default_steps=30, default_warmup=5,
        build_model=_small_gpt2, build_dataset=_gpt2_dataset,
    ),
    # Not one of the target cases: a model so small that a step is almost only framework overhead, to measure
    # the per-update cost of each trainer's own code (the difference between runners is their overhead).
    "overhead": Case(
        name="overhead",
        description="nano BERT (hidden 4, 1 layer, seq 8, batch 16): per-update framework overhead",
        batch_size=16, default_steps=1000, default_warmup=100,
        build_model=_nano_bert, build_dataset=_nano_dataset,
    ),
}
TARGET_CASES = ("bert", "gpt2")
"""The cases `--case all` runs."""


class TurnGate(Protocol):
    """Turn-taking between benchmark processes that run in lock-step (see `lockstep.py`)."""

    def wait_turn(self) -> None:
        """Block until it is this process's turn to run one update."""

    def pass_turn(self, last: bool) -> None:
        """Hand the turn to the next process; unless `last`, block until it comes back."""


ACTIVE_GATE: TurnGate | None = None
"""Set by `lockstep.py` in its worker processes; every `StepTimer` created there takes turns through it."""


class StepTimer(TrainerCallback):
    """Times every optimizer update: from its start (`begin()` / the previous update's end) to its end (`mark()`).

    HF-style trainers drive it as a `TrainerCallback` (`on_train_begin` -> `begin`, `on_step_end` -> `mark`); a
    hand-written loop calls `begin()` before its loop and `mark()` after each update. Under `lockstep.py` the update
    starts when this process gets its turn, so the time spent waiting for other processes is not counted.
    """

    def __init__(self, steps: int | None = None) -> None:
        self.steps = steps
        self.gate = ACTIVE_GATE
        self.starts: list[float] = []
        self.times: list[float] = []
        self.cpu_starts: list[float] = []
        self.cpu_times: list[float] = []

    def _start(self) -> None:
        self.starts.append(time.perf_counter())
        self.cpu_starts.append(time.process_time())

    def begin(self) -> None:
        """The first update is about to start (waits for this process's turn under lock-step)."""
        if self.gate is not None:
            self.gate.wait_turn()
        self._start()

    def mark(self) -> None:
        """Record the end of one update (wall clock and this process's CPU time); the next one starts now."""
        self.times.append(time.perf_counter())
        self.cpu_times.append(time.process_time())
        last = self.steps is not None and len(self.times) >= self.steps
        if self.gate is not None:
            self.gate.pass_turn(last)
        if not last:
            self._start()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.mark()

    def _durations(self, warmup: int, cpu: bool = False) -> list[float]:
        """Durations of the updates after the first `warmup` ones."""
        if not 1 <= warmup < len(self.times) or len(self.starts) < len(self.times):
            raise ValueError(f"warmup must be in [1, {len(self.times) - 1}] for {len(self.times)} timed updates "
                             f"(and begin() must have been called).")
        starts, ends = (self.cpu_starts, self.cpu_times) if cpu else (self.starts, self.times)
        return [end - start for start, end in zip(starts[warmup:], ends[warmup:])]

    def steady_rate(self, warmup: int) -> float:
        """Updates per second after the first `warmup` updates: `(steps - warmup) / elapsed` (the module docstring)."""
        durations = self._durations(warmup)
        return len(durations) / sum(durations)

    def median_step_rate(self, warmup: int) -> float:
        """`1 / median(duration of one update)` after `warmup`: robust to pre-emption by other processes."""
        return 1.0 / statistics.median(self._durations(warmup))

    def cpu_rate(self, warmup: int) -> float:
        """Updates per CPU-second of this process after `warmup` (all its threads): ignores time spent pre-empted."""
        durations = self._durations(warmup, cpu=True)
        return len(durations) / sum(durations)


@dataclass
class RunResult:
    """One timed run of one runner.

    Attributes:
        runner: runner name.
        steady_ups: steady-state optimizer updates per second (`StepTimer.steady_rate`).
        median_step_ups: `1 / median(update duration)` (`StepTimer.median_step_rate`).
        cpu_ups: updates per CPU-second of the process (`StepTimer.cpu_rate`).
        total_s: wall time of the whole training call (setup included).
        steps: updates actually done.
        loss: mean training loss reported by the runner (a sanity check that all did the same work).
        others_share: share of the machine's CPU used by other processes during the run (`ContentionMeter`).
        extra: anything else a benchmark wants to keep.
    """

    runner: str
    steady_ups: float
    median_step_ups: float
    cpu_ups: float
    total_s: float
    steps: int
    loss: float
    others_share: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def make_result(runner: str, timer: StepTimer, warmup: int, total_s: float, steps: int, loss: float) -> RunResult:
    """A `RunResult` from a finished run's step timer."""
    return RunResult(
        runner=runner, steady_ups=timer.steady_rate(warmup), median_step_ups=timer.median_step_rate(warmup),
        cpu_ups=timer.cpu_rate(warmup), total_s=total_s, steps=steps, loss=loss,
    )


def _busy_cpu_seconds() -> float | None:
    """CPU seconds spent busy by the whole machine since boot (all cores, `/proc/stat`), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class ContentionMeter:
    """How much of the machine *other* processes used while a block ran: `(machine busy - ours) / (wall * cores)`.

    0 means the benchmark had the machine to itself; 0.5 on 2 cores means others kept one core busy throughout.
    With `children=True`, "ours" also counts the CPU time of child processes the block started and waited for
    (the runner processes of `lockstep.run_lockstep`, joined before it returns).
    """

    def __init__(self, children: bool = False) -> None:
        self.others_share: float | None = None
        self.children = children

    def _ours(self) -> float:
        if not self.children:
            return time.process_time()
        import resource

        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + usage.ru_utime + usage.ru_stime

    def __enter__(self) -> ContentionMeter:
        self._busy, self._ours_start, self._wall = _busy_cpu_seconds(), self._ours(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        busy = _busy_cpu_seconds()
        if busy is None or self._busy is None:
            return
        wall = time.perf_counter() - self._wall
        ours = self._ours() - self._ours_start
        self.others_share = max(0.0, (busy - self._busy - ours) / (wall * (os.cpu_count() or 1)))


def wait_for_quiet(max_others_share: float, timeout_s: float, window_s: float = 1.0) -> float | None:
    """Wait (at most `timeout_s`) until other processes use less than `max_others_share` of the machine over a
    `window_s` window; returns the last share seen (None when it cannot be measured or `timeout_s` is 0)."""
    if timeout_s <= 0:
        return None
    deadline = time.monotonic() + timeout_s
    share = None
    while time.monotonic() < deadline:
        with ContentionMeter() as meter:
            time.sleep(window_s)
        share = meter.others_share
        if share is None or share < max_others_share:
            break
    return share


def run_isolated(
    run: Callable[[str], RunResult], threads: int, quiet_wait_s: float = 0.0, max_others_share: float = 0.1
) -> RunResult:
    """One benchmark run: wait for a quiet machine (optional), reset the process state, run in a fresh temp dir,
    and record how much CPU other processes took meanwhile."""
    wait_for_quiet(max_others_share, quiet_wait_s)
    fresh_process_state(threads)
    with tempfile.TemporaryDirectory() as tmp, ContentionMeter() as meter:
        result = run(tmp)
    result.others_share = meter.others_share
    return result


def add_common_flags(parser: Any, default_threads: int = 1) -> None:
    """`--threads`, `--quiet-wait`, `--max-others`: the process and machine settings every benchmark takes.

    One intra-op thread by default: on the 2-core machine these numbers come from, other processes often hold a
    core, and two OpenMP threads then stall at every parallel region waiting for the descheduled one (a tiny BERT
    step went from 8 ms to 2 s); with one thread the runners are compared on the same, stable footing. Pass
    `--threads 2` on a quiet machine.
    """
    parser.add_argument("--threads", type=int, default=default_threads, help="torch.set_num_threads before every run")
    parser.add_argument(
        "--quiet-wait", type=float, default=0.0,
        help="before each run, wait up to this many seconds for other processes to go below --max-others",
    )
    parser.add_argument(
        "--max-others", type=float, default=0.1,
        help="share of the machine's CPU other processes may use for the machine to count as quiet",
    )
    parser.add_argument(
        "--heap-malloc", action="store_true",
        help="re-run under glibc settings that serve large tensors from a never-trimmed heap (see use_heap_malloc)",
    )
    parser.add_argument(
        "--lockstep", action="store_true",
        help="run the runners of a repeat in lock-step, one process each, taking turns per update (see lockstep.py)",
    )


def median_others_share(results: dict[str, list[RunResult]]) -> float | None:
    """Median over all runs of the CPU share other processes used (None when it could not be measured)."""
    shares = [r.others_share for runs in results.values() for r in runs if r.others_share is not None]
    return median(shares) if shares else None


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> dict[str, float]:
    """Per-repeat ratios of two interleaved series (repeat i of one over repeat i of the other): median and quartiles.

    Runs of the same repeat are minutes apart at most, so pairing them cancels slow drifts of the machine's speed
    that a ratio of two medians keeps.
    """
    ratios = sorted(a / b for a, b in zip(numerators, denominators))
    if len(ratios) < 2:
        return {"median": ratios[0], "q1": ratios[0], "q3": ratios[0], "n": len(ratios)}
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return {"median": statistics.median(ratios), "q1": q1, "q3": q3, "n": len(ratios)}


def run_mode(args: Any) -> str:
    """One line naming the options that change what is measured (for report headers)."""
    mode = "lock-step" if args.lockstep else "sequential"
    malloc = "heap malloc" if args.heap_malloc else "glibc default malloc"
    return f"{mode} runs, {malloc}"


HEAP_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 34),  # no mmap for large blocks: they come from (and return to) the heap
    "MALLOC_TRIM_THRESHOLD_": str(1 << 36),  # never give the heap's free top back to the kernel
    "MALLOC_TOP_PAD_": str(1 << 30),
}
"""glibc tunables for `--heap-malloc`."""


def use_heap_malloc() -> None:
    """Re-execute this script with `HEAP_MALLOC_ENV` (glibc reads these only at process start) unless already set.

    With glibc's defaults every tensor of 32 MiB or more (the GPT-2 case's logits, their gradient, the log-softmax
    output...) is a fresh `mmap` whose pages the kernel faults in and zeroes on first touch: about 40 000 page faults
    and 60-120 ms of system time per GPT-2 update here (10-17% of it), varying from run to run. Served from the heap,
    those blocks are reused and the faults disappear: same work for every runner, far less variance (what a
    production allocator such as jemalloc or tcmalloc gives too).
    """
    if all(os.environ.get(k) == v for k, v in HEAP_MALLOC_ENV.items()):
        return
    import sys

    os.environ.update(HEAP_MALLOC_ENV)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, *sys.argv])


def fresh_process_state(threads: int) -> None:
    """Put the process in the same state before every run: thread count pinned, garbage collected."""
    torch.set_num_threads(threads)
    gc.collect()


def median(values: Sequence[float]) -> float:
    """Median of the values."""
    return statistics.median(values)


def rotate(items: Sequence[Any], k: int) -> list[Any]:
    """`items` rotated left by `k` (so each runner takes every position across repeats)."""
    k %= len(items)
    return [*items[k:], *items[:k]]
