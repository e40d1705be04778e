"""The memory plan before a run: peak bytes per device of one optimizer update, traced on fake tensors.

The model is copied onto fake tensors (`torch._subclasses.FakeTensorMode`: shapes, dtypes and devices, no storage;
the real weights are not copied), and one update runs on that copy under torch's `MemTracker`, which follows every
tensor storage the forward, backward, clipping and `optimizer.step()` create and free, sorted into weights, buffers,
gradients, optimizer state, activations and temporaries. Nothing real is allocated, so a 1B-parameter model plans in
seconds on a CPU.

The traced update is the first one; the peak of the steady updates after it (optimizer state already present during
the forward and backward, and with gradient accumulation the gradients too) is derived from the same trace: each
moment of the first update's forward / backward, plus the optimizer state it ends with (and, accumulating, the whole
gradients in place of those allocated so far). Under FSDP2 the weights, gradients and optimizer state at every moment
are divided by the world size, and two unsharded blocks of weights plus one block of unsharded gradients are added
(one block computing, the next prefetched; the gradients before their reduce-scatter). DDP keeps its gradient
buckets beside the gradients (`gradient_as_bucket_view=False`, Lightning's default): the trainable parameters' bytes
again.

It relies on `MemTracker`'s internals (its per-kind snapshot, its gradient and optimizer hooks) as torch 2.13 has
them (constraints-cpu.txt pins torch); tests/test_memory_plan.py compares the plan with the profiler's measure.

`largest_micro_batch` reads the largest micro-batch under a budget off two traces (the micro-batch and twice it):
every moment's bytes are a line in the micro-batch.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._subclasses import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

__all__ = [
    "MemoryPlan", "OptimizerFactory", "budget_bytes", "fake_batch", "format_bytes", "largest_micro_batch",
    "memory_plan_line", "plan_memory", "trace_update",
]

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
"""Builds the run's optimizer over a model's parameters (the plan calls it on the fake copy)."""

SHARDINGS = ("none", "ddp", "fsdp2")
PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")


@dataclass(frozen=True)
class UpdateTrace:
    """Bytes alive at every moment of one traced update, by kind.

    Attributes:
        moments: `(in_optimizer_step, weights, gradients, optimizer_state, rest)` after every operation; `rest` is
            buffers, inputs, activations and temporaries.
        trainable_bytes: bytes of the parameters that get gradients.
        largest_block_bytes: the largest direct child block's parameter bytes (FSDP2's unit of all-gather).
        largest_grad_bytes: the largest single gradient (accumulated into an existing one under accumulation).
        optimizer_state_bytes: the optimizer state after the step (the step's temporaries are gone by then).
    """

    moments: list[tuple[bool, int, int, int, int]]
    trainable_bytes: int
    largest_block_bytes: int
    largest_grad_bytes: int
    optimizer_state_bytes: int


@dataclass(frozen=True)
class MemoryPlan:
    """Peak memory per device of one training update (bytes), and the largest micro-batch that fits the budget.

    Attributes:
        micro_batch: samples per device per forward.
        seq_len: the sequence length of every per-token input (the labels' too).
        precision: Lightning's precision string the trace ran under.
        sharding: "none", "ddp" or "fsdp2".
        world_size: processes sharing the update.
        weights: the most bytes of model weights alive at once per device.
        gradients: the most bytes of gradients.
        optimizer_state: the optimizer state once created.
        activations: the most bytes of activations, temporaries, inputs and buffers.
        peak: the most bytes alive at once (at most the sum of the four above: they peak at different moments).
        budget: the bytes available (None: not checked).
        largest_micro_batch: the largest micro-batch whose peak fits `budget` (None: not searched; 0: not even 1).
    """

    micro_batch: int
    seq_len: int
    precision: str
    sharding: str
    world_size: int
    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    peak: int
    budget: int | None = None
    largest_micro_batch: int | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool | None:
        """Whether `peak` fits `budget` (None without a budget)."""
        return None if self.budget is None else self.peak <= self.budget

    def line(self) -> str:
        """One line: the peak and its parts, the budget and the largest micro-batch that fits."""
        where = f"{self.sharding}, {self.world_size} process{'es' if self.world_size > 1 else ''}" \
            if self.sharding != "none" else "one device"
        text = (f"memory plan: peak {format_bytes(self.peak)} per device at micro-batch {self.micro_batch} x "
                f"sequence {self.seq_len} ({where}, precision {self.precision}): weights "
                f"{format_bytes(self.weights)}, gradients {format_bytes(self.gradients)}, optimizer state "
                f"{format_bytes(self.optimizer_state)}, activations {format_bytes(self.activations)}")
        if self.budget is not None:
            text += f"; budget {format_bytes(self.budget)}"
            if self.largest_micro_batch is not None:
                text += f", largest micro-batch that fits: {self.largest_micro_batch}"
        return text

    def warning(self) -> str | None:
        """The warning when the plan does not fit its budget, naming the numbers and what to do; None if it fits."""
        if not self.budget or self.peak <= self.budget:
            return None
        advice = ("a smaller per_device_train_batch_size with more gradient_accumulation_steps (the same global "
                  f"batch; micro-batch {self.largest_micro_batch} fits)" if self.largest_micro_batch
                  else "gradient_checkpointing, a sharded strategy (FSDP2), LoRA or a lower precision")
        return (f"memory plan: this run needs about {format_bytes(self.peak)} per device at micro-batch "
                f"{self.micro_batch} x sequence {self.seq_len}, but only {format_bytes(self.budget)} is free "
                f"(weights {format_bytes(self.weights)}, gradients {format_bytes(self.gradients)}, optimizer state "
                f"{format_bytes(self.optimizer_state)}, activations {format_bytes(self.activations)}); it will "
                f"likely run out of memory. Use {advice}.")


def format_bytes(n: int) -> str:
    """`1536` -> `"1.5 KiB"` (binary units)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop returns


class _TimelineTracker(MemTracker):
    """`MemTracker` that records the bytes by kind after every operation (instead of its per-module peaks, which the
    plan does not need and which cost a copy of the snapshot at every new peak)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.moments: list[tuple[bool, int, int, int, int]] = []

    def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True
                                         ) -> tuple[int, int]:
        # torch's installs a gradient hook on every parameter, which fails on a frozen one (LoRA's base weights)
        sizes = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
        if install_grad_hooks:
            for param in module.parameters():
                if param.requires_grad and self._param_to_grad_hook_handles.get(param, None) is None:
                    self._param_to_grad_hook_handles[param] = (
                        param.register_hook(self._tag_gradient),
                        param.register_post_accumulate_grad_hook(lambda p: self._tag_gradient(p.grad)))
        return sizes

    def _tag_gradient(self, grad: torch.Tensor | None) -> None:
        if grad is not None:
            self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

    def _update_peak_stats(self, peak_state: Any) -> None:
        snap = self._curr_mem_snap.get(self.device)
        if snap is None:
            self.moments.append((self._in_opt, 0, 0, 0, 0))
            return
        weights, grads, opt = snap[_MemRefType.PARAM], snap[_MemRefType.GRAD], snap[_MemRefType.OPT]
        rest = snap["Total"] - weights - grads - opt
        self.moments.append((self._in_opt, weights, grads, opt, rest))


def _fake_copy(model: nn.Module, mode: FakeTensorMode, device: torch.device, dtype: torch.dtype | None
               ) -> nn.Module:
    """A copy of `model` whose parameters and buffers are fake tensors of the same shapes and `requires_grad` on
    `device` (floating ones in `dtype` when given), tied weights still tied; the real tensors are not copied."""

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        with mode:
            converted = mode.from_tensor(tensor.detach()).to(device)
            return converted.to(dtype) if dtype is not None and converted.is_floating_point() else converted

    memo: dict[int, Any] = {}
    for param in model.parameters():
        if id(param) not in memo:
            memo[id(param)] = nn.Parameter(fake(param), requires_grad=param.requires_grad)
    for buffer in model.buffers():
        if id(buffer) not in memo:
            memo[id(buffer)] = fake(buffer)
    return copy.deepcopy(model, memo)


def _block_bytes(model: nn.Module) -> int:
    """The largest parameter bytes of one repeated block (a child of a `ModuleList`: a transformer layer), or of
    the whole model when it has none."""
    largest = 0
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            for block in module:
                largest = max(largest, sum(p.numel() * p.element_size() for p in block.parameters()))
    return largest or sum(p.numel() * p.element_size() for p in model.parameters())


def fake_batch(example: Mapping[str, Any], micro_batch: int, seq_len: int) -> dict[str, Any]:
    """A batch shaped like `example` at `micro_batch` samples, every per-token input (2 or more dims) at `seq_len`
    positions; tensors are zeros (token id 0, label 0), to be created under a fake mode.

    Raises:
        ValueError: `micro_batch` or `seq_len` below 1.
    """
    if micro_batch < 1 or seq_len < 1:
        raise ValueError(f"memory plan: micro_batch={micro_batch} and seq_len={seq_len} must both be at least 1.")
    batch: dict[str, Any] = {}
    for name, value in example.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            shape = (micro_batch, *((seq_len,) if value.dim() >= 2 else ()), *value.shape[2:])
            batch[name] = torch.zeros(shape, dtype=value.dtype, device=value.device)
        else:
            batch[name] = value
    return batch


def _autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "bf16-mixed":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if precision == "16-mixed":
        return torch.autocast(device_type, dtype=torch.float16)
    return contextlib.nullcontext()


_TRUE_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}


def _foreach_as_for_real_parameters(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Torch picks its foreach kernels (whose temporaries span every parameter at once) only for plain tensors on a
    GPU-like device, so not for fake ones: where it would pick them for the real parameters, it is told to here."""
    if device.type not in _get_foreach_kernels_supported_devices():
        return
    for group in optimizer.param_groups:
        if "foreach" in group and group["foreach"] is None and not group.get("fused") \
                and not group.get("differentiable"):
            group["foreach"] = True


def _loss(outputs: Any) -> torch.Tensor:
    """The model's own loss (the HF rule without a `compute_loss` of the user's, which is not traced).

    Raises:
        ValueError: the outputs hold no loss (the batch has no labels the model computes a loss from).
    """
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else \
        outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        keys = sorted(outputs) if isinstance(outputs, Mapping) else type(outputs).__name__
        raise ValueError(f"memory plan: the model returned no loss for the training batch (its outputs: {keys}); "
                         "the plan traces the model's own loss, so the batch needs the labels the model computes it "
                         "from.")
    return loss


def trace_update(model: nn.Module, example: Mapping[str, Any], micro_batch: int, seq_len: int,
                 make_optimizer: OptimizerFactory, precision: str = "32-true", device: torch.device | None = None,
                 max_grad_norm: float = 0.0, prepare: Callable[[nn.Module], None] | None = None) -> UpdateTrace:
    """Trace one update (forward, backward, clipping, `optimizer.step()`, `zero_grad`) of a fake copy of `model`
    on a fake batch; nothing real is allocated.

    Args:
        model: the model (real or fake weights; only shapes, dtypes and `requires_grad` are read).
        example: a micro-batch of the run's collator (its keys, dtypes and number of dims are used).
        micro_batch: samples per forward.
        seq_len: positions of every per-token input.
        make_optimizer: builds the run's optimizer over the copy's parameters.
        precision: Lightning's precision string ("32-true", "bf16-mixed", "16-mixed", "bf16-true"...).
        device: the device the run trains on (default: the model's).
        max_grad_norm: the clipping limit (0: no clipping), as the run's.
        prepare: applied to the fake copy before the trace (gradient checkpointing, as the run enables it).

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"memory plan: precision={precision!r} is not one the plan knows; allowed: "
                         f"{', '.join(PRECISIONS)}.")
    first = next(model.parameters(), None)
    device = torch.device(device) if device is not None else (first.device if first is not None
                                                              else torch.device("cpu"))
    if device.type == "meta":  # a model built on the meta device (no weights at all): planned for the CPU
        device = torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = _fake_copy(model, mode, device, _TRUE_DTYPES.get(precision))
    with mode:
        if prepare is not None:
            prepare(fake)
        fake.train()
        batch = {name: value.to(device) if isinstance(value, torch.Tensor) else value
                 for name, value in fake_batch(example, micro_batch, seq_len).items()}
        optimizer = make_optimizer(fake)
        _foreach_as_for_real_parameters(optimizer, device)
        params = [p for p in fake.parameters() if p.requires_grad]
        tracker = _TimelineTracker(device)
        tracker.track_external(fake, optimizer, *[v for v in batch.values() if isinstance(v, torch.Tensor)])
        with tracker, warnings.catch_warnings():
            # torch's module tracker notes each block whose backward hook finds it gone: nothing the user can act on
            warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)
            with _autocast(precision, device.type):
                loss = _loss(fake(**batch))
            loss.backward()
            del loss
            if max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    trainable = sum(p.numel() * p.element_size() for p in params)
    largest_grad = max((p.numel() * p.element_size() for p in params), default=0)
    states = {id(t.untyped_storage()): t.untyped_storage().nbytes() for state in optimizer.state.values()
              for t in state.values() if isinstance(t, torch.Tensor)}
    return UpdateTrace(tracker.moments, trainable, _block_bytes(fake), largest_grad, sum(states.values()))


@dataclass(frozen=True)
class _Profile:
    """Bytes per device at every moment of the first and steady updates (`totals`), the bytes added at the peak
    whatever the moment (`extra`: FSDP2's gathered blocks, DDP's buckets), and the kinds' maxima."""

    totals: list[float]
    extra: int
    weights: int
    gradients: int
    optimizer_state: int
    activations: int

    @property
    def peak(self) -> int:
        return math.ceil(max(self.totals, default=0.0)) + self.extra


def _profile(trace: UpdateTrace, sharding: str, world_size: int, accumulation: int, precision: str = "32-true"
             ) -> _Profile:
    shard = world_size if sharding == "fsdp2" else 1
    final_opt = trace.optimizer_state_bytes
    full_grads = max((m[2] for m in trace.moments), default=0)
    totals: list[float] = []
    weights = grads = acts = 0
    for in_opt, w, g, o, rest in trace.moments:
        totals.append((w + g + o) / shard + rest)  # the first update
        if not in_opt:  # a steady update's forward / backward: the optimizer state (and accumulated grads) exist
            steady_g, steady_rest = g, rest
            if accumulation > 1:  # the whole gradients; a new one is a temporary before it is added in
                steady_g, steady_rest = full_grads, rest + (trace.largest_grad_bytes if g else 0)
            totals.append((w + steady_g + final_opt) / shard + steady_rest)
        weights, grads, acts = max(weights, w), max(grads, g, full_grads if accumulation > 1 else 0), max(acts, rest)
    extra = 0
    if sharding == "fsdp2" and shard > 1:
        # two unsharded blocks of weights, one block of unsharded gradients; FSDP2's mixed-precision policy gathers
        # and reduces them in the 16-bit dtype
        extra = 3 * trace.largest_block_bytes // (2 if precision in ("bf16-mixed", "16-mixed") else 1)
        weights, grads, final_opt = (math.ceil(x / shard) for x in (weights, grads, final_opt))
    elif sharding == "ddp":
        extra = trace.trainable_bytes  # the gradient buckets beside the gradients
        grads += extra
    return _Profile(totals, extra, weights, grads, final_opt, acts)


def plan_memory(model: nn.Module, example: Mapping[str, Any], micro_batch: int, seq_len: int,
                make_optimizer: OptimizerFactory, *, precision: str = "32-true", sharding: str = "none",
                world_size: int = 1, accumulation: int = 1, device: torch.device | None = None,
                max_grad_norm: float = 0.0, budget: int | None = None, find_largest: bool = True,
                prepare: Callable[[nn.Module], None] | None = None) -> MemoryPlan:
    """The memory plan of one update at `micro_batch` x `seq_len` (see the module docstring for the rules).

    Args:
        model: the model to train (its weights are not copied).
        example: a micro-batch of the run's collator.
        micro_batch: samples per device per forward.
        seq_len: positions of every per-token input.
        make_optimizer: builds the run's optimizer over a model's parameters.
        precision: Lightning's precision string.
        sharding: "none", "ddp" or "fsdp2".
        world_size: processes sharing the update.
        accumulation: micro-batches per update (the gradients stay alive between them).
        device: the device the run trains on (default: the model's).
        max_grad_norm: the clipping limit (0: none).
        budget: bytes available per device (None: no check and no search).
        find_largest: search the largest micro-batch that fits `budget` (one more trace, at twice the micro-batch).
        prepare: applied to the fake copy first (gradient checkpointing).

    Raises:
        ValueError: an unknown sharding or precision, or a micro-batch / sequence length below 1.
    """
    if sharding not in SHARDINGS:
        raise ValueError(f"memory plan: sharding={sharding!r}; allowed: {', '.join(SHARDINGS)}.")

    def profile(size: int) -> _Profile:
        trace = trace_update(model, example, size, seq_len, make_optimizer, precision, device, max_grad_norm,
                             prepare)
        return _profile(trace, sharding, world_size, accumulation, precision)

    at = profile(micro_batch)
    largest = None
    if budget is not None and find_largest:
        largest = largest_micro_batch(at, micro_batch, profile, budget)
    notes = ("FSDP2: sharded state from the single-device trace plus two gathered blocks (estimate)",) \
        if sharding == "fsdp2" else ()
    return MemoryPlan(micro_batch, seq_len, precision, sharding, world_size, at.weights, at.gradients,
                      at.optimizer_state, at.activations, at.peak, budget, largest, notes)


def largest_micro_batch(at: _Profile, micro_batch: int, profile: Callable[[int], _Profile], budget: int,
                        limit: int = 1 << 16) -> int:
    """The largest micro-batch `n <= limit` whose peak fits `budget` (0 when even 1 does not fit).

    Every tensor of a transformer's update is either independent of the micro-batch or proportional to it, so each
    moment's bytes are a line in the micro-batch: two traces (`micro_batch` and twice it) give every moment's line,
    and the largest size under the budget at every moment is read off them. When the two traces do not have the same
    moments (a model whose operations depend on the batch), the sizes are bisected with a trace each.
    """
    other = profile(2 * micro_batch)
    if len(other.totals) == len(at.totals):
        room = budget - at.extra
        largest = limit
        for mine, twice in zip(at.totals, other.totals):
            slope = (twice - mine) / micro_batch
            base = mine - slope * micro_batch
            if base > room:
                return 0
            if slope > 0:
                largest = min(largest, math.floor((room - base) / slope + 1e-9))
        return max(largest, 0)
    sizes = {micro_batch: at.peak, 2 * micro_batch: other.peak}

    def fits(size: int) -> bool:
        if size not in sizes:
            sizes[size] = profile(size).peak
        return sizes[size] <= budget

    low, high = 0, limit + 1  # fits(low) (0 trivially); high: not known to fit
    for size in sorted(sizes):
        if fits(size):
            low = max(low, size)
        else:
            high = min(high, size)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def _available_ram() -> int:
    """Available RAM in bytes (`MemAvailable` on Linux; else the physical memory)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as meminfo:
        for row in meminfo:
            if row.startswith("MemAvailable:"):
                return int(row.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    seen: set[int] = set()
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield tensor


def budget_bytes(device: torch.device, model: nn.Module | None = None) -> int:
    """The device's free memory: CUDA's free memory (`torch.cuda.mem_get_info`), or the available RAM on a CPU,
    plus what `model`'s own tensors already hold on that device (the plan counts them)."""
    device = torch.device(device)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else _available_ram()
    held = sum(t.numel() * t.element_size() for t in _tensors(model) if t.device.type == device.type) \
        if model is not None else 0
    return int(free + held)


def memory_plan_line(plan: MemoryPlan) -> str:
    """The line printed at the start of `train()`: the plan, and the warning when it does not fit."""
    warning = plan.warning()
    return plan.line() if warning is None else f"{plan.line()}\nWARNING: {warning}"
