"""The `hf_callbacks:` list of an `hf-lightning` config: `transformers.TrainerCallback`s named by class path.

`trainer.callbacks` is typed by Lightning (its `Callback` class), so HF callbacks get their own list, in
jsonargparse's `class_path` / `init_args` form or as a bare class path::

    hf_callbacks:
      - class_path: transformers.EarlyStoppingCallback
        init_args: {early_stopping_patience: 2}
      - my_package.callbacks.MyTrainerCallback

They are driven by `HFTrainerFlow` with HF's events and `TrainerControl`, as callbacks given to
`hf_lightning.Trainer(callbacks=[...])`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hf_lightning.tasks.code_paths import import_checked, is_callback_class

__all__ = ["build_hf_callbacks"]


def _entry(index: int, entry: Any) -> tuple[str, dict[str, Any]]:
    """`(class_path, init_args)` of one list entry."""
    key = f"hf_callbacks[{index}]"
    if isinstance(entry, str):
        return entry, {}
    if hasattr(entry, "as_dict"):  # a jsonargparse Namespace
        entry = entry.as_dict()
    if isinstance(entry, dict) and isinstance(entry.get("class_path"), str):
        unknown = sorted(set(entry) - {"class_path", "init_args"})
        if unknown:
            raise ValueError(f"{key}: unknown key(s) {unknown}; allowed: class_path, init_args.")
        init_args = entry.get("init_args") or {}
        if not isinstance(init_args, dict):
            raise ValueError(f"{key}.init_args={init_args!r} must be a mapping of keyword arguments.")
        return entry["class_path"], dict(init_args)
    raise ValueError(f"{key}={entry!r} must be a class path or a mapping with `class_path` (and `init_args`).")


def build_hf_callbacks(entries: list[Any] | None, allow_code_from: Sequence[str] = ()) -> list[Any]:
    """Instantiate the `hf_callbacks` entries (a bare name is looked up in `transformers`; another module only when
    `allow_code_from` lists it, see `code_paths.py`).

    Raises:
        ValueError: a malformed entry, a module not allowed, a class that cannot be imported, one that is not a
            `TrainerCallback` subclass, or init arguments it rejects, naming `hf_callbacks[<index>]`.
    """
    if not entries:
        return []
    callbacks = []
    for index, entry in enumerate(entries):
        path, init_args = _entry(index, entry)
        cls = import_checked(path, f"hf_callbacks[{index}].class_path",
                             "a transformers.TrainerCallback subclass (Lightning callbacks go in trainer.callbacks)",
                             is_callback_class, allow_code_from)
        try:
            callbacks.append(cls(**init_args))
        except TypeError as err:
            raise ValueError(f"hf_callbacks[{index}] ({path}): {err}") from None
    return callbacks
