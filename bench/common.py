"""Shared pieces of the benchmarks: the two model/data cases, a step timer, run records and summary statistics.

Timing method (used by every benchmark here)
--------------------------------------------
Every runner records `time.perf_counter()` at the end of each optimizer update: the HF-style trainers through a
`transformers.TrainerCallback.on_step_end` (fired by `transformers.Trainer` and by `hf_lightning.Trainer` at the
same point of the update), the hand-written loop right after `zero_grad()`. The *steady-state* rate is

    (steps - warmup) / (t_end_of_last_update - t_end_of_update_number_warmup)

so setup (trainer construction, `fit` setup, optimizer creation, the first loader iterator) and the first `warmup`
updates are excluded, and everything that happens between two updates (data loading, collation, loop hooks,
callbacks) is included. Two secondary numbers are kept:

- the *median-step* rate `1 / median(t[i] - t[i-1])` over the same updates: insensitive to the occasional update
  stretched by another process taking the CPU (the benchmark machine is shared), but blind to work done only
  every k-th update;
- the *CPU-time* rate `(steps - warmup) / (process CPU seconds over those updates)`: time this process was
  pre-empted does not count, so on a shared machine it is the most stable of the three (exact with
  `--threads 1`, where all the work runs on the calling thread; with more threads it also counts OpenMP spinning);
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
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

__all__ = [
    "CASES",
    "Case",
    "RunResult",
    "StepTimer",
    "TARGET_CASES",
    "ContentionMeter",
    "add_common_flags",
    "fresh_process_state",
    "run_isolated",
    "wait_for_quiet",
    "make_result",
    "median",
    "median_others_share",
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


class StepTimer(TrainerCallback):
    """Records `perf_counter()` at the end of every optimizer update (HF's `on_step_end`, or `mark()` by hand)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu_times: list[float] = []

    def mark(self) -> None:
        """Record the end of one update (wall clock and this process's CPU time)."""
        self.times.append(time.perf_counter())
        self.cpu_times.append(time.process_time())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.mark()

    def _check(self, warmup: int) -> None:
        if not 1 <= warmup < len(self.times):
            raise ValueError(f"warmup must be in [1, {len(self.times) - 1}] for {len(self.times)} timed updates.")

    def steady_rate(self, warmup: int) -> float:
        """Updates per second after the first `warmup` updates: `(steps - warmup) / elapsed` (the module docstring)."""
        self._check(warmup)
        return (len(self.times) - warmup) / (self.times[-1] - self.times[warmup - 1])

    def median_step_rate(self, warmup: int) -> float:
        """`1 / median(duration of one update)` after `warmup`: robust to pre-emption by other processes."""
        self._check(warmup)
        steps = [b - a for a, b in zip(self.times[warmup - 1 :], self.times[warmup:])]
        return 1.0 / statistics.median(steps)

    def cpu_rate(self, warmup: int) -> float:
        """Updates per CPU-second of this process after `warmup` (all its threads): ignores time spent pre-empted."""
        self._check(warmup)
        return (len(self.cpu_times) - warmup) / (self.cpu_times[-1] - self.cpu_times[warmup - 1])


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
    """

    def __init__(self) -> None:
        self.others_share: float | None = None

    def __enter__(self) -> ContentionMeter:
        self._busy, self._ours, self._wall = _busy_cpu_seconds(), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        busy = _busy_cpu_seconds()
        if busy is None or self._busy is None:
            return
        wall = time.perf_counter() - self._wall
        ours = time.process_time() - self._ours
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


def add_common_flags(parser: Any, default_threads: int = 2) -> None:
    """`--threads`, `--quiet-wait`, `--max-others`: the process and machine settings every benchmark takes."""
    parser.add_argument("--threads", type=int, default=default_threads, help="torch.set_num_threads before every run")
    parser.add_argument(
        "--quiet-wait", type=float, default=0.0,
        help="before each run, wait up to this many seconds for other processes to go below --max-others",
    )
    parser.add_argument(
        "--max-others", type=float, default=0.1,
        help="share of the machine's CPU other processes may use for the machine to count as quiet",
    )


def median_others_share(results: dict[str, list[RunResult]]) -> float | None:
    """Median over all runs of the CPU share other processes used (None when it could not be measured)."""
    shares = [r.others_share for runs in results.values() for r in runs if r.others_share is not None]
    return median(shares) if shares else None


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
