"""Classes named in a config file (`model.config_class`, `model.auto_class`, `hf_callbacks`): a config is code.

Importing a module runs it, and calling what a path names runs that too (`model.config_class: torch.hub.load` ran a
local `hubconf.py`). So a name is resolved in two steps:

1. before any import, the module must be `transformers` (a bare name means `transformers.<name>`) or start with one
   of the prefixes the config allows with `allow_code_from` (the user's own package);
2. after the import, the object must be a class of the expected kind (`PretrainedConfig` subclass, a transformers
   Auto class, a `TrainerCallback` subclass) before anything calls it.

Every other name a config gives (`class_path` anywhere, `LambdaCallback` hooks...) is checked before the parser
imports it, by `hf_lightning/cli/config_code.py`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["import_checked", "is_auto_class", "is_callback_class", "is_config_class"]


def _allowed(module: str, allowed: Sequence[str]) -> bool:
    return any(module == prefix or module.startswith(f"{prefix}.") for prefix in ("transformers", *allowed))


def import_checked(path: str, key: str, kind: str, check: Callable[[Any], bool], allowed: Sequence[str] = ()) -> Any:
    """The class `path` names, imported only from an allowed module and checked with `check` before any use.

    Args:
        path: `Name` (looked up in `transformers`) or `package.module.Name`.
        key: the config key, for messages (e.g. `model.config_class`).
        kind: what `check` accepts, for messages (e.g. `a transformers.PretrainedConfig subclass`).
        check: `fn(obj) -> bool`, True when the imported object is acceptable.
        allowed: module prefixes besides `transformers` that may be imported (`allow_code_from`).

    Raises:
        ValueError: a module that is not allowed (nothing imported), a path that cannot be imported, or an object
            that is not `kind`; each naming the key and the value.
    """
    module, _, name = path.rpartition(".")
    module = module or "transformers"
    if not _allowed(module, allowed):
        raise ValueError(
            f"{key}={path!r}: a config only imports classes from transformers unless it allows the module "
            f"(importing or calling code runs it); to use {module.partition('.')[0]!r}, add it to allow_code_from "
            f"(e.g. `allow_code_from: [{module.partition('.')[0]}]`)."
        )
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise ValueError(f"{key}={path!r} cannot be imported (a `transformers` name or a dotted path).") from None
    if not check(obj):
        raise ValueError(f"{key}={path!r} is not {kind} (got {obj!r}).")
    return obj


def is_config_class(obj: Any) -> bool:
    """A `transformers.PretrainedConfig` subclass."""
    from transformers import PretrainedConfig

    return isinstance(obj, type) and issubclass(obj, PretrainedConfig)


def is_auto_class(obj: Any) -> bool:
    """A transformers Auto model class (`AutoModelForCausalLM`...), or a subclass of one."""
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    return isinstance(obj, type) and issubclass(obj, _BaseAutoModelClass)


def is_callback_class(obj: Any) -> bool:
    """A `transformers.TrainerCallback` subclass."""
    from transformers import TrainerCallback

    return isinstance(obj, type) and issubclass(obj, TrainerCallback)
