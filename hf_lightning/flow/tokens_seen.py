"""Input tokens trained on: HF's `include_num_input_tokens_seen`.

- `count_input_tokens` is HF's `Trainer._track_num_input_tokens` rule for one micro-batch (T:2717-2748): `all` counts
  every element of the model's main input (`model.main_input_name`, default `input_ids`), `non_padding` the ones of
  `attention_mask` (else the positions that are not the tokenizer's pad token, else all of them, with HF's warning).
- `InputTokensSeen` keeps `state.num_input_tokens_seen` as HF does: summed over processes after every update, in every
  log entry, and in training-loss entries with this `train()` call's `train_runtime` / `train_tokens_per_second`
  (`Trainer.log`, T:4203-4207). The count lives in `TrainerState`, so `trainer_state.json` (checkpoints, resume)
  keeps it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from transformers import TrainerState
from transformers.trainer_utils import speed_metrics

__all__ = ["InputTokensSeen", "count_input_tokens", "main_input_name"]

log = logging.getLogger(__name__)


def main_input_name(model: object) -> str:
    """The batch key of the model's main input: a transformers model's `main_input_name`, else `input_ids` (HF's
    default for a model without one)."""
    return str(getattr(model, "main_input_name", "input_ids"))


def count_input_tokens(batch: Any, main_input: str, mode: str, pad_token_id: int | None,
                       on_fallback: Callable[[], None] | None = None) -> torch.Tensor | int | None:
    """The input tokens of one micro-batch under `mode` (`all` / `non_padding`), None if `main_input` is absent (or
    the micro-batch is not a mapping of named inputs).

    When `non_padding` cannot tell padding apart, every token is counted, with HF's warning (HF logs it for every
    micro-batch, so do we), or `on_fallback` instead (`include_throughput` says it once, `throughput.py`)."""
    ids = batch.get(main_input) if isinstance(batch, Mapping) else None
    if ids is None or not hasattr(ids, "numel"):
        return None
    if mode == "non_padding":
        mask = batch.get("attention_mask")
        if mask is not None:
            return mask.sum()
        if pad_token_id is not None:
            return (ids != pad_token_id).sum()
        if on_fallback is not None:
            on_fallback()
        else:
            log.warning("Could not determine method to count non-padding tokens, falling back to counting all "
                        "tokens.")
    return int(ids.numel())


class InputTokensSeen:
    """HF's `include_num_input_tokens_seen` bookkeeping for one flow; a no-op when the argument is `no`.

    Args:
        mode: the normalised argument: `all`, `non_padding` or `no` (`TrainingArguments` turns True / False into
            `all` / `no`, as HF's `__post_init__`).
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.initial = 0
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self.mode != "no"

    def start(self, state: TrainerState) -> None:
        """At `train()` start, after a resume restored the state: this call's tokens/s counts from here (T:1642)."""
        self.initial = state.num_input_tokens_seen

    def add_window(self, state: TrainerState, window: Sequence[Any], model: nn.Module, pad_token_id: int | None,
                   strategy: Any, device: torch.device) -> None:
        """Add one update's input tokens of every process to `state.num_input_tokens_seen`.

        HF gathers after every micro-batch; the sum over the update's micro-batches and processes is the same, and
        takes one reduction per update instead of one per micro-batch.
        """
        if not self.enabled:
            return
        main_input = main_input_name(model)
        counts = [count_input_tokens(micro, main_input, self.mode, pad_token_id) for micro in window]
        present = [c for c in counts if c is not None]
        if len(present) < len(counts) and not self._warned:
            # HF says this at every micro-batch; once per flow is enough to be told
            self._warned = True
            log.warning("Tried to track the number of tokens seen, however the current model is not configured "
                        "properly to know what item is the input. To fix this, add a `main_input_name` attribute to "
                        "the model class you are using.")
        # every process reduces, also one whose window lacks the main input: the collective must match on all ranks
        total = torch.zeros((), device=device, dtype=torch.int64)
        for count in present:
            total += torch.as_tensor(count, device=device, dtype=torch.int64)
        if strategy is not None:
            total = strategy.reduce(total, reduce_op="sum")
        state.num_input_tokens_seen += int(total.item())

    def annotate(self, logs: dict[str, Any], state: TrainerState, start_time: float | None) -> None:
        """HF `Trainer.log`: the count in every entry; with `start_time` (the training-loss entry) also this
        `train()` call's `train_runtime` and `train_tokens_per_second`."""
        if not self.enabled:
            return
        logs["num_input_tokens_seen"] = state.num_input_tokens_seen
        if start_time is not None:
            logs.update(speed_metrics("train", start_time, num_tokens=state.num_input_tokens_seen - self.initial))
