"""`AcceleratorConfig`: what `args.accelerator_config` holds after `__post_init__`, as in HF (pure Python).

HF's `TrainingArguments.__post_init__` turns `accelerator_config` (None, a dict, a JSON file path, or an
`AcceleratorConfig`) into `transformers.trainer_pt_utils.AcceleratorConfig` (TA:1640-1652), and HF's `Trainer` reads
its attributes (`.gradient_accumulation_kwargs`, `.to_dict()`, `.pop(...)`; trainer.py:810-849). This class has the
same fields, defaults and methods without importing torch (the CLI builds arguments before the heavy stack), so
`transformers.Trainer(args=hf_lightning.TrainingArguments(...))` works. Which values hf_lightning honours is
`support.py`'s table (the others are refused by name there).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AcceleratorConfig", "accelerate_state_exists", "apply_accumulation_steps", "as_config_dict",
    "build_accelerator_config", "loader_settings", "provide_state", "set_state_provider",
    "syncs_each_batch", "total_train_batch",
]


@dataclass
class AcceleratorConfig:
    """HF's `AcceleratorConfig` fields and defaults (transformers 5.24, trainer_pt_utils.py:1439-1566)."""

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = True
    non_blocking: bool = False
    gradient_accumulation_kwargs: dict | None = None
    use_configured_state: bool = False

    @classmethod
    def from_json_file(cls, json_file: str) -> AcceleratorConfig:
        """The config a JSON file holds; an unknown key raises HF's `ValueError`."""
        with open(json_file, encoding="utf-8") as f:
            config_dict = json.load(f)
        extra_keys = sorted(key for key in config_dict if key not in cls.__dataclass_fields__)
        if extra_keys:  # HF's words
            raise ValueError(
                f"The config file at {json_file} had unknown keys ({extra_keys}), please try upgrading your "
                "`transformers` version or fix (and potentially remove these keys) from your config file."
            )
        return cls(**config_dict)

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the fields (HF's `to_dict`)."""
        return copy.deepcopy(self.__dict__)

    def pop(self, key: str, default: Any = None) -> Any:
        """HF's `pop`: removes the attribute (HF's `_setup_devices` pops `use_configured_state`)."""
        return self.__dict__.pop(key, default)


def accelerate_state_exists() -> bool:
    """Whether this process holds a configured accelerate `PartialState` (an `Accelerator()`, HF's own
    `TrainingArguments`, or hf_lightning's arguments or `Trainer` while they stand in for HF's: `provide_state`).

    Read without importing accelerate: when nothing imported `accelerate.state`, no state can exist.
    """
    state = sys.modules.get("accelerate.state")
    return state is not None and bool(getattr(getattr(state, "PartialState", None), "_shared_state", None))


_state_provider: Callable[[Any], None] | None = None
"""What configures accelerate's process state for arguments just built (`use_as_transformers_trainer()` sets it:
`trainer/accelerate_state.provide_accelerate_state`), or None."""


def set_state_provider(provider: Callable[[Any], None] | None) -> None:
    """Configure accelerate's state whenever arguments are built (None: never), as HF's arguments do."""
    global _state_provider
    _state_provider = provider


def provide_state(args: Any) -> None:
    """While hf_lightning stands in for `transformers` (`use_as_transformers_trainer()`), arguments configure
    accelerate's process state when they are built, as HF's `TrainingArguments` do (its `_setup_devices`): library
    code reads it from there on (sentence-transformers builds further arguments with `use_configured_state=True`)."""
    if _state_provider is not None:
        _state_provider(args)


def as_config_dict(value: Any) -> Any:
    """A config object (ours, or `transformers`' `AcceleratorConfig`) as its dict; anything else unchanged.

    The field's annotation is HF's `dict | str | None`: the type check runs on this form, so a copy of the arguments
    (`dataclasses.replace`, a field-by-field rebuild) whose value is already a config object passes it again.
    """
    if value is None or isinstance(value, (dict, str, type)):
        return value
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and hasattr(value, "split_batches"):
        return dict(to_dict())
    return value


def build_accelerator_config(value: Any, issues: list[str]) -> AcceleratorConfig | None:
    """HF's normalisation (TA:1640-1652) of a dict / None / JSON file path; appends a problem (HF's words where HF
    has one) and returns None when the value cannot become a config."""
    if value is None:
        return AcceleratorConfig()
    if isinstance(value, dict):
        unknown = sorted(key for key in value if key not in AcceleratorConfig.__dataclass_fields__)
        if unknown:
            names = ", ".join(f.name for f in dataclasses.fields(AcceleratorConfig))
            issues.append(f"`accelerator_config` has unknown keys {unknown}; allowed: {names}.")
            return None
        return AcceleratorConfig(**value)
    if isinstance(value, str):
        try:
            return AcceleratorConfig.from_json_file(value)
        except (OSError, ValueError, TypeError) as error:
            issues.append(f"`accelerator_config`={value!r}: {error}")
            return None
    issues.append(f"`accelerator_config`={value!r} must be a dict, a JSON file path or an `AcceleratorConfig`.")
    return None


def apply_accumulation_steps(args: Any) -> None:
    """HF's `Trainer` rule for `gradient_accumulation_kwargs["num_steps"]` (T:810-823), at the trainer's
    construction as there: it becomes `args.gradient_accumulation_steps` when that is 1.

    Raises:
        ValueError: `num_steps` with `gradient_accumulation_steps` > 1 (HF's words).
    """
    config = args.accelerator_config
    kwargs = getattr(config, "gradient_accumulation_kwargs", None) or {}
    if "num_steps" not in kwargs:
        return
    if args.gradient_accumulation_steps > 1:
        raise ValueError(
            "The `AcceleratorConfig`'s `num_steps` is set but `gradient_accumulation_steps` is greater than 1 in the "
            "passed `TrainingArguments`If using the passed `AcceleratorConfig` is desired, do not set the "
            "`TrainingArguments` `gradient_accumulation_steps`."
        )
    args.gradient_accumulation_steps = kwargs["num_steps"]


def syncs_each_batch(args: Any) -> bool:
    """`gradient_accumulation_kwargs["sync_each_batch"]`: gradients are synced on every micro-batch of an update
    (HF's loop then enters no `no_sync`, T:1904-1909), not only on its last."""
    kwargs = getattr(getattr(args, "accelerator_config", None), "gradient_accumulation_kwargs", None) or {}
    return bool(kwargs.get("sync_each_batch", False))


@dataclass(frozen=True)
class LoaderSettings:
    """The `accelerator_config` fields that shape the loaders (accelerate's `DataLoaderConfiguration`)."""

    split_batches: bool = False
    even_batches: bool = True
    use_seedable_sampler: bool = True
    dispatch_batches: bool | None = None


def loader_settings(args: Any) -> LoaderSettings:
    """The loader fields of `args.accelerator_config` (accelerate's defaults when it holds none)."""
    config = getattr(args, "accelerator_config", None)
    if config is None:
        return LoaderSettings()
    return LoaderSettings(bool(getattr(config, "split_batches", False)),
                          bool(getattr(config, "even_batches", True)),
                          bool(getattr(config, "use_seedable_sampler", True)),
                          getattr(config, "dispatch_batches", None))


def total_train_batch(args: Any, world_size: int) -> int:
    """The samples of one update over all processes: `per_device_train_batch_size x gradient_accumulation_steps x
    processes`, or without the processes under `split_batches=True`, where the per-device size is already that of
    all processes together (HF's header and speed metrics multiply by the processes either way)."""
    processes = 1 if loader_settings(args).split_batches else world_size
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * processes
