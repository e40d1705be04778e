"""Normalisation and validation of `TrainingArguments`, mirroring `transformers.TrainingArguments.__post_init__`.

Every check appends to one list and the function raises once, so a user fixes all problems in one go. Messages quote
HF's wording where HF has one (users search for those strings) and always name the argument and its value. The
types of all fields are checked first (`field_types.py`, from the dataclass annotations): a mistyped field is
reported with the others of its kind before any value check could trip over it.
"""

from __future__ import annotations

import ntpath
import posixpath
from typing import Any, get_args

from hf_lightning.args import choices
from hf_lightning.args.accelerator_config import as_config_dict, loader_settings, syncs_each_batch
from hf_lightning.args.choices import (
    HF_BUILT_OPTIMIZERS,
    OPTIMIZER_NAMES,
    REFUSED_OPTIMIZERS,
    SAMPLING_STRATEGIES,
    SCHEDULER_NAMES,
)
from hf_lightning.args.field_types import check_field_types
from hf_lightning.args.hf_fields import hold_hf_enums, normalise_hf_fields
from hf_lightning.args.parallel import FSDPSettings, fsdp_settings, strategy_problems

TrainingArguments = Any
"""The dataclass these checks run for (`training_args.py` calls them); not imported here, it imports this module."""

__all__ = ["normalise_and_check"]


def _choices(annotation_name: str) -> tuple[str, ...]:
    return tuple(get_args(getattr(choices, annotation_name)))


def _check_choice(issues: list[str], name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        issues.append(f"`{name}`={value!r} is not valid; allowed: {', '.join(allowed)}.")


def _normalise_steps(args: TrainingArguments, issues: list[str], name: str, strategy: str) -> None:
    """HF TA:1735-1746: a value > 1 must be an integer when its strategy is "steps"; integral floats become ints."""
    value = getattr(args, name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        issues.append(f"`{name}`={value!r} must be a number (an int >= 1, or a fraction in (0, 1)).")
        return
    if value < 0:
        issues.append(f"`{name}`={value} must be >= 0.")
        return
    if value > 1 and value != int(value):
        if getattr(args, strategy) == "steps":
            issues.append(f"--{name} must be an integer if bigger than 1: {value}")
        return
    if value >= 1:
        setattr(args, name, int(value))


def _check_best_model(args: TrainingArguments, issues: list[str]) -> None:
    """HF TA:1748-1774 and T:686-690, plus the metric defaults of TA:1585-1592."""
    needs_metric = args.load_best_model_at_end or args.lr_scheduler_type in ("reduce_lr_on_plateau", "greedy")
    if needs_metric and args.metric_for_best_model is None:
        args.metric_for_best_model = "loss"
    if args.greater_is_better is None and args.metric_for_best_model is not None:
        args.greater_is_better = not args.metric_for_best_model.endswith("loss")
    if args.save_strategy == "best" and args.metric_for_best_model is None:
        issues.append(
            "`args.metric_for_best_model` must be provided when using 'best' save_strategy or if "
            "`args.load_best_model_at_end` is set to `True`."
        )
    if not args.load_best_model_at_end:
        return
    if args.save_strategy != "best" and args.eval_strategy != args.save_strategy:
        issues.append(
            "--load_best_model_at_end requires the save and eval strategy to match, except when "
            f'--save_strategy="best", but found\n- Evaluation strategy: {args.eval_strategy}\n'
            f"- Save strategy: {args.save_strategy}"
        )
        return
    if args.eval_strategy != "steps" or args.save_strategy != "steps" or args.eval_steps is None:
        return
    save, ev = args.save_steps, args.eval_steps
    if save % ev == 0:
        return
    # HF's exact wording (TA:1755-1774): "a multiple" for ratios, "a round multiple" for absolute steps.
    prefix = "--load_best_model_at_end requires the saving steps to be a {}multiple of the evaluation steps, "
    if ev < 1 and save < 1:
        if round(save * 1e6) % round(ev * 1e6) != 0:
            issues.append(prefix.format("") + f"but found {save}, which is not a multiple of {ev}.")
    elif ev < 1 or save < 1:
        issues.append(
            prefix.format("") + "which cannot get guaranteed when mixing ratio and absolute steps for "
            f"save_steps {save} and eval_steps {ev}."
        )
    else:
        issues.append(prefix.format("round ") + f"but found {save}, which is not a round multiple of {ev}.")


def _escapes(name: str) -> bool:
    """Whether a folder name used below output_dir could point outside it (absolute, `..`, a drive)."""
    parts = name.replace("\\", "/").split("/")
    return posixpath.isabs(name) or ntpath.isabs(name) or bool(ntpath.splitdrive(name)[0]) or ".." in parts


def _fsdp_or_none(args: TrainingArguments) -> FSDPSettings | None:
    """The FSDP settings, or None when FSDP is off or its fields are invalid (`strategy_problems` names those)."""
    try:
        return fsdp_settings(args.fsdp, args.fsdp_config)
    except (ValueError, FileNotFoundError):
        return None


def _check_auto_micro_batch(args: TrainingArguments, issues: list[str]) -> None:
    """`auto_micro_batch` where it cannot work: with HF's other out-of-memory rule, or with a strategy whose forward
    or backward runs collectives (README "Micro-batching that keeps the global batch", the rule)."""
    if not args.auto_micro_batch:
        return
    if args.auto_find_batch_size:
        issues.append("`auto_micro_batch`=True and `auto_find_batch_size`=True: choose one out-of-memory rule "
                      "(auto_micro_batch keeps the global batch and retries the update; auto_find_batch_size is HF's: "
                      "training starts again with a smaller batch).")
    settings = _fsdp_or_none(args)
    if settings is not None and settings.version == 1:
        issues.append(f"`auto_micro_batch`=True with `fsdp`={args.fsdp!r} and fsdp_config['version']=1: not supported "
                      "(FSDP1 all-gathers inside every forward with no seam to agree first, so a process that runs "
                      "out of memory there would leave the others waiting in a collective). Use FSDP2 "
                      "(fsdp_config['version']=2, the default), or drop auto_micro_batch.")
    if args.deepspeed:
        issues.append("`auto_micro_batch`=True with `deepspeed`: not supported (DeepSpeed's engine owns the "
                      "micro-batch and the accumulation: set `train_micro_batch_size_per_gpu` in its config). Drop "
                      "one of them.")
    if args.ddp_static_graph:
        issues.append("`auto_micro_batch`=True with `ddp_static_graph`=True: not supported (the static graph "
                      "synchronises gradients inside every backward). Drop one of them.")
    if syncs_each_batch(args):
        issues.append("`auto_micro_batch`=True with accelerator_config.gradient_accumulation_kwargs['sync_each_batch']"
                      "=True: not supported (it synchronises gradients inside every backward, where a process that "
                      "runs out of memory would leave the others waiting). Drop one of them.")


def normalise_and_check(args: TrainingArguments) -> None:
    """Fill HF's derived defaults in place and raise one `ValueError` listing every invalid field."""
    if isinstance(args.accelerator_config, type):  # HF's error and words (TA:1646-1650)
        raise NotImplementedError(
            "Tried passing in a callable to `accelerator_config`, but this is not supported. Please pass in a fully "
            "constructed `AcceleratorConfig` object instead."
        )
    args.accelerator_config = as_config_dict(args.accelerator_config)  # checked as HF's `dict | str | None`
    type_issues = check_field_types(args)  # first: everything below relies on the types
    if type_issues:
        raise ValueError("Invalid TrainingArguments (types):\n- " + "\n- ".join(type_issues))
    issues: list[str] = []
    normalise_hf_fields(args, issues)
    # HF accepts None (its default) or a JSON string for `lr_scheduler_kwargs` (TA:792); we keep a dict.
    if args.lr_scheduler_kwargs is None:
        args.lr_scheduler_kwargs = {}
    elif isinstance(args.lr_scheduler_kwargs, str):
        import json

        try:
            args.lr_scheduler_kwargs = json.loads(args.lr_scheduler_kwargs)
        except json.JSONDecodeError:
            issues.append(f"`lr_scheduler_kwargs`={args.lr_scheduler_kwargs!r} is not a JSON object.")
    _check_choice(issues, "eval_strategy", args.eval_strategy, _choices("IntervalStrategyName"))
    _check_choice(issues, "logging_strategy", args.logging_strategy, _choices("IntervalStrategyName"))
    _check_choice(issues, "save_strategy", args.save_strategy, _choices("SaveStrategyName"))
    if args.train_sampling_strategy == "batch_rebalance":
        issues.append(f"`train_sampling_strategy`={args.train_sampling_strategy!r} is not supported by hf_lightning "
                      f"(token-balanced batches are not implemented); allowed: {', '.join(SAMPLING_STRATEGIES)}.")
    else:
        _check_choice(issues, "train_sampling_strategy", args.train_sampling_strategy, SAMPLING_STRATEGIES)
    if args.optim in REFUSED_OPTIMIZERS:
        issues.append(f"`optim`={args.optim!r} is not supported by hf_lightning: {REFUSED_OPTIMIZERS[args.optim]}; "
                      "pass your optimizer in `optimizers=(optimizer, None)`, or choose another `optim`.")
    else:
        _check_choice(issues, "optim", args.optim, OPTIMIZER_NAMES + HF_BUILT_OPTIMIZERS)
    _check_choice(issues, "lr_scheduler_type", args.lr_scheduler_type, SCHEDULER_NAMES)
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        value = getattr(args, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            issues.append(f"`{name}`={value!r} must be an int >= 1.")
    if args.eval_accumulation_steps is not None and args.eval_accumulation_steps < 1:
        issues.append(f"`eval_accumulation_steps`={args.eval_accumulation_steps!r} must be None or an int >= 1.")
    if args.num_train_epochs <= 0 and args.max_steps <= 0:
        issues.append(f"`num_train_epochs`={args.num_train_epochs} must be > 0 when `max_steps` is not set.")
    if args.warmup_steps < 0:
        issues.append(f"Got warmup_steps = {args.warmup_steps}, Expected value warmup_steps >= 0")
    if args.bf16 and args.fp16:
        issues.append("`bf16`=True and `fp16`=True: choose at most one mixed precision.")
    if args.fp16_full_eval and args.bf16_full_eval:
        issues.append("At most one of fp16 and bf16 can be True for full eval, but not both")  # HF's words
    cache_steps = args.torch_empty_cache_steps
    if cache_steps is not None and (isinstance(cache_steps, bool) or not isinstance(cache_steps, int)
                                    or cache_steps <= 0):
        issues.append(f"`torch_empty_cache_steps` must be an integer bigger than 0, got {cache_steps}.")
    issues.extend(strategy_problems(args))  # fsdp / deepspeed / ddp_* as HF reads them (args/parallel.py)
    if args.resume_keep_global_batch and loader_settings(args).split_batches:
        issues.append("`resume_keep_global_batch`=True with `accelerator_config={'split_batches': True}`: under "
                      "split_batches the per-device batch is already that of all processes together, so a resume "
                      "on another number of processes keeps the global batch by itself; drop resume_keep_global_batch "
                      "(it would change gradient_accumulation_steps from a per-process batch that is not read).")
    for name in args.include_for_metrics:
        if name not in ("inputs", "loss"):
            issues.append(f"`include_for_metrics` entry {name!r} is not valid; allowed: inputs, loss.")
    if args.dataloader_prefetch_factor is not None and args.dataloader_num_workers == 0:
        issues.append(
            f"`dataloader_prefetch_factor`={args.dataloader_prefetch_factor} needs `dataloader_num_workers` > 0."
        )
    if args.peak_flops_per_device is not None and not args.peak_flops_per_device > 0:
        issues.append(f"`peak_flops_per_device`={args.peak_flops_per_device!r} must be None or > 0 (FLOP/s of one "
                      "device, e.g. 312e12 for an A100 in bf16).")
    if args.save_total_limit is not None and args.save_total_limit < 0:
        issues.append(f"`save_total_limit`={args.save_total_limit} must be None or >= 0.")

    for name, strategy in (("logging_steps", "logging_strategy"), ("eval_steps", "eval_strategy"),
                           ("save_steps", "save_strategy")):
        _normalise_steps(args, issues, name, strategy)
    if args.logging_strategy == "steps" and args.logging_steps == 0:
        issues.append("logging strategy IntervalStrategy.STEPS requires non-zero --logging_steps")
    if args.eval_strategy == "steps" and not args.eval_steps:
        if args.logging_steps:
            args.eval_steps = args.logging_steps
        else:
            issues.append(
                "evaluation strategy IntervalStrategy.STEPS requires either non-zero --eval_steps or --logging_steps"
            )
    if args.save_strategy == "steps" and args.save_steps == 0:
        issues.append("`save_strategy`='steps' requires non-zero `save_steps`.")
    if args.lr_scheduler_type == "reduce_lr_on_plateau" and args.eval_strategy == "no":
        issues.append("lr_scheduler_type reduce_lr_on_plateau requires an eval strategy")
    if args.lr_scheduler_type == "greedy" and args.eval_strategy == "no":
        issues.append("lr_scheduler_type greedy requires an eval strategy")  # HF's words (TA:1796-1798)
    _check_best_model(args, issues)
    if args.run_name is not None and _escapes(args.run_name):
        issues.append(f"`run_name`={args.run_name!r} names the logs' folder inside output_dir (runs/<run_name>); it "
                      "must be a relative name without '..', so nothing is written outside output_dir.")
    _check_choice(issues, "hub_strategy", args.hub_strategy, _choices("HubStrategyName"))
    _check_auto_micro_batch(args, issues)
    if issues:
        raise ValueError("Invalid TrainingArguments:\n- " + "\n- ".join(issues))
    hold_hf_enums(args)

