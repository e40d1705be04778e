"""`SignalAtStep`: an HF callback that sends a signal to its own process when an update begins, and `SignalAtInit`,
when the trainer is built (the CLI: after loading and checking the data, before tokenising); named in a CLI config's
`hf_callbacks` by tests/test_preemption.py (with `allow_code_from: [signal_callback]`)."""

import os
import signal

from transformers import TrainerCallback


class SignalAtStep(TrainerCallback):
    """Send `signal` (a name: SIGTERM, SIGINT...) to this process when the update after `step` begins."""

    def __init__(self, step: int, signal: str = "SIGTERM") -> None:
        self.step = step
        self.signal = signal
        self.sent = False

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), getattr(signal, self.signal))


class SignalAtInit(TrainerCallback):
    """Send `signal` to this process at `on_init_end` (the run is being built)."""

    def __init__(self, signal: str = "SIGTERM") -> None:
        self.signal = signal

    def on_init_end(self, args, state, control, **kwargs):
        os.kill(os.getpid(), getattr(signal, self.signal))
