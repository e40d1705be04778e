"""Type checks of every `TrainingArguments` field, derived from the dataclass annotations (pure Python).

Each field's value is compared with its annotation, so a field added to the dataclass is checked without touching
this module. Strings are converted where HF's `HfArgumentParser` would convert them (it parses every command-line
value with the field's type), so a value read from a YAML or JSON string works as it does under HF:
`"1e-3"` -> float, `"3"` -> int, `"true"` / `"no"` / `"1"` -> bool (HF's `string_to_bool`), a JSON object string ->
dict. A `pathlib.Path` given for a string field becomes that path's string. What HF's parser itself produces passes
as it is: a field's `metadata["const"]` (a bare `--flag`) and None for a list field (`nargs="+"` without a default
factory). Anything else of the wrong type is reported, every field at once, with its value and the expected type.

Supported annotation forms: `Any`, `None`, `bool`, `int`, `float`, `str`, other classes (an `isinstance` check),
`Literal[...]` (its values' types; the value itself is checked with HF's message in `validation.py`), unions
(`X | Y`, `Optional`), `list[X]` / `tuple[X, ...]` and `dict[K, V]`. `unsupported_annotations` lists fields whose
annotation is outside these forms (a test keeps that list empty).
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

__all__ = ["check_field_types", "unsupported_annotations"]

_TRUE = ("yes", "true", "t", "y", "1")
_FALSE = ("no", "false", "f", "n", "0")
_NONE_TYPE = type(None)


class _Mismatch(Exception):
    """The value does not fit the annotation."""


def _field_annotations(cls: type) -> dict[str, Any]:
    """`{field: resolved annotation}`; an annotation that cannot be resolved maps to None (not checked)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # one unresolvable name (e.g. imported under TYPE_CHECKING): resolve field by field
        module = vars(__import__(cls.__module__, fromlist=["_"]))
        hints: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            try:
                hints[f.name] = eval(f.type, module) if isinstance(f.type, str) else f.type  # noqa: S307
            except Exception:
                hints[f.name] = None
        return hints


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _describe(annotation: Any) -> str:
    """A readable name of the expected type: `float`, `int or None`, `list of str`, `one of 'no', 'steps'`..."""
    if annotation is Any:
        return "anything"
    if annotation is _NONE_TYPE:
        return "None"
    if _is_union(annotation):
        return " or ".join(_describe(a) for a in get_args(annotation))
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in get_args(annotation))
    if origin in (list, tuple):
        item = get_args(annotation)[0] if get_args(annotation) else Any
        return f"a {origin.__name__} of {getattr(item, '__name__', None) or _describe(item)}"
    if origin is dict:
        return "a dict"
    name = getattr(annotation, "__name__", str(annotation))
    return {"int": "an int", "float": "a float (or an int)", "str": "a str", "bool": "a bool"}.get(name, name)


def _coerce(value: Any, annotation: Any) -> Any:
    """`value` converted to `annotation` as HF's parser would, or raise `_Mismatch`."""
    if annotation is Any or annotation is None:
        return value
    if annotation is _NONE_TYPE:
        if value is None:
            return value
        raise _Mismatch
    if _is_union(annotation):
        members = get_args(annotation)
        for member in sorted(members, key=lambda m: not _fits_exactly(value, m)):  # exact matches first
            try:
                return _coerce(value, member)
            except _Mismatch:
                continue
        raise _Mismatch
    origin = get_origin(annotation)
    if origin is Literal:
        if any(isinstance(value, type(choice)) and not isinstance(value, bool) for choice in get_args(annotation)):
            return value
        raise _Mismatch
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        items = get_args(annotation)
        item = items[0] if items else Any
        return type(value)(_coerce(v, item) for v in value)
    if origin is dict or annotation is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise _Mismatch from None
        if isinstance(value, dict):
            return value
        raise _Mismatch
    return _coerce_scalar(value, annotation)


def _fits_exactly(value: Any, annotation: Any) -> bool:
    if annotation is Any:  # a class from Python 3.11 on, but not one `isinstance` accepts
        return True
    if annotation is _NONE_TYPE:
        return value is None
    if isinstance(annotation, type) and not get_args(annotation):
        if annotation in (int, float) and isinstance(value, bool):
            return False
        return isinstance(value, annotation)
    return False


def _number(value: Any, parse: type, accepted: type) -> Any:
    """An `accepted` number (a plain int / float as it is, a numpy scalar converted) or a string `parse` reads."""
    if isinstance(value, accepted):
        return value if type(value) in (int, float) else parse(value)
    if isinstance(value, str):
        try:
            return parse(value.strip())
        except ValueError:
            raise _Mismatch from None
    raise _Mismatch


def _coerce_scalar(value: Any, annotation: Any) -> Any:
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise _Mismatch
    if isinstance(value, bool):  # True is an int to Python, never a number here
        raise _Mismatch
    if annotation is int:
        return _number(value, int, numbers.Integral)
    if annotation is float:
        return _number(value, float, numbers.Real)
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        raise _Mismatch
    if isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        raise _Mismatch
    return value  # an annotation form we do not check (see `unsupported_annotations`)


def _has_list(annotation: Any) -> bool:
    members = get_args(annotation) if _is_union(annotation) else (annotation,)
    return any(get_origin(m) is list or m is list for m in members)


def _supported(annotation: Any) -> bool:
    if annotation is None:
        return False
    if annotation is Any or annotation is _NONE_TYPE:
        return True
    origin = get_origin(annotation)
    if _is_union(annotation):
        return all(_supported(a) for a in get_args(annotation))
    if origin is Literal:
        return True
    if origin in (list, tuple, dict):
        return all(a is Ellipsis or _supported(a) for a in get_args(annotation))
    return isinstance(annotation, type)


def unsupported_annotations(cls: type) -> dict[str, Any]:
    """`{field: annotation}` of the dataclass fields whose annotation `check_field_types` cannot check."""
    return {name: hint for name, hint in _field_annotations(cls).items() if not _supported(hint)}


def check_field_types(args: Any) -> list[str]:
    """Convert string values as HF's parser would (in place) and return one problem per mistyped field."""
    hints = _field_annotations(type(args))
    issues = []
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        annotation = hints.get(f.name)
        if "const" in f.metadata and value is f.metadata["const"]:
            continue  # what HF's parser gives for a bare `--flag` (e.g. `--fsdp`: True for a `str | None` field)
        if value is None and _has_list(annotation):
            continue  # HF's parser leaves a list field without default_factory at None (`debug`); normalised later
        try:
            converted = _coerce(value, annotation)
        except _Mismatch:
            issues.append(f"`{f.name}`={value!r} ({type(value).__name__}) must be {_describe(annotation)}.")
            continue
        if converted is not value:
            setattr(args, f.name, converted)
    return issues
