"""Our throughput in the logs (`include_throughput`): `tokens_per_second` and `mfu` per training entry, and what
the flow calls for all input-token logging.

- `Throughput`: the non-padding input tokens of all processes per second over each logging window (evaluation time
  left out), and `mfu`: the window's model FLOPs (`6 * tokens * non-embedding parameters`, HF's
  `floating_point_ops`, summed over processes) over the window's time and the devices' peak; the totals at the end.
  Tokens are counted with HF's rule (`tokens_seen.count_input_tokens`), the one counting rule of the package.
- `TokenLogs`: HF's `include_num_input_tokens_seen` (`tokens_seen.InputTokensSeen`) and `Throughput`, each a no-op
  unless its argument asks for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from transformers import TrainerState

from hf_lightning.args import TrainingArguments
from hf_lightning.flow.peak_flops import peak_flops, precision_kind
from hf_lightning.flow.tokens_seen import InputTokensSeen, count_input_tokens, main_input_name

__all__ = ["Throughput", "TokenLogs", "device_peak_flops"]

log = logging.getLogger(__name__)


def _window_tokens(window: Sequence[Mapping[str, Any]], main_input: str, pad_token_id: int | None,
                   device: torch.device, on_fallback: Callable[[], None]) -> torch.Tensor | None:
    """The window's non-padding token count on `device` (no host sync), None when no micro-batch has the main
    input."""
    counts = [count_input_tokens(micro, main_input, "non_padding", pad_token_id, on_fallback) for micro in window]
    present = [c for c in counts if c is not None]
    if not present:
        return None
    return sum((torch.as_tensor(c, device=device, dtype=torch.int64) for c in present),
               torch.zeros((), device=device, dtype=torch.int64))


def _sum_over_processes(strategy: Any, value: torch.Tensor) -> int:
    if strategy is not None:
        value = strategy.reduce(value, reduce_op="sum")
    return int(value.item())


class Throughput:
    """Our `tokens_per_second` / `mfu` per training log entry and `train_tokens_per_second` / `train_mfu` at the end.

    Args:
        peak_flops: the peak FLOP/s of one device, or None (no `mfu`).
        world_size: processes (devices) training together.
    """

    def __init__(self, peak_flops: float | None, world_size: int) -> None:
        self.peak_flops = peak_flops
        self.world_size = world_size
        self._tokens: torch.Tensor | None = None
        self._total_tokens = 0
        self._window_start = self._excluded = 0.0
        self._flos_at_window = self._flos_at_start = 0.0
        self._fallback_warned = False

    def start(self, device: torch.device, total_flos: float) -> None:
        """At `train()` start: nothing counted, the first window starts now."""
        self._tokens = torch.zeros((), device=device, dtype=torch.int64)
        self._total_tokens = 0
        self._window_start, self._excluded = time.perf_counter(), 0.0
        self._flos_at_window = self._flos_at_start = total_flos

    def add_window(self, window: Sequence[Mapping[str, Any]], model: nn.Module, pad_token_id: int | None) -> None:
        """Add one update's non-padding input tokens of this process (on device, no host sync)."""
        assert self._tokens is not None
        count = _window_tokens(window, main_input_name(model), pad_token_id,
                               self._tokens.device, self._fallback_warning)
        if count is not None:
            self._tokens += count

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` (an evaluation) out of the current window's time."""
        self._excluded += seconds

    def _fallback_warning(self) -> None:
        # ours, not HF's log: said once per run, not at every update as HF's `include_num_input_tokens_seen` does
        if not self._fallback_warned:
            self._fallback_warned = True
            log.warning("include_throughput: the batches have no attention_mask and there is no pad token, so "
                        "tokens_per_second counts every input token as a non-padding one.")

    def window_metrics(self, strategy: Any, total_flos: float) -> dict[str, float]:
        """`tokens_per_second` (and `mfu`) of the window that ends now; the next one starts.

        `total_flos` is `state.total_flos` just stored (summed over processes): its growth is the window's FLOPs.
        """
        assert self._tokens is not None
        tokens = _sum_over_processes(strategy, self._tokens)
        self._tokens = torch.zeros_like(self._tokens)
        self._total_tokens += tokens
        now = time.perf_counter()
        seconds = max(now - self._window_start - self._excluded, 1e-9)
        self._window_start, self._excluded = now, 0.0
        metrics = {"tokens_per_second": round(tokens / seconds, 3)}
        mfu = self._mfu(total_flos - self._flos_at_window, seconds)
        if mfu is not None:
            metrics["mfu"] = mfu
        self._flos_at_window = total_flos
        return metrics

    def summary(self, strategy: Any, total_flos: float, runtime: float) -> dict[str, float]:
        """`train_tokens_per_second` (and `train_mfu`) of this `train()` call over its `train_runtime`."""
        assert self._tokens is not None
        self._total_tokens += _sum_over_processes(strategy, self._tokens)
        self._tokens = torch.zeros_like(self._tokens)
        runtime = max(runtime, 1e-9)
        metrics = {"train_tokens_per_second": round(self._total_tokens / runtime, 3)}
        mfu = self._mfu(total_flos - self._flos_at_start, runtime)
        if mfu is not None:
            metrics["train_mfu"] = mfu
        return metrics

    def _mfu(self, flos: float, seconds: float) -> float | None:
        if self.peak_flops is None or flos <= 0:
            return None
        return round(flos / (seconds * self.peak_flops * self.world_size), 5)


def device_peak_flops(given: float | None, device: torch.device, precision: str) -> float | None:
    """`given`, else the table's peak for this CUDA device and Lightning precision (`flow/peak_flops.py`), else None."""
    if given is not None:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    tf32 = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    kind = precision_kind(precision, tf32)
    found = peak_flops(name, kind)
    if found is None:
        log.warning("include_throughput: the peak FLOP/s of %r in %s is not in hf_lightning's table, so `mfu` is not "
                    "logged; pass `peak_flops_per_device` to have it.", name, kind)
    return found


class TokenLogs:
    """What `include_num_input_tokens_seen` (HF) and `include_throughput` (ours) add to the flow's log entries; a
    no-op for each one not asked for.

    Args:
        args: the training arguments.
    """

    def __init__(self, args: TrainingArguments) -> None:
        self.args = args
        self.seen = InputTokensSeen(str(args.include_num_input_tokens_seen))  # normalised: all / non_padding / no
        self.throughput: Throughput | None = None

    def start(self, state: TrainerState, device: torch.device, precision: str, world_size: int) -> None:
        """At `train()` start, after a resume restored `state`."""
        self.seen.start(state)
        self.throughput = None
        if self.args.include_throughput:
            peak = device_peak_flops(self.args.peak_flops_per_device, device, precision)
            self.throughput = Throughput(peak, world_size)
            self.throughput.start(device, state.total_flos)

    def add_window(self, state: TrainerState, window: Sequence[Mapping[str, Any]], model: nn.Module,
                   pad_token_id: int | None, strategy: Any, device: torch.device) -> None:
        """After each update, before HF's `on_step_end` (so callbacks see the new `num_input_tokens_seen`)."""
        self.seen.add_window(state, window, model, pad_token_id, strategy, device)
        if self.throughput is not None:
            self.throughput.add_window(window, model, pad_token_id)

    def training_entry(self, logs: dict[str, Any], strategy: Any, total_flos: float) -> None:
        """Our window values into a training-loss entry (after the loss, grad norm and learning rate)."""
        if self.throughput is not None:
            logs.update(self.throughput.window_metrics(strategy, total_flos))

    def annotate(self, logs: dict[str, Any], state: TrainerState, start_time: float | None) -> None:
        """HF's additions to every entry (`Trainer.log`)."""
        self.seen.annotate(logs, state, start_time)

    def exclude(self, seconds: float) -> None:
        """An evaluation took `seconds` of the current logging window."""
        if self.throughput is not None:
            self.throughput.exclude(seconds)

    def summary(self, metrics: dict[str, Any], strategy: Any, total_flos: float) -> None:
        """Our totals into the end-of-training metrics (`train_runtime` already in them)."""
        if self.throughput is not None:
            metrics.update(self.throughput.summary(strategy, total_flos, metrics["train_runtime"]))
