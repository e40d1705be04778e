"""Checks of the `task`, `args`, `model` and `data` config sections before Lightning is imported.

A typo in them is answered with one `error:` line in a fraction of a second (same words as the full parser).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

__all__ = ["precheck", "fail"]

_SECTIONS = ("args", "model", "data", "trainer")


def fail(message: object, prog: str = "hf-lightning") -> NoReturn:
    """One parser-style line on stderr and exit status 2 (argparse's convention)."""
    sys.stderr.write(f"{prog}: error: {' '.join(str(message).split())}\n")
    sys.exit(2)


def _config_sections(argv: list[str]) -> dict[str, Any] | None:
    """The YAML of `--config` merged with simple `--<section>.<key> value` overrides, or None when there is none."""
    import yaml

    paths = []
    for i, token in enumerate(argv):
        if token in ("-c", "--config") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif token.startswith("--config="):
            paths.append(token.split("=", 1)[1])
    if not paths or not all(os.path.isfile(path) for path in paths):
        return None
    config: dict[str, Any] = {}
    for path in paths:  # later files win, section by section (as the full parser merges them)
        with open(path) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            return None
        for key, value in loaded.items():
            merged = isinstance(value, dict) and isinstance(config.get(key), dict)
            config[key] = {**config[key], **value} if merged else value
    for i, token in enumerate(argv):
        if not token.startswith("--") or "." not in token:
            continue
        key, has_value, value = token[2:].partition("=")
        if not has_value:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                continue
            value = argv[i + 1]
        section, _, name = key.partition(".")
        if section in _SECTIONS and "." not in name:
            config.setdefault(section, {})
            if isinstance(config[section], dict):
                parsed = yaml.safe_load(value)
                # YAML 1.1 reads `no` / `off` / `yes` / `on` as booleans; on the command line they are words
                # (`--args.eval_strategy no`), as the full parser reads them
                keep_word = isinstance(parsed, bool) and value.strip().lower() not in ("true", "false")
                config[section][name] = value if keep_word else parsed
    return config


def _check_types(section: str, cls: type, values: dict[str, Any]) -> None:
    """The type check of one section by jsonargparse (the same check and words as the full parser, no Lightning)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, section, instantiate=False)
    try:
        parser.parse_object({section: values})
    except Exception as err:  # jsonargparse raises ArgumentError; any failure here is a config problem
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        fail(" ".join(lines))


def precheck(argv: list[str], subcommand: str = "fit") -> None:
    """Check the `task`, `args`, `model` and `data` sections with pure-Python code before Lightning is imported,
    so a typo in them is answered in a fraction of a second, then what the files alone show (`file_checks.py`).
    Exits with one error line on a problem."""
    if any(a in ("-h", "--help", "--print_config") or a.startswith("--print_config") for a in argv):
        return
    config = _config_sections(argv)
    if config is None:
        return
    import dataclasses

    from hf_lightning.tasks.registry import GENERATION_ARGS, args_for_task, get_task, resolve
    from hf_lightning.tasks.specs import DataSpec, ModelSpec

    for i, token in enumerate(argv[:-1]):
        if token == "--task":
            config["task"] = argv[i + 1]
        elif token.startswith("--task="):
            config["task"] = token.split("=", 1)[1]
    try:
        task = get_task(str(config.get("task", "text_classification")))
    except ValueError as err:
        fail(err)
    args_class = resolve(GENERATION_ARGS)
    trainer = config.get("trainer")
    if isinstance(trainer, dict) and trainer:
        from hf_lightning.cli.trainer_spellings import move_lightning_spellings, user_set

        args_values = config.get("args") or {}
        if isinstance(args_values, dict):
            defaults = {f.name: f.default for f in dataclasses.fields(args_class)}
            try:
                _, config["args"] = move_lightning_spellings(user_set(trainer), args_values, defaults)
            except ValueError as err:
                fail(err)
    specs: dict[str, Any] = {}
    # the parser accepts every generation field; `args_for_task` narrows them to the task's own args class
    for section, cls in (("args", args_class), ("model", ModelSpec), ("data", DataSpec)):
        values = config.get(section) or {}
        if not isinstance(values, dict):
            fail(f"`{section}` must be a mapping of options, got {type(values).__name__}.")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            import difflib

            hints = [f"{u} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(u, known, 1)) else u
                     for u in unknown]
            fail(f"unknown key(s) in `{section}`: {', '.join(hints)}. See `hf-lightning fit --help`.")
        if section == "model" and not values:
            continue
        if section == "args":
            try:
                cls, values = args_for_task(task, values)
            except ValueError as err:
                fail(err)
        _check_types(section, cls, values)
        try:
            specs[section] = cls(**values)
        except (TypeError, ValueError) as err:
            fail(f"in `{section}`: {err}")
    from hf_lightning.cli.file_checks import check_config_files

    problem = check_config_files(subcommand, task, specs["args"], specs.get("model"), specs["data"])
    if problem is not None:
        fail(problem)
