"""Code named in a CLI config: checked against the allowed packages before anything is imported.

jsonargparse imports the module of every `class_path` it meets (in any section, at any depth, even inside a
`dict[str, Any]` such as `model.config_kwargs`), and every dotted string given where a class or a callable is
expected (`trainer.callbacks: [pkg.Cls]`, `LambdaCallback`'s hooks): importing a module runs it, and a callable named
in a config is called with the trainer. So before the parser sees anything, `check_config_code` walks the raw
YAML of every `--config` file (and the section files, `--trainer trainer.yaml`) and every command-line value, and
refuses with one error naming the key, the value and how to allow it:

- every `class_path` anywhere, and every dotted string in a code position (the `trainer` section, `init_args`, the
  keys beside a `class_path`) whose top-level module can be found, must come from `LIBRARY_PACKAGES` or from a
  prefix the config lists in `allow_code_from`;
- from the library packages a config names classes (and plain values such as `torch.float16`), never functions or
  other callables: `torch.save` in a `LambdaCallback` hook would be called with the trainer. Functions come only from
  a prefix in `allow_code_from` (your package, or e.g. `torch.nn.functional` if you mean it);
- `allow_code_from` cannot list the standard library (`builtins`, `os`, `subprocess`...) nor jsonargparse.

`enforce_in_parser` also sets jsonargparse's own import-path policy (where the installed version has it) to the same
prefixes, so a path this walk did not foresee is still refused before its import.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import jsonargparse
import yaml

__all__ = ["LIBRARY_PACKAGES", "ConfigCodeError", "check_code_path", "check_config_code", "enforce_in_parser"]

LIBRARY_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric", "torch", "torchmetrics", "transformers",
                    "peft", "hf_lightning")
"""Packages whose classes a config may name without `allow_code_from` (what the CLI builds on)."""

_SECTION_FILES = ("trainer", "args", "model", "data")  # a section's value may be the path of a YAML file
_MAX_SUBCONFIG_BYTES = 1 << 20  # a sub-config is a small YAML file; a bigger one is data, not read here


class ConfigCodeError(ValueError):
    """A config names code from a module it does not allow."""


def _is_import_path(value: str) -> bool:
    parts = value.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def _under(path: str, prefixes: Sequence[str]) -> bool:
    return any(path == prefix or path.startswith(f"{prefix}.") for prefix in prefixes)


def _refused_prefix(path: str) -> bool:
    """The standard library and jsonargparse (whose settings decide what a value may import) are never allowed."""
    top = path.partition(".")[0]
    return top in sys.stdlib_module_names or top in ("jsonargparse", "__main__")


def _findable(top: str) -> bool:
    """Whether `import top` would find something (a top-level spec lookup runs no module code)."""
    if top in sys.modules:
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _resolve(path: str) -> Any:
    """The object `path` names in a library package, importing as jsonargparse does (module, then attribute)."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError:
        parent, _, attribute = module.rpartition(".")
        return getattr(getattr(importlib.import_module(parent), attribute), name)


class _Checker:
    def __init__(self, allowed: Sequence[str]) -> None:
        self.allowed = list(allowed)
        self.read: set[str] = set()  # sub-config files already walked (a file naming itself is read once)

    def _advice(self, top: str) -> str:
        if _refused_prefix(top):
            return ("the standard library cannot be allowed (its functions run commands, read and write files); "
                    "name code of your own package and list that package in allow_code_from")
        return (f"to use it, add {top!r} to allow_code_from (e.g. `allow_code_from: [{top}]` in the config or "
                f"`--allow_code_from '[{top}]'`)")

    def check(self, key: str, path: str) -> None:
        if not _is_import_path(path):
            return  # a bare name (looked up among classes already imported) or no import path: nothing imported
        top = path.partition(".")[0]
        if _under(path, self.allowed):
            return
        if not _under(path, LIBRARY_PACKAGES):
            raise ConfigCodeError(
                f"{key}={path!r}: a config only imports code from {', '.join(LIBRARY_PACKAGES)} and the packages "
                f"it lists in allow_code_from (importing a module runs it, and a callable in a config is called); "
                f"{self._advice(top)}."
            )
        try:
            obj = _resolve(path)
        except (ImportError, AttributeError):
            return  # not importable: jsonargparse reports it (a library module imported nothing foreign here)
        if callable(obj) and not inspect.isclass(obj):
            raise ConfigCodeError(
                f"{key}={path!r} is a function (or another callable that is not a class): a config names classes "
                f"from {top}, and functions only from the packages it lists in allow_code_from (a callable in a "
                f"config is called with what the caller passes, e.g. the trainer); to call it anyway, add "
                f"{path.rpartition('.')[0]!r} to allow_code_from."
            )

    def walk(self, value: Any, key: str, code: bool, base: str | None) -> None:
        if isinstance(value, dict):
            class_path = value.get("class_path")
            if isinstance(class_path, str):
                self.check(f"{key}.class_path" if key else "class_path", class_path)
            for name, item in value.items():
                child = f"{key}.{name}" if key else str(name)
                inner = code or isinstance(class_path, str) or name in ("init_args", "dict_kwargs")
                if name == "class_path":
                    continue
                if not key and name in _SECTION_FILES and name != "trainer" and isinstance(item, str):
                    self._subconfig(item, child, code=False, base=base)
                self.walk(item, child, inner or (not key and name == "trainer"), base)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                self.walk(item, f"{key}[{index}]", code, base)
        elif isinstance(value, str) and code:
            if _is_import_path(value) and _findable(value.partition(".")[0]):
                self.check(key, value)
            self._subconfig(value, key, code=True, base=base)

    def _subconfig(self, value: str, key: str, code: bool, base: str | None) -> None:
        """A string naming a YAML file where jsonargparse reads one (a section or a class-typed value)."""
        for folder in dict.fromkeys([base, os.getcwd()]):
            path = os.path.abspath(os.path.join(folder, value) if folder and not os.path.isabs(value) else value)
            if path in self.read:
                continue
            self.read.add(path)
            document = _load_small_yaml(path)
            if isinstance(document, (dict, list)):
                self.walk(document, key, code, os.path.dirname(os.path.abspath(path)))


def _load_small_yaml(path: str) -> Any:
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > _MAX_SUBCONFIG_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _nest(key: str, value: Any) -> dict[str, Any]:
    """`{"a": {"b": value}}` for the command-line key `a.b`."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def _sources(argv: Sequence[str]) -> Iterator[tuple[Any, str | None]]:
    """`(document, base folder)` of every `--config` and every `--key value` of the command line, in order."""
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("-") or token in ("-h", "--help") or token.startswith("--print_config"):
            continue
        key, has_value, text = token.lstrip("-").partition("=")
        if not has_value:
            if i >= len(argv) or argv[i].startswith("--"):
                continue
            text, i = argv[i], i + 1
        key = key.rstrip("+")  # `--trainer.callbacks+=...` appends
        if key in ("c", "config"):
            document = _load_small_yaml(text) if os.path.isfile(text) else _parse_value(text)
            base = os.path.dirname(os.path.abspath(text)) if os.path.isfile(text) else None
            if os.path.isfile(text) and document is None and os.path.getsize(text) > _MAX_SUBCONFIG_BYTES:
                raise ConfigCodeError(f"--config {text!r}: a config over {_MAX_SUBCONFIG_BYTES} bytes is not read.")
            yield document, base
        else:
            yield _nest(key, _parse_value(text)), None


def _allow_list(documents: list[tuple[Any, str | None]], argv: Sequence[str]) -> list[str]:
    """`allow_code_from` as the parser will see it: the last source that sets it wins (`+=` appends)."""
    allowed: list[str] = []
    for document, _ in documents:
        if isinstance(document, dict) and "allow_code_from" in document:
            value = document["allow_code_from"]
            allowed = [] if value is None else list(value) if isinstance(value, list) else [value]
    for token in argv:
        if token.startswith("--allow_code_from+="):
            allowed.append(str(_parse_value(token.split("=", 1)[1])))
    problems = [entry for entry in allowed if not isinstance(entry, str) or not all(
        part.isidentifier() for part in entry.split("."))]
    if problems:
        raise ConfigCodeError(f"allow_code_from={allowed!r}: each entry is a package or module path (e.g. "
                              f"my_package or my_package.callbacks); got {problems!r}.")
    refused = [entry for entry in allowed if _refused_prefix(entry)]
    if refused:
        raise ConfigCodeError(
            f"allow_code_from={allowed!r}: {refused!r} is the standard library (or jsonargparse), whose functions "
            "run code, read or write files; a config cannot allow it. List your own package."
        )
    return allowed


def check_config_code(argv: Sequence[str]) -> list[str]:
    """Refuse any code a config names from a module it does not allow, before anything is imported.

    Args:
        argv: the command line after the subcommand (`--config x.yaml --trainer.callbacks+=...`).

    Returns:
        The config's `allow_code_from` prefixes.

    Raises:
        ConfigCodeError: naming the key path, the value and the `allow_code_from` entry that would allow it.
    """
    documents = list(_sources(argv))
    checker = _Checker(_allow_list(documents, argv))
    for document, base in documents:
        checker.walk(document, "", code=False, base=base)
    return checker.allowed


def check_code_path(key: str, path: str, allowed: Sequence[str]) -> None:
    """Refuse one class path a config names outside the code walk (a library-trainer config's `trainer_class`,
    `args_class`) by the same rules: from `LIBRARY_PACKAGES` or a prefix in `allowed`, and a class.

    Raises:
        ConfigCodeError: naming `key`, the value and the `allow_code_from` entry that would allow it.
    """
    _Checker(_allow_list([({"allow_code_from": list(allowed)}, None)], [])).check(key, path)


def enforce_in_parser(allowed: Sequence[str]) -> None:
    """Set jsonargparse's import-path policy (where the installed version has one) to `LIBRARY_PACKAGES` plus
    `allowed`: every import of a parsed value that `check_config_code` did not foresee is refused before it runs.

    The policy is process-wide in jsonargparse; the `hf-lightning` process parses one config.
    """
    if "import_path_allowlist" in inspect.signature(jsonargparse.set_parsing_settings).parameters:
        jsonargparse.set_parsing_settings(import_path_denylist=["*"],
                                          import_path_allowlist=[*LIBRARY_PACKAGES, *allowed])
