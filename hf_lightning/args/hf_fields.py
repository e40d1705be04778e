"""HF's `__post_init__` normalisation of the fields scripts read, and the refusal of unsupported fields.

Called first by `validation.normalise_and_check`; appends problems to its list, so everything is reported at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

from hf_lightning.args.report_to import resolve_report_to
from hf_lightning.args.support import unsupported_problem

if TYPE_CHECKING:
    from hf_lightning.args.training_args import TrainingArguments

__all__ = ["normalise_hf_fields"]


def _defaults(args: TrainingArguments) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(args):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def normalise_hf_fields(args: TrainingArguments, issues: list[str]) -> None:
    """HF TA:1515-1600 for the fields hf_lightning keeps as HF does, then one problem for unsupported fields set."""
    if args.output_dir is None:
        args.output_dir = "trainer_output"  # HF 5's default
    args.output_dir = os.path.expanduser(args.output_dir)
    # `gradient_checkpointing` is HF's deprecated alias of `activation_checkpointing`: the new name wins when set,
    # and afterwards both hold the same value (HF TA:1533-1545, with its FutureWarning)
    if args.activation_checkpointing is None and args.gradient_checkpointing is not None:
        warnings.warn("`gradient_checkpointing` is deprecated and will be removed in v6. Use "
                      "`activation_checkpointing` instead.", FutureWarning, stacklevel=4)
        args.activation_checkpointing = args.gradient_checkpointing
    args.activation_checkpointing = bool(args.activation_checkpointing)
    args.gradient_checkpointing = args.activation_checkpointing
    if args.disable_tqdm is None:  # HF: off unless transformers logs less than warnings
        args.disable_tqdm = logging.getLogger("transformers").getEffectiveLevel() > logging.WARN
    if isinstance(args.include_num_input_tokens_seen, bool):
        args.include_num_input_tokens_seen = "all" if args.include_num_input_tokens_seen else "no"
    if not args.debug:  # "" and [] both mean no debug feature, as in HF
        args.debug = ""
    if args.eval_strategy != "no":
        args.do_eval = True  # HF TA:1570
    args.report_to, problems = resolve_report_to(args.report_to)
    issues.extend(problems)
    problem = unsupported_problem({f.name: getattr(args, f.name) for f in dataclasses.fields(args)}, _defaults(args))
    if problem:
        issues.append(problem)
