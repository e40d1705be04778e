"""HF's `JITCheckpointCallback` in the callback handler when `enable_jit_checkpoint=True`, with hf_lightning's
pre-emption path behind it.

HF's `Trainer` adds a `transformers.trainer_jit_checkpoint.JITCheckpointCallback` whose `CheckpointManager` installs a
SIGTERM handler when the trainer is built. Here the signals are handled by `flow/preemption.py` while `train()` runs
(SIGTERM / SIGUSR1, agreed by every process at the next update boundary, saved through the normal atomic save), so
this subclass keeps HF's class, attributes and manager (code that looks for the callback, or requests a checkpoint
through `jit_manager`, finds HF's objects) but installs no handler of its own: a second handler would race ours.
"""

from __future__ import annotations

from typing import Any

from transformers.trainer_jit_checkpoint import CheckpointManager, JITCheckpointCallback

__all__ = ["LightningJITCheckpointCallback"]


class LightningJITCheckpointCallback(JITCheckpointCallback):
    """HF's `JITCheckpointCallback` (an instance of it) whose signals are hf_lightning's pre-emption path's."""

    def set_trainer(self, trainer: Any) -> None:
        """HF's: keep the trainer and, with `enable_jit_checkpoint`, a `CheckpointManager`; its SIGTERM handler is
        not installed (hf_lightning's pre-emption handles the signal during `train()`). A checkpoint requested through
        `jit_manager.is_checkpoint_requested` is still written at HF's points, through `trainer._save_checkpoint`."""
        self.trainer = trainer
        if trainer.args.enable_jit_checkpoint:
            self.jit_manager = CheckpointManager(trainer=trainer)
