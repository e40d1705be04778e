"""Dispatch of `transformers.TrainerCallback` events, with the HF handler's flag resets (CB:429-560).

`HFCallbackHandler.call` runs each HF callback in list order with `(args, state, control, model=, processing_class=,
optimizer=, lr_scheduler=, train_dataloader=, eval_dataloader=, **extra)`; a non-None return replaces `control` for
the callbacks after it. Flags are reset before the callbacks run, exactly where HF resets them.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

__all__ = ["HFCallbackHandler", "HF_EVENTS"]

_logger = logging.getLogger("transformers.trainer_callback")
"""HF's callback-handler logger (transformers' loggers are the standard library's, by name): its warnings reach a
`transformers` user's logging settings as HF's do."""

HF_EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",  # never called: hf_lightning does not push to the Hub (`push_to_hub` is refused)
)

# Which control flags HF's CallbackHandler clears before calling the callbacks of an event (CB:490-535).
_RESETS: dict[str, tuple[str, ...]] = {
    "on_train_begin": ("should_training_stop",),
    "on_epoch_begin": ("should_epoch_stop",),
    "on_step_begin": ("should_log", "should_evaluate", "should_save"),
    "on_log": ("should_log",),
    "on_evaluate": ("should_evaluate",),
    "on_save": ("should_save",),
}


_POSITIONAL = {"on_evaluate": ("metrics",), "on_predict": ("metrics",), "on_log": ("logs",)}
"""The event value HF's `CallbackHandler` methods take after `(args, state, control)`."""


class HFCallbackHandler:
    """Holds the user's `TrainerCallback`s and the objects HF passes to them as keyword arguments.

    Args:
        callbacks: `TrainerCallback` instances or classes (classes are instantiated, as HF's `add_callback`).
    """

    def __init__(self, callbacks: list[Any] | None = None) -> None:
        self.callbacks: list[Any] = []
        for callback in callbacks or []:
            self.add_callback(callback)
        self.model: Any = None
        self.processing_class: Any = None
        self.optimizer: Any = None
        self.lr_scheduler: Any = None
        self.train_dataloader: Any = None
        self.eval_dataloader: Any = None

    def add_callback(self, callback: Any) -> None:
        """Append a callback (an instance or a class); a second one of the same class is allowed, with HF's
        warning."""
        instance = callback() if isinstance(callback, type) else callback
        cls = callback if isinstance(callback, type) else type(callback)
        if cls in [type(existing) for existing in self.callbacks]:
            _logger.warning(  # HF's words, run-ons included
                f"You are adding a {cls} to the callbacks of this Trainer, but there is already one. The current"
                + "list of callbacks is\n:" + self.callback_list
            )
        self.callbacks.append(instance)

    def pop_callback(self, callback: Any) -> Any:
        """Remove and return the first callback of that class (or the first one equal to that instance, HF's `==`);
        None if there is none, as HF."""
        for existing in self.callbacks:
            if isinstance(existing, callback) if isinstance(callback, type) else existing == callback:
                self.callbacks.remove(existing)
                return existing
        return None

    def remove_callback(self, callback: Any) -> None:
        """Remove the first callback of that class (nothing if there is none), or that instance, as HF's
        `CallbackHandler.remove_callback`.

        Raises:
            ValueError: `callback` is an instance the handler does not hold (HF's `list.remove` error,
                `list.remove(x): x not in list`).
        """
        if isinstance(callback, type):
            self.pop_callback(callback)
        else:
            self.callbacks.remove(callback)

    @property
    def callback_list(self) -> str:
        """The callbacks' class names, one per line (HF's `CallbackHandler.callback_list`)."""
        return "\n".join(type(cb).__name__ for cb in self.callbacks)

    def call(self, event: str, args: Any, state: Any, control: Any, **extra: Any) -> Any:
        """Reset HF's flags for `event`, then run every callback's method; returns the (possibly replaced) control."""
        for flag in _RESETS.get(event, ()):
            setattr(control, flag, False)
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is None:
                continue
            result = method(
                args,
                state,
                control,
                model=self.model,
                processing_class=self.processing_class,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                train_dataloader=self.train_dataloader,
                eval_dataloader=self.eval_dataloader,
                **extra,
            )
            if result is not None:
                control = result
        return control

    def _call_positional(self, event: str, args: Any, state: Any, control: Any, *values: Any, **extra: Any) -> Any:
        """HF's handler methods also take their one event value positionally (`on_evaluate(args, state, control,
        metrics)`, `on_log(..., logs)`), as HF's examples call them."""
        names = _POSITIONAL.get(event, ())
        if len(values) > len(names):
            raise TypeError(f"callback_handler.{event} takes {3 + len(names)} positional arguments "
                            f"(args, state, control{''.join(', ' + n for n in names)}), got {3 + len(values)}.")
        extra.update(zip(names, values))
        return self.call(event, args, state, control, **extra)

    def __getattr__(self, name: str) -> Any:
        """`handler.on_log(args, state, control, logs=...)` etc., as on HF's `CallbackHandler`."""
        if name in HF_EVENTS:
            return partial(self._call_positional, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
