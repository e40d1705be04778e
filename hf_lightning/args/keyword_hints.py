"""`TrainingArguments(output_dri=...)`: the dataclass's `TypeError` with "did you mean `output_dir`?" added.

transformers answers a mistyped keyword with Python's bare "got an unexpected keyword argument 'output_dri'"; the
`hf-lightning` CLI names the closest field. `with_keyword_hints` gives the argument classes the CLI's hint, keeping
the original text first (code matching on it still works).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["unknown_keyword_hint", "with_keyword_hints"]

C = TypeVar("C", bound=type)


def unknown_keyword_hint(names: list[str], known: set[str]) -> str:
    """"Did you mean" text for the `names` that are not `known` fields (empty when every name is known)."""
    hints = []
    for name in names:
        if name in known:
            continue
        match = difflib.get_close_matches(name, sorted(known), n=1)
        hints.append(f"{name!r} (did you mean {match[0]!r}?)" if match else f"{name!r} (no field of that name)")
    return f"Unknown argument(s): {', '.join(hints)}." if hints else ""


def with_keyword_hints(cls: C) -> C:
    """Wrap the dataclass `cls`'s generated `__init__` so that an unknown keyword's `TypeError` names the closest
    field (see the module docstring). Apply it after `@dataclass`."""
    generated: Callable[..., None] = cls.__init__  # type: ignore[misc]  # the dataclass's own
    known = {f.name for f in dataclasses.fields(cls) if f.init}

    @functools.wraps(generated)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            generated(self, *args, **kwargs)
        except TypeError as err:
            hint = unknown_keyword_hint(list(kwargs), known) if "unexpected keyword argument" in str(err) else ""
            if not hint:
                raise
            raise TypeError(f"{err}. {hint}") from None

    cls.__init__ = __init__  # type: ignore[misc]
    return cls
