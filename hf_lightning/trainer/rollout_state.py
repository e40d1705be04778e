"""The rollout buffer of TRL's online trainers (`GRPOTrainer`, `RLOOTrainer`) in every checkpoint, so that a resume
continues exactly where the run stopped.

TRL generates completions once per `steps_per_generation * num_iterations` micro-batches, keeps them in
`trainer._buffered_inputs` (one slice per micro-batch of `steps_per_generation`) and counts micro-batches in
`trainer._step`; which slice a micro-batch trains on, and whether it generates first, are `_step`'s. Neither is in an
HF checkpoint, so TRL on `transformers.Trainer` resumes with `_step = 0` and no buffer: it generates again at the
first update, from the updated policy and another RNG state, and counts its slices from there. A run stopped inside a
buffer's iterations (num_iterations > 1, or an update boundary inside `steps_per_generation`) then trains on other
completions than the uninterrupted run (TRL's comment: "self._buffered_inputs=None can occur when resuming").

`RolloutBufferState` is a Lightning callback whose state goes into the checkpoint's `lightning_state.pt` with the
other callback states: `_step`, the buffer while it still has slices or iterations to serve (with the global step
whose policy generated it: its policy version), TRL's metrics not yet logged and its last generation's completions
table (`_logs`). The RNG states at the update boundary are already in the checkpoint (`rng_state.pth`), so the next
generation draws what the uninterrupted run drew. The facade adds the callback to a trainer that has TRL's buffer
attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import lightning.pytorch as pl

__all__ = ["RolloutBufferState", "RolloutTrainer", "has_rollout_buffer"]

_LOG_COLUMNS = ("prompt", "completion", "advantages")
_LOG_TABLES = ("rewards", "extra")


class _Args(Protocol):
    steps_per_generation: int
    gradient_accumulation_steps: int


class RolloutTrainer(Protocol):
    """What the callback reads and restores on a TRL online trainer (TRL 1.16's attribute names)."""

    _step: int
    _buffered_inputs: list[dict[str, Any]] | None
    num_iterations: int
    args: Any
    _metrics: dict[str, Any]
    _logs: dict[str, Any]


def has_rollout_buffer(trainer: object) -> bool:
    """Whether `trainer` keeps TRL's rollout buffer (`_buffered_inputs`, `_step`, `num_iterations`): TRL sets them
    before calling the base constructor."""
    return all(hasattr(trainer, name) for name in ("_buffered_inputs", "_step", "num_iterations"))


def _generate_every(trainer: RolloutTrainer) -> int:
    return int(trainer.args.steps_per_generation) * int(trainer.num_iterations)


class RolloutBufferState(pl.Callback):
    """Saves and restores a TRL online trainer's rollout position and buffer with each checkpoint (module docstring).

    Args:
        trainer: the TRL trainer (an `hf_lightning.Trainer` subclass) whose buffer this is.
    """

    def __init__(self, trainer: RolloutTrainer) -> None:
        self._owner = trainer

    @property
    def state_key(self) -> str:
        return "RolloutBufferState"

    def state_dict(self) -> dict[str, Any]:
        """The rollout position at this update boundary; the buffer only while it serves later micro-batches."""
        trainer = self._owner
        every = _generate_every(trainer)
        step = int(trainer._step)
        buffer = trainer._buffered_inputs if step % every else None  # at a boundary the next update generates
        generated_at = (step // every) * every // max(int(trainer.args.gradient_accumulation_steps), 1)
        return {
            "step": step, "generate_every": every, "steps_per_generation": int(trainer.args.steps_per_generation),
            "buffer": None if buffer is None else [dict(part) for part in buffer],
            "policy_version": generated_at,
            "metrics": {k: list(v) for k, v in trainer._metrics.get("train", {}).items()},
            "logs": {**{c: list(trainer._logs[c]) for c in _LOG_COLUMNS if c in trainer._logs},
                     **{t: {k: list(v) for k, v in trainer._logs[t].items()} for t in _LOG_TABLES
                        if t in trainer._logs}},
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Put the saved position, buffer, pending metrics and completions table back on the trainer.

        Raises:
            ValueError: the checkpoint's buffer was cut for another `steps_per_generation` / `num_iterations`.
        """
        trainer = self._owner
        every = _generate_every(trainer)
        buffer = state_dict.get("buffer")
        if buffer is not None and (state_dict["generate_every"] != every or
                                   state_dict["steps_per_generation"] != trainer.args.steps_per_generation):
            raise ValueError(
                f"resume_from_checkpoint: the checkpoint's rollout buffer serves steps_per_generation="
                f"{state_dict['steps_per_generation']} x num_iterations="
                f"{state_dict['generate_every'] // state_dict['steps_per_generation']} micro-batches, this run asks "
                f"for steps_per_generation={trainer.args.steps_per_generation} x num_iterations="
                f"{trainer.num_iterations}. Resume with the checkpoint's settings, or from a checkpoint at a "
                "generation boundary.")
        trainer._step = int(state_dict["step"])
        trainer._buffered_inputs = None if buffer is None else [dict(part) for part in buffer]
        train_metrics = trainer._metrics.setdefault("train", {})
        for name, values in state_dict.get("metrics", {}).items():
            train_metrics[name] = list(values)
        logs = state_dict.get("logs", {})
        for column in _LOG_COLUMNS:
            if column in logs and column in trainer._logs:
                trainer._logs[column].clear()
                trainer._logs[column].extend(logs[column])
        for table in _LOG_TABLES:
            for key, values in logs.get(table, {}).items():
                trainer._logs[table][key].clear()
                trainer._logs[table][key].extend(values)
