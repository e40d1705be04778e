"""Conversion of a `transformers.TrainingArguments` into hf_lightning's `TrainingArguments`.

Both classes have the same fields. Every supported field is copied (enums become their string values). An
unsupported field (`support.UNSUPPORTED`) counts as set when its value differs from what HF itself derives without
it, so values HF fills in (e.g. `accelerator_config` becomes an `AcceleratorConfig()`) are not blamed on the user;
all such fields are reported in one error. `report_to` keeps HF's meaning: HF's default (no integration) writes no
logs here either.
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from typing import Any

from hf_lightning.args import TrainingArguments
from hf_lightning.args.support import UNSUPPORTED, unsupported_problem

__all__ = ["from_hf_training_arguments"]

def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def from_hf_training_arguments(hf_args: Any) -> TrainingArguments:
    """Build our `TrainingArguments` from a `transformers.TrainingArguments` (or a subclass).

    Raises:
        ValueError: listing every unsupported field that is set (with what to use instead), or any value our
            arguments reject (e.g. an `optim` we do not build).
    """
    ours = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    init_fields = [f for f in dataclasses.fields(hf_args) if f.init and f.name in ours]
    supported = {f.name: getattr(hf_args, f.name) for f in init_fields if f.name not in UNSUPPORTED}
    # The reference gets the same supported fields, so values HF derives from them in `__post_init__` are compared
    # like for like.
    with warnings.catch_warnings():  # e.g. HF's FutureWarning for the `gradient_checkpointing` alias: not the user's
        warnings.simplefilter("ignore")
        reference = type(hf_args)(**supported)
    set_values = {name: _plain(getattr(hf_args, name)) for name in UNSUPPORTED if name in ours}
    reference_values = {name: _plain(getattr(reference, name)) for name in set_values}
    problem = unsupported_problem(set_values, reference_values)
    if problem:
        raise ValueError("These transformers." + problem.removeprefix("these "))
    values = {name: _plain(value) for name, value in supported.items()}
    # HF resolved `report_to` in its `__post_init__` ("none" -> [], "all" -> installed names): pass the result on,
    # with [] spelled "none" so that our default (tensorboard) does not come back
    values["report_to"] = values["report_to"] or "none"
    return TrainingArguments(**values)
