"""HF's `__post_init__` normalisation of the fields scripts read, and the refusal of unsupported fields.

Called first by `validation.normalise_and_check`; appends problems to its list, so everything is reported at once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import warnings
from typing import Any

from hf_lightning.args.accelerator_config import accelerate_state_exists, build_accelerator_config
from hf_lightning.args.enums import (
    DebugOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    SaveStrategy,
    SchedulerType,
)
from hf_lightning.args.report_to import resolve_report_to
from hf_lightning.args.support import unsupported_problem

TrainingArguments = Any
"""The dataclass these rules run for (`validation.py` calls them for `training_args.py`); not imported here."""

__all__ = ["DEBUG_OPTIONS", "hold_hf_enums", "normalise_hf_fields"]

DEBUG_OPTIONS = ("underflow_overflow",)
"""The `debug` options we honour (`transformers.debug_utils.DebugOption`); `tpu_metrics_debug` needs a TPU."""


def _defaults(args: TrainingArguments) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(args):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _typed_strings(values: dict[str, Any]) -> dict[str, Any]:
    """The JSON dict with HF's typing of its string values, nested dicts included: `"true"` / `"false"` become
    bools, digit strings ints, decimal strings floats (TA:161-176; a command line gives every value as a string)."""
    for key, value in values.items():
        if isinstance(value, dict):
            values[key] = _typed_strings(value)
        elif isinstance(value, str) and value.lower() in ("true", "false"):
            values[key] = value.lower() == "true"
        elif isinstance(value, str) and value.isdigit():
            values[key] = int(value)
        elif isinstance(value, str) and value.replace(".", "", 1).isdigit():
            values[key] = float(value)
    return values


def _parse_json_dict(args: TrainingArguments, name: str, issues: list[str]) -> None:
    """HF parses a dict field given as a string that starts with `{` as JSON (TA:1524-1531)."""
    value = getattr(args, name)
    if not (isinstance(value, str) and value.startswith("{")):
        return
    try:
        loaded = json.loads(value)
    except json.JSONDecodeError:
        issues.append(f"`{name}`={value!r} is not a JSON object.")
        return
    setattr(args, name, _typed_strings(loaded) if isinstance(loaded, dict) else loaded)


def normalise_hf_fields(args: TrainingArguments, issues: list[str]) -> None:
    """HF TA:1515-1600 for the fields hf_lightning keeps as HF does, then one problem for unsupported fields set."""
    if args.output_dir is None:
        args.output_dir = "trainer_output"  # HF 5's default
    args.output_dir = os.path.expanduser(args.output_dir)
    for name in type(args)._VALID_DICT_FIELDS:  # a subclass's own dict fields too (TRL's `model_init_kwargs`)
        _parse_json_dict(args, name, issues)
    # HF holds an `AcceleratorConfig` from here on (TA:1640-1652); HF's `Trainer` reads its attributes
    args.accelerator_config = build_accelerator_config(args.accelerator_config, issues)
    # HF's `_setup_devices` (run by its `__post_init__`) pops `use_configured_state` to reuse accelerate's state
    # (TA:1854-1863): popped the same way, so `to_dict()` is HF's; Lightning builds no accelerate state, but HF's rule
    # holds
    if args.accelerator_config is not None and args.accelerator_config.pop("use_configured_state") \
            and not accelerate_state_exists():
        issues.append("Passing `'use_configured_state':True` to the AcceleratorConfig requires a pre-configured "
                      "`AcceleratorState` or `PartialState` to be defined before calling `TrainingArguments`. ")
    # `gradient_checkpointing*` are HF's deprecated aliases of `activation_checkpointing*`: the new name wins when set,
    # and afterwards both hold the same value (HF TA:1533-1545, with its FutureWarning)
    for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                     ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
        if getattr(args, new) is None and getattr(args, old) is not None:
            warnings.warn(f"`{old}` is deprecated and will be removed in v6. Use `{new}` instead.", FutureWarning,
                          stacklevel=4)
            setattr(args, new, getattr(args, old))
        setattr(args, old, getattr(args, new))
    args.activation_checkpointing = args.gradient_checkpointing = bool(args.activation_checkpointing)
    # a compile mode or backend turns compiling on, which defaults to the inductor backend (HF TA:1620-1629)
    if (args.torch_compile_mode is not None or args.torch_compile_backend is not None) and not args.torch_compile:
        args.torch_compile = True
    if args.torch_compile and args.torch_compile_backend is None:
        args.torch_compile_backend = "inductor"
    if args.disable_tqdm is None:  # HF: off unless transformers logs less than warnings
        args.disable_tqdm = logging.getLogger("transformers").getEffectiveLevel() > logging.WARN
    tokens_seen = args.include_num_input_tokens_seen
    if isinstance(tokens_seen, str) and tokens_seen.lower() in ("true", "false"):  # a command line's spelling
        tokens_seen = tokens_seen.lower() == "true"
    if isinstance(tokens_seen, bool):
        tokens_seen = "all" if tokens_seen else "no"
    args.include_num_input_tokens_seen = tokens_seen
    # HF documents these three and counts every other string like "all" (T:2719-2748); a typo is refused here
    if tokens_seen not in ("all", "non_padding", "no"):
        issues.append(f"`include_num_input_tokens_seen`={tokens_seen!r} is not valid; allowed: all, non_padding, no, "
                      "True, False.")
    debug = args.debug.split() if isinstance(args.debug, str) else list(args.debug or [])  # HF TA:1565-1568
    for option in debug:
        if str(getattr(option, "value", option)) not in DEBUG_OPTIONS:
            issues.append(f"`debug` option {option!r} is not supported; allowed: {', '.join(DEBUG_OPTIONS)} "
                          "(or nothing).")
    args.debug = debug
    if args.use_cpu:  # HF TA:1689-1690
        args.dataloader_pin_memory = False
    if args.eval_strategy != "no":
        args.do_eval = True  # HF TA:1570
    args.report_to, problems = resolve_report_to(args.report_to)
    issues.extend(problems)
    problem = unsupported_problem({f.name: getattr(args, f.name) for f in dataclasses.fields(args)}, _defaults(args))
    if problem:
        issues.append(problem)


def hold_hf_enums(args: TrainingArguments) -> None:
    """HF's `__post_init__` holds its choice fields as its str enums (TA:1558-1568): `args.optim.value` works, and
    `f"{args.optim}"` reads `OptimizerNames.ADAMW_TORCH_FUSED` as in HF's messages and model card (`enums.py`).
    Called once the values are known to be valid."""
    args.eval_strategy = IntervalStrategy(args.eval_strategy)
    args.logging_strategy = IntervalStrategy(args.logging_strategy)
    args.save_strategy = SaveStrategy(args.save_strategy)
    args.hub_strategy = HubStrategy(args.hub_strategy)
    args.lr_scheduler_type = SchedulerType(args.lr_scheduler_type)
    args.optim = OptimizerNames(args.optim)
    args.debug = [DebugOption(option) for option in args.debug]
