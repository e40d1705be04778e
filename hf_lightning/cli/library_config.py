"""A CLI config that runs a library's `transformers.Trainer` subclass (TRL's `SFTTrainer`): read and checked before
torch is imported.

Such a config names the trainer class and its arguments class instead of a task preset::

    trainer_class: trl.SFTTrainer     # a transformers.Trainer subclass (built on hf_lightning's, see library_run.py)
    args_class: trl.SFTConfig         # its arguments dataclass: the `args:` keys are its fields
    allow_code_from: [trl]            # the config imports trl: it must say so (config_code.py)
    args: {...}                       # SFTConfig fields (HF TrainingArguments + TRL's own)
    model: {...}                      # ModelSpec, as in the other configs (Auto class: AutoModelForCausalLM)
    data: {...}                       # DataSpec: the files / dataset, the tokenizer, sample limits
    trainer: {...}                    # lightning.Trainer options, given to the trainer as `lightning_kwargs`
    hf_callbacks: [...]               # optional: transformers.TrainerCallback classes

`task: sft` is the short form of the first two lines (`task: dpo`, `task: grpo` of TRL's DPO / GRPO trainers). A GRPO
(or RLOO) config also names its reward functions, `reward_funcs: [prompt_words]`: built-in names
(`tasks/rewards.py`) or dotted paths under `allow_code_from`, checked here before anything is imported.
Everything here is pure Python (YAML and the spec dataclasses): a mistyped key, a class from a package the config
does not allow or that is not installed (naming the hf-lightning extra that installs it), a missing file or
`predict` (which these trainers cannot run on text rows) is one `error:` line in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from hf_lightning.cli.config_code import check_code_path
from hf_lightning.cli.file_checks import folder_problem
from hf_lightning.tasks.loading import check_files
from hf_lightning.tasks.rewards import BUILT_IN, reward_entry_problem
from hf_lightning.tasks.specs import DataSpec, ModelSpec

__all__ = [
    "LIBRARY_TASKS", "LibraryConfig", "is_library_config", "processes_lightning_starts", "read_library_config",
    "unknown_keys",
]

LIBRARY_TASKS = {
    "sft": ("trl.SFTTrainer", "trl.SFTConfig"),
    "dpo": ("trl.DPOTrainer", "trl.DPOConfig"),
    "grpo": ("trl.GRPOTrainer", "trl.GRPOConfig"),
}
"""`task:` names the CLI runs with a library trainer: `(trainer_class, args_class)` they stand for."""

NEEDS_REWARDS = ("trl.GRPOTrainer", "trl.RLOOTrainer")
"""Trainer classes that learn from reward functions: their config must name `reward_funcs`."""

_EXTRAS = {"trl": "trl"}
"""The hf-lightning extra that installs a library package a config's classes come from (pyproject.toml)."""

_TOP_KEYS = ("task", "trainer_class", "args_class", "allow_code_from", "allow_remote_code", "args", "model", "data",
             "trainer", "hf_callbacks", "ckpt_path", "reward_funcs")
_SECTIONS = ("args", "model", "data", "trainer")

_DATA_USED = ("train_file", "validation_file", "dataset_name", "dataset_config_name", "train_split",
              "validation_split", "tokenizer_name_or_path", "tokenizer_file", "special_tokens", "max_train_samples",
              "max_eval_samples")
"""The `data:` fields a library-trainer run reads; the others are task-preset preprocessing, which the library
trainer does itself (see `_DATA_INSTEAD`)."""
_DATA_INSTEAD = {
    "text_column": "args.dataset_text_field (TRL reads the column itself)",
    "max_length": "args.max_length",
    "block_size": "args.max_length (with args.packing: true to pack texts into blocks)",
    "preprocessing_num_workers": "args.dataset_num_proc",
    "test_file": "nothing: the library trainer does not predict (see `predict`)",
    "test_split": "nothing: the library trainer does not predict (see `predict`)",
}


@dataclass
class LibraryConfig:
    """A checked library-trainer config: class paths, the raw `args` / `trainer` sections (checked once the classes
    are imported) and the parsed `model` / `data` specs."""

    subcommand: str
    trainer_class: str
    args_class: str
    args: dict[str, Any]
    model: ModelSpec
    data: DataSpec
    trainer: dict[str, Any]
    allow_code_from: list[str] = field(default_factory=list)
    hf_callbacks: list[Any] = field(default_factory=list)
    reward_funcs: list[str] = field(default_factory=list)
    """The reward functions (GRPO / RLOO): built-in names or dotted paths, checked (`_reward_funcs`)."""
    ckpt_path: str | None = None
    print_config: bool = False
    help: bool = False
    command_line: dict[str, str] = field(default_factory=dict)
    """`--<section>.<key>` values as typed (`args.eos_token` -> `[SEP]`): a string field keeps the text YAML would
    read as something else (see `library_run._training_arguments`)."""


def _value(text: str) -> Any:
    """A command-line value as the full parser reads it: YAML, except that `no` / `off` / `yes` / `on` stay words."""
    parsed = yaml.safe_load(text)
    keep_word = isinstance(parsed, bool) and text.strip().lower() not in ("true", "false")
    return text if keep_word else parsed


def _merge(config: dict[str, Any], document: dict[str, Any]) -> None:
    for key, value in document.items():
        merged = isinstance(value, dict) and isinstance(config.get(key), dict)
        config[key] = {**config[key], **value} if merged else value


def _set(config: dict[str, Any], key: str, value: Any) -> None:
    """`--a.b.c value`: nested keys, creating the mappings on the way."""
    *parents, last = key.split(".")
    node = config
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _read(argv: Sequence[str], command_line: dict[str, str] | None = None) -> tuple[dict[str, Any], bool]:
    """The merged config of every `--config` and `--key value` in order, and whether `--print_config` was given;
    `command_line` receives each `--key value`'s text as typed.

    Raises:
        ValueError: an option that is not a config key, or a config file that is not a mapping.
    """
    config: dict[str, Any] = {}
    print_config = False
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token.startswith("--print_config"):
            print_config = True
            continue
        if token in ("-h", "--help"):
            config["help"] = True
            continue
        if not token.startswith("-"):
            raise ValueError(f"unexpected argument {token!r}: options are --config FILE and --<key> VALUE.")
        key, has_value, text = token.lstrip("-").partition("=")
        if not has_value:
            if i >= len(argv):
                raise ValueError(f"option {token!r} needs a value.")
            text, i = argv[i], i + 1
        if key in ("c", "config"):
            if not os.path.isfile(text):
                raise ValueError(f"--config {text!r}: no such file.")
            with open(text, encoding="utf-8") as f:
                document = yaml.safe_load(f) or {}
            if not isinstance(document, dict):
                raise ValueError(f"--config {text!r}: a config is a mapping of sections, got "
                                 f"{type(document).__name__}.")
            _merge(config, document)
        elif key == "allow_code_from+":
            config.setdefault("allow_code_from", []).append(_value(text))
        elif key.split(".")[0] in _TOP_KEYS:
            _set(config, key, _value(text))
            if command_line is not None:
                command_line[key] = text
        else:
            raise ValueError(f"unknown option --{key}; a library-trainer config takes --config and the keys "
                             f"{', '.join(_TOP_KEYS)} (sections as --args.<name>, --trainer.<name>...).")
    return config, print_config


def is_library_config(argv: Sequence[str]) -> bool:
    """Whether the command line's config names a library trainer (`trainer_class`, or `task: sft`)."""
    try:
        config, _ = _read(argv)
    except (ValueError, OSError, yaml.YAMLError):
        return False  # not readable as one: the preset route reports it in its own words
    return "trainer_class" in config or config.get("task") in LIBRARY_TASKS


def unknown_keys(section: str, values: dict[str, Any], known: Sequence[str]) -> str | None:
    """One message naming each key of `values` not in `known` (with the closest known name), or None."""
    unknown = sorted(set(values) - set(known))
    if not unknown:
        return None
    hints = [f"{u} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(u, known, 1)) else u for u in unknown]
    return f"unknown key(s) in `{section}`: {', '.join(hints)}."


def _data_spec(values: dict[str, Any]) -> DataSpec:
    known = [f.name for f in dataclasses.fields(DataSpec)]
    if (problem := unknown_keys("data", values, known)) is not None:
        raise ValueError(problem + " See configs/README.md.")
    spec = DataSpec(**values)
    defaults = DataSpec()
    for name in known:
        if name not in _DATA_USED and getattr(spec, name) != getattr(defaults, name):
            instead = _DATA_INSTEAD.get(name, "nothing: the library trainer prepares its dataset itself")
            raise ValueError(f"data.{name}={getattr(spec, name)!r} is task-preset preprocessing, which a library "
                             f"trainer does not use (it tokenizes the rows itself); set {instead}.")
    return spec


def _model_spec(values: dict[str, Any]) -> ModelSpec:
    if (problem := unknown_keys("model", values, [f.name for f in dataclasses.fields(ModelSpec)])) is not None:
        raise ValueError(problem + " See configs/README.md.")
    return ModelSpec(**values)


def _mapping(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key) or {}
    if not isinstance(value, dict):
        raise ValueError(f"`{key}` must be a mapping of options, got {type(value).__name__}.")
    return value


def _class_paths(config: dict[str, Any]) -> tuple[str, str]:
    task = config.get("task")
    if task is not None and task not in LIBRARY_TASKS:
        raise ValueError(f"task={task!r} cannot be combined with trainer_class: a library-trainer config names its "
                         f"trainer (task: {', '.join(LIBRARY_TASKS)} is the short form of one); drop `task`.")
    default = LIBRARY_TASKS.get(str(task), (None, None))
    trainer_class = config.get("trainer_class", default[0])
    args_class = config.get("args_class", default[1] if trainer_class == default[0] else None)
    if not isinstance(trainer_class, str):
        raise ValueError(f"trainer_class={trainer_class!r}: a class path such as trl.SFTTrainer.")
    if not isinstance(args_class, str):
        raise ValueError(f"trainer_class={trainer_class!r} needs args_class: the dataclass of its arguments, whose "
                         "fields the `args:` keys are (e.g. args_class: trl.SFTConfig).")
    return trainer_class, args_class


def _not_installed(key: str, path: str) -> str | None:
    """One line when the package `path` comes from is not installed (a spec lookup: nothing is imported), naming the
    hf-lightning extra that installs it."""
    top = path.partition(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    extra = _EXTRAS.get(top)
    install = f'pip install "hf-lightning[{extra}]"' if extra is not None else f"install the {top} package"
    return f"{key}={path!r} needs the {top} package, which is not installed: {install}."


def processes_lightning_starts(trainer: dict[str, Any], gpus: int) -> int:
    """How many processes Lightning's own launcher would run for these `trainer:` options on a machine with `gpus`
    GPUs (1 when it starts none), by Lightning's reading of `devices` / `num_nodes` / `accelerator`."""
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes", 1)
    accelerator = str(trainer.get("accelerator", "auto"))
    if isinstance(devices, str) and devices.lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    elif isinstance(devices, int) and devices != -1:
        count = devices
    elif accelerator == "cpu" or gpus == 0:  # "auto" / -1 on CPU: one process
        count = 1
    else:
        count = gpus
    return max(count, 1) * max(int(nodes or 1), 1)


def _stage_problem(subcommand: str, data: DataSpec) -> str | None:
    if subcommand == "predict":
        return ("predict: a library trainer (TRL's SFTTrainer) tokenizes only the train and eval datasets it is built "
                "with, so Trainer.predict cannot run on the data's text rows; evaluate with `hf-lightning validate` "
                "(eval_loss, the trainer's metrics), or generate from the saved model.")
    if data.dataset_name is not None:
        return None
    if subcommand == "fit" and data.train_file is None:
        return "fit needs training data: set data.train_file or data.dataset_name."
    if subcommand == "validate" and data.validation_file is None:
        return "validate needs data: set data.validation_file (or a dataset_name)."
    return None


def _reward_funcs(config: dict[str, Any], trainer_class: str, allowed: Sequence[str]) -> list[str]:
    """The checked `reward_funcs` entries: each a built-in name or a dotted path the config allows (nothing is
    imported but library classes, as for `trainer_class`).

    Raises:
        ValueError: not a list of names, an entry that is neither (a reward model's folder included), none for a
            trainer that needs them, or a path from a package not in `allow_code_from` (`ConfigCodeError`).
    """
    value = config.get("reward_funcs")
    entries = [] if value is None else value if isinstance(value, list) else [value]
    if not entries and trainer_class in NEEDS_REWARDS:
        raise ValueError(f"trainer_class={trainer_class!r} learns from rewards: set reward_funcs, e.g. "
                         f"`reward_funcs: [prompt_words]` (built in: {', '.join(sorted(BUILT_IN))}; or a dotted path "
                         "to a function of a package listed in allow_code_from).")
    for index, entry in enumerate(entries):
        key = f"reward_funcs[{index}]"
        if (problem := reward_entry_problem(key, entry)) is not None:
            raise ValueError(problem)
        if entry not in BUILT_IN:
            check_code_path(key, entry, allowed)
    return [str(entry) for entry in entries]


def read_library_config(subcommand: str, argv: Sequence[str]) -> LibraryConfig:
    """The checked config of a library-trainer run (see the module docstring).

    Args:
        subcommand: `fit`, `validate` or `predict`.
        argv: the command line after the subcommand.

    Raises:
        ValueError: the first mistake, in one line naming the key, its value and what is allowed
            (`ConfigCodeError` for a class from a package the config does not allow).
    """
    command_line: dict[str, str] = {}
    config, print_config = _read(argv, command_line)
    show_help = bool(config.pop("help", False))
    if (problem := unknown_keys("the config", config, _TOP_KEYS)) is not None:
        raise ValueError(problem + " A library-trainer config has " + ", ".join(_TOP_KEYS) + ".")
    trainer_class, args_class = _class_paths(config)
    allowed = config.get("allow_code_from") or []
    allowed = allowed if isinstance(allowed, list) else [allowed]
    for key, path in (("trainer_class", trainer_class), ("args_class", args_class)):
        check_code_path(key, path, allowed)
        # before anything is loaded: importing the class happens after torch, transformers and Lightning (minutes)
        if (problem := _not_installed(key, path)) is not None:
            raise ValueError(problem)
    reward_funcs = _reward_funcs(config, trainer_class, allowed)
    sections = {name: _mapping(config, name) for name in _SECTIONS}
    model = _model_spec(sections["model"])
    data = _data_spec(sections["data"])
    hf_callbacks = config.get("hf_callbacks") or []
    if not isinstance(hf_callbacks, list):
        raise ValueError(f"hf_callbacks={hf_callbacks!r}: a list of TrainerCallback class paths.")
    ckpt_path = config.get("ckpt_path")
    if not (print_config or show_help):
        if (problem := _stage_problem(subcommand, data)) is not None:
            raise ValueError(problem)
        check_files(data)
        for key, value in (("model.model_name_or_path", model.model_name_or_path),
                           ("data.tokenizer_name_or_path", data.tokenizer_name_or_path),
                           ("data.dataset_name", data.dataset_name)):
            needs = "config.json" if key.startswith("model.") else None
            if (problem := folder_problem(key, value, needs)) is not None:
                raise ValueError(problem)
        if data.tokenizer_file is not None and not os.path.isfile(os.path.expanduser(data.tokenizer_file)):
            raise FileNotFoundError(f"data.tokenizer_file={data.tokenizer_file!r}: no such file.")
    return LibraryConfig(subcommand=subcommand, trainer_class=trainer_class, args_class=args_class,
                         args=sections["args"], model=model, data=data, trainer=sections["trainer"],
                         allow_code_from=[str(a) for a in allowed], hf_callbacks=hf_callbacks,
                         reward_funcs=reward_funcs,
                         ckpt_path=None if ckpt_path is None else str(ckpt_path), print_config=print_config,
                         help=show_help, command_line=command_line)

