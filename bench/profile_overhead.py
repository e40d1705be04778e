"""Where the time of one optimizer update goes, per runner: a section profile of `bench_throughput.py`'s runners.

Sampling profilers (py-spy, cProfile) distort this comparison: cProfile charges every Python call, and py-spy's
sampling costs grow with stack depth (Lightning's stacks are ~40 frames deep, the hand-written loop's ~5), which on
a 2-core machine slows the deep-stacked runner down. Here a few functions are wrapped with `perf_counter()` timers
(about a microsecond each) and each section's *exclusive* time is accumulated (a wrapped function's time minus the
time of wrapped functions it calls), after the warmup updates only. Per runner:

- shared sections, wrapped identically for all three runners: `data` (`DataLoader` iterator `__next__`: sampling,
  `datasets` row fetch, collation), `forward` (the model's `forward`), `backward` (`torch.autograd.backward`),
  `clip` (`torch.nn.utils.clip_grad_norm_`), `adam` (`torch.optim.AdamW.step` incl. the fused kernel), `sched`
  (`LRScheduler.step`), `zero_grad`;
- runner-specific sections: hf_lightning's hooks (`HFTrainerFlow.on_train_batch_start/end`,
  `TransformerModule.training_step` / `compute_loss` / `on_before_optimizer_step` / `_get_num_items_in_batch` own
  code, wherever in the class's bases they are defined),
  Lightning's wrappers (`LightningOptimizer.step`, `manual_backward`, `batch_to_device`, `on_advance_end`), and
  HF's (`Trainer.training_step` / `compute_loss` own code, `get_batch_samples`, `_maybe_log_save_evaluate`,
  callback events);
- `loop (rest)`: the update's wall time minus all sections: the trainer's loop code that is not wrapped.

Usage::

    python bench/profile_overhead.py --case overhead --steps 1000 --warmup 100 --repeats 3 --threads 1
    python bench/profile_overhead.py --case bert --steps 200 --warmup 20
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_throughput import RUNNERS, quiet  # noqa: E402
from common import CASES, add_common_flags, median, rotate, run_isolated, use_heap_malloc  # noqa: E402


class SectionProbe:
    """Exclusive wall time per named section, from wrapped functions (nesting-aware)."""

    def __init__(self) -> None:
        self.exclusive: Counter[str] = Counter()
        self._children: list[float] = []

    def reset(self) -> None:
        """Forget what was accumulated so far (called at the end of the warmup updates)."""
        self.exclusive.clear()

    def wrap(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        """`fn`, timed into section `name` (its signature is kept: Lightning and HF inspect some of them)."""
        probe = self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            probe._children.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                children = probe._children.pop()
                probe.exclusive[name] += elapsed - children
                if probe._children:
                    probe._children[-1] += elapsed

        return timed


def _targets(model_class: type) -> list[tuple[Any, str, str]]:
    """`(owner, attribute, section)` for every wrapped function."""
    import lightning.pytorch as pl
    import transformers
    from lightning.pytorch.core.optimizer import LightningOptimizer
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
    from lightning.pytorch.strategies.strategy import Strategy
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from hf_lightning.flow.flow import HFTrainerFlow
    from hf_lightning.module.module import TransformerModule

    return [
        (_BaseDataLoaderIter, "__next__", "data"),
        (model_class, "forward", "forward"),
        (torch.autograd, "backward", "backward"),
        (torch.nn.utils, "clip_grad_norm_", "clip"),
        (torch.optim.AdamW, "step", "adam"),
        (torch.optim.lr_scheduler.LRScheduler, "step", "sched"),
        (torch.optim.Optimizer, "zero_grad", "zero_grad"),
        (HFTrainerFlow, "on_train_batch_start", "hf_lightning: flow.on_train_batch_start"),
        (HFTrainerFlow, "on_train_batch_end", "hf_lightning: flow.on_train_batch_end"),
        (TransformerModule, "training_step", "hf_lightning: module.training_step"),
        (TransformerModule, "compute_loss", "hf_lightning: module.compute_loss"),
        (TransformerModule, "on_before_optimizer_step", "hf_lightning: module.on_before_optimizer_step"),
        (TransformerModule, "_get_num_items_in_batch", "hf_lightning: module._get_num_items_in_batch"),
        (LightningOptimizer, "step", "lightning: LightningOptimizer.step"),
        (pl.LightningModule, "manual_backward", "lightning: manual_backward"),
        (Strategy, "batch_to_device", "lightning: batch_to_device"),
        (_TrainingEpochLoop, "on_advance_end", "lightning: epoch_loop.on_advance_end"),
        (transformers.Trainer, "training_step", "hf: Trainer.training_step"),
        (transformers.Trainer, "compute_loss", "hf: Trainer.compute_loss"),
        (transformers.Trainer, "get_batch_samples", "hf: Trainer.get_batch_samples"),
        (transformers.Trainer, "_maybe_log_save_evaluate", "hf: Trainer._maybe_log_save_evaluate"),
        (transformers.trainer_callback.CallbackHandler, "call_event", "hf: CallbackHandler.call_event"),
    ]


def _defined(owner: Any, attr: str) -> Any:
    """The function `owner.attr` runs: for a class, the raw attribute of the first class of its MRO defining it
    (a method may live in a base class, e.g. `compute_loss` in `HFHooksModule`); a section that names nothing
    fails here, naming it, instead of profiling without it."""
    if not isinstance(owner, type):
        return getattr(owner, attr)
    for cls in owner.__mro__:
        if attr in cls.__dict__:
            return cls.__dict__[attr]
    raise AttributeError(f"{owner.__qualname__}.{attr}: no such method in its class or bases (renamed? update "
                         "_targets)")


@contextmanager
def instrumented(probe: SectionProbe, model_class: type, warmup: int) -> Iterator[None]:
    """Wrap the target functions (and reset the probe when the step timer passes `warmup`); undo on exit."""
    # torch wraps `AdamW.step` with its profiling hook on the first optimizer it builds; do it now so that the hooked
    # `AdamW.step` is what we wrap and restore (else the wrapper would stay in the class after this run).
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, what its own __dict__ held: None if inherited)
    for owner, attr, section in _targets(model_class):
        original = _defined(owner, attr)
        saved.append((owner, attr, owner.__dict__.get(attr) if isinstance(owner, type) else original))
        setattr(owner, attr, probe.wrap(original, section))
    original_mark = common.StepTimer.mark

    def mark(self: common.StepTimer) -> None:
        original_mark(self)
        if len(self.times) == warmup:
            probe.reset()

    common.StepTimer.mark = mark  # type: ignore[method-assign]
    try:
        yield
    finally:
        common.StepTimer.mark = original_mark  # type: ignore[method-assign]
        for owner, attr, own in reversed(saved):
            if own is None:  # inherited: drop the wrapper, the base class's method shows through again
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)


def profile_run(runner: str, case: common.Case, steps: int, warmup: int, opts: argparse.Namespace) -> dict[str, float]:
    """One run of `runner`: milliseconds per update for each section, `loop (rest)` and `total`."""
    probe = SectionProbe()
    model_class = type(case.build_model())
    with instrumented(probe, model_class, warmup):
        run = functools.partial(RUNNERS[runner], case, steps, warmup)
        result = run_isolated(run, opts.threads, opts.quiet_wait, opts.max_others)
    timed_steps = steps - warmup
    total_ms = 1e3 / result.steady_ups
    per_step = {name: seconds * 1e3 / timed_steps for name, seconds in probe.exclusive.items()}
    per_step["loop (rest)"] = total_ms - sum(per_step.values())
    per_step["total"] = total_ms
    per_step["others_share"] = result.others_share if result.others_share is not None else float("nan")
    return per_step


def print_table(medians: dict[str, dict[str, float]]) -> None:
    """Sections as rows, runners as columns (ms per update, median over repeats)."""
    runners = list(medians)
    shared = ["data", "forward", "backward", "clip", "adam", "sched", "zero_grad"]
    specific = sorted({s for m in medians.values() for s in m} - set(shared) - {"loop (rest)", "total", "others_share"})
    print(f"\n{'ms per update (median over repeats)':48s}" + "".join(f"{r:>10s}" for r in runners))
    for section in [*shared, *specific, "loop (rest)", "total"]:
        cells = "".join(f"{medians[r].get(section, 0.0):10.3f}" for r in runners)
        print(f"{section:48s}{cells}")
    print(f"{'(CPU share used by other processes)':48s}" + "".join(f"{medians[r]['others_share']:10.0%}" for r in runners))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=list(CASES), default="overhead")
    parser.add_argument("--runners", nargs="+", choices=list(RUNNERS), default=list(RUNNERS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    add_common_flags(parser, default_threads=1)
    args = parser.parse_args(argv)
    if args.lockstep:
        parser.error("--lockstep is not supported here: sections are timed within one process, runs in sequence.")
    if args.heap_malloc:
        use_heap_malloc()
    quiet()
    case = CASES[args.case]
    steps = args.steps or case.default_steps
    warmup = args.warmup if args.warmup is not None else case.default_warmup
    runs: dict[str, list[dict[str, float]]] = {r: [] for r in args.runners}
    for rep in range(args.repeats):
        for runner in rotate(args.runners, rep):
            runs[runner].append(profile_run(runner, case, steps, warmup, args))
            print(f"  [rep {rep + 1}] {runner:4s} {runs[runner][-1]['total']:.3f} ms/update", flush=True)
    sections = {s for rs in runs.values() for r in rs for s in r}
    medians = {r: {s: median([x.get(s, 0.0) for x in rs]) for s in sections} for r, rs in runs.items()}
    print(f"\n## {case.description}: {steps} updates ({warmup} warmup), {args.repeats} repeats, {args.threads} threads")
    print_table(medians)


if __name__ == "__main__":
    main()
