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
- `allow_code_from` cannot list the standard library (`builtins`, `os`, `subprocess`...) nor jsonargparse;
- a model's own code is code too: `trust_remote_code: true` anywhere in the config (`model.from_pretrained_kwargs`)
  makes `from_pretrained` import the Python files of the model folder or hub repository (its `config.json`
  `auto_map`), so it is refused unless that folder or hub id (`model.model_name_or_path`,
  `data.tokenizer_name_or_path`, the `ckpt_path` that validate / predict load) is listed in `allow_code_from`, or the
  config says `allow_remote_code: true`. (The Python API keeps HF's meaning: the user wrote the flag in code.)

Every route by which a config reaches jsonargparse is walked: `--config` / `-c` (an abbreviation such as `--conf` is
refused: the parsers do not accept abbreviations, `allow_abbrev=False`), section files, command-line values, and the
`PL_*` environment variables, which jsonargparse reads when `JSONARGPARSE_DEFAULT_ENV=true` (`PL_FIT__CONFIG`,
`PL_FIT__TRAINER__CALLBACKS`...). A `--config` that is neither a file nor a YAML mapping is named here, in a fraction
of a second; so is a class path of a library package that does not import (a mistyped module in
`--trainer.callbacks+=`).

`enforce_in_parser` also sets jsonargparse's own import-path policy (where the installed version has it) to the same
prefixes, so a path this walk did not foresee is still refused before its import.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jsonargparse
import yaml

__all__ = ["ENV_PREFIX", "LIBRARY_PACKAGES", "ConfigCodeError", "check_code_path", "check_config_code",
           "enforce_in_parser", "model_sources"]

LIBRARY_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric", "torch", "torchmetrics", "transformers",
                    "peft", "hf_lightning")
"""Packages whose classes a config may name without `allow_code_from` (what the CLI builds on)."""

ENV_PREFIX = "PL"
"""LightningCLI's `env_prefix`: with `JSONARGPARSE_DEFAULT_ENV=true` jsonargparse reads `PL_<SUBCOMMAND>__<KEY>`."""
_SUBCOMMANDS = ("fit", "validate", "predict")
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


def _submodules(folder: str) -> list[str]:
    names = []
    for entry in os.listdir(folder):
        stem, suffix = os.path.splitext(entry)
        if suffix == ".py" and stem.isidentifier() and stem != "__init__":
            names.append(stem)
        elif os.path.isfile(os.path.join(folder, entry, "__init__.py")):
            names.append(entry)
    return names


def _module_typo(path: str) -> str | None:
    """"no module 'a.b.x' (did you mean 'a.b.y'?)" when a module part of `path` is missing from its package's files
    and a submodule of a close name exists there (a typo, found without importing anything); else None."""
    parts = path.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for index, part in enumerate(parts[1:-1], start=1):
        if not folders:
            return None
        folder = folders[0]
        if os.path.isfile(os.path.join(folder, f"{part}.py")) or os.path.isdir(os.path.join(folder, part)):
            folders = [os.path.join(folder, part)] if os.path.isdir(os.path.join(folder, part)) else []
            continue
        close = difflib.get_close_matches(part, _submodules(folder), 1, 0.8)
        if not close:
            return None  # an attribute of the package (or a compiled module): the import decides
        return f"no module {'.'.join(parts[:index + 1])!r} (did you mean {'.'.join([*parts[:index], close[0]])!r}?)"
    return None


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
        typo = _module_typo(path)  # a mistyped module is named from the files, before the library is imported
        if typo is not None:
            raise ConfigCodeError(f"{key}={path!r} cannot be imported ({typo}); check the spelling of the class path.")
        try:
            obj = _resolve(path)
        except (ImportError, AttributeError) as err:
            # a mistyped class: one line now, not jsonargparse's multi-part text after the full parser is built
            module, _, name = path.rpartition(".")
            hint = (f"no module {err.name!r}" if isinstance(err, ModuleNotFoundError) and err.name
                    else f"{module!r} has no {name!r}" if isinstance(err, AttributeError) else str(err))
            raise ConfigCodeError(f"{key}={path!r} cannot be imported ({hint}); check the spelling of the class "
                                  "path.") from None
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
        if key and key not in ("c", "config") and "config".startswith(key):
            raise ConfigCodeError(f"{token.partition('=')[0]}: write --config in full (options are not abbreviated: "
                                  "an abbreviation would reach the parser unchecked).")
        if key in ("c", "config"):
            yield _config_document(f"--{key}", text)
        else:
            yield _nest(key, _parse_value(text)), None


def _config_document(where: str, text: str) -> tuple[Any, str | None]:
    """`(document, base folder)` of a `--config` value: a file, or an inline YAML mapping.

    Raises:
        ConfigCodeError: neither a file nor a mapping (a mistyped path), or a file too big to be a config.
    """
    if os.path.isfile(text):
        document = _load_small_yaml(text)
        if document is None and os.path.getsize(text) > _MAX_SUBCONFIG_BYTES:
            raise ConfigCodeError(f"{where} {text!r}: a config over {_MAX_SUBCONFIG_BYTES} bytes is not read.")
        return document, os.path.dirname(os.path.abspath(text))
    document = _parse_value(text)
    if not isinstance(document, dict):
        raise ConfigCodeError(f"{where} {text!r}: no such config file (from {os.getcwd()!r}; a --config value is "
                              "a YAML file or an inline YAML mapping).")
    return document, None


def _env_enabled(environ: Mapping[str, str]) -> bool:
    """Whether jsonargparse reads the environment (LightningCLI's parsers default to not, the variable overrides)."""
    return environ.get("JSONARGPARSE_DEFAULT_ENV", "").strip().lower() in ("true", "1", "yes", "on")


def _env_sources(environ: Mapping[str, str]) -> Iterator[tuple[Any, str | None]]:
    """`(document, base folder)` of every `PL_[<SUBCOMMAND>__]<KEY>` variable jsonargparse would read."""
    if not _env_enabled(environ):
        return
    for name in sorted(environ):
        if not name.startswith(f"{ENV_PREFIX}_"):
            continue
        parts = [part.lower() for part in name[len(ENV_PREFIX) + 1:].split("__") if part]
        if parts and parts[0] in _SUBCOMMANDS:
            parts = parts[1:]
        if not parts:
            continue
        key, text = ".".join(parts), environ[name]
        if key == "config":
            yield _config_document(f"{name}=", text)
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
    problems = [entry for entry in allowed if not isinstance(entry, str) or not (
        _is_module_path(entry) or _is_model_source(entry))]
    if problems:
        raise ConfigCodeError(f"allow_code_from={allowed!r}: each entry is a package or module path (e.g. "
                              f"my_package or my_package.callbacks), or a model folder or hub id whose own code "
                              f"`trust_remote_code` may run; got {problems!r}.")
    refused = [entry for entry in allowed if _is_module_path(entry) and _refused_prefix(entry)]
    if refused:
        raise ConfigCodeError(
            f"allow_code_from={allowed!r}: {refused!r} is the standard library (or jsonargparse), whose functions "
            "run code, read or write files; a config cannot allow it. List your own package."
        )
    return allowed


def _is_module_path(entry: str) -> bool:
    return all(part.isidentifier() for part in entry.split("."))


def _is_model_source(entry: str) -> bool:
    """A local folder or a hub id (`org/name`): what `allow_code_from` may list for `trust_remote_code`."""
    return os.path.isdir(os.path.expanduser(entry)) or (
        entry.count("/") == 1 and all(part and part.replace("-", "_").replace(".", "_").isidentifier()
                                      for part in entry.split("/")))


def _same_source(a: str, b: str) -> bool:
    if a == b:
        return True
    first, second = os.path.expanduser(a), os.path.expanduser(b)
    return os.path.isdir(first) and os.path.isdir(second) and os.path.samefile(first, second)


def _last(documents: list[tuple[Any, str | None]], path: str) -> tuple[Any, bool]:
    """The value the last source sets for the dotted key `path` (and whether any sets it)."""
    value, found = None, False
    for document, _ in documents:
        node = document
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            value, found = node, True
    return value, found


def _trusting(value: Any, key: str) -> Iterator[str]:
    """The key paths where `trust_remote_code` is set true."""
    if isinstance(value, dict):
        for name, item in value.items():
            child = f"{key}.{name}" if key else str(name)
            if name == "trust_remote_code" and item not in (None, False, "false", "False", 0):
                yield child
            else:
                yield from _trusting(item, child)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _trusting(item, f"{key}[{index}]")


def model_sources(documents: list[tuple[Any, str | None]], subcommand: str | None) -> list[tuple[str, str]]:
    """`(key, value)` of every folder or hub id whose files `from_pretrained` reads: `model.model_name_or_path`,
    `data.tokenizer_name_or_path`, and `ckpt_path` for validate / predict (which load it as the model)."""
    keys = ["model.model_name_or_path", "data.tokenizer_name_or_path"]
    if subcommand != "fit":
        keys.append("ckpt_path")
    found = []
    for key in keys:
        value, present = _last(documents, key)
        if present and isinstance(value, str) and value:
            found.append((key, value))
    return found


def _check_remote_code(documents: list[tuple[Any, str | None]], allowed: Sequence[str],
                       subcommand: str | None) -> None:
    """Refuse `trust_remote_code` for a model source the config does not allow (see the module docstring)."""
    trusting = [key for document, _ in documents for key in _trusting(document, "")]
    if not trusting:
        return
    everything, _ = _last(documents, "allow_remote_code")
    if everything is True or str(everything).lower() == "true":
        return
    for key, source in model_sources(documents, subcommand):
        if not any(_same_source(source, entry) for entry in allowed):
            raise ConfigCodeError(
                f"{trusting[-1]}=True with {key}={source!r}: from_pretrained would import and run the Python files "
                f"of that model (its config.json `auto_map`), and a config runs only code it allows; to trust that "
                f"model's code, add it to allow_code_from (`allow_code_from: [{source}]`) or set "
                "`allow_remote_code: true`."
            )


def check_config_code(argv: Sequence[str], subcommand: str | None = None,
                      environ: Mapping[str, str] | None = None) -> list[str]:
    """Refuse any code a config names from a module it does not allow, before anything is imported.

    Args:
        argv: the command line after the subcommand (`--config x.yaml --trainer.callbacks+=...`).
        subcommand: `fit` / `validate` / `predict` (which folders `from_pretrained` reads; None: all of them).
        environ: the environment jsonargparse reads (`JSONARGPARSE_DEFAULT_ENV`, `PL_*`); default `os.environ`.

    Returns:
        The config's `allow_code_from` module prefixes (its model folders and hub ids left out).

    Raises:
        ConfigCodeError: naming the key path, the value and the `allow_code_from` entry that would allow it.
    """
    environ = os.environ if environ is None else environ
    documents = [*_env_sources(environ), *_sources(argv)]  # the environment first: the command line wins
    allowed = _allow_list(documents, argv)
    _check_remote_code(documents, allowed, subcommand)
    checker = _Checker([entry for entry in allowed if _is_module_path(entry)])
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
