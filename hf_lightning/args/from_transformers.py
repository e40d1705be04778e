"""Conversion of a `transformers.TrainingArguments` into hf_lightning's `TrainingArguments`.

Every field we support is copied (enums become their string values). Every other field whose value differs from
HF's default is collected, and all of them are reported in one error, so nothing a user set is silently ignored.
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from typing import Any

from hf_lightning.args import TrainingArguments

__all__ = ["from_hf_training_arguments"]

# HF fields whose value is filled by HF itself or has no meaning here; never reported as unsupported.
_IGNORED = {
    "do_train", "do_eval", "do_predict", "local_rank", "ddp_backend", "log_level", "log_level_replica",
    "log_on_each_node", "disable_tqdm", "skip_memory_metrics", "push_to_hub_token", "hub_token",
    "logging_dir", "_n_gpu", "accelerator_config", "deepspeed_plugin", "parallelism_config",
    "activation_checkpointing",  # HF 5 mirrors it into `gradient_checkpointing`, which we read
}


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def from_hf_training_arguments(hf_args: Any) -> TrainingArguments:
    """Build our `TrainingArguments` from a `transformers.TrainingArguments` (or a subclass).

    Raises:
        ValueError: listing every field that is set to a non-default value we do not support.
    """
    ours = {f.name for f in dataclasses.fields(TrainingArguments)}
    init_fields = [f for f in dataclasses.fields(hf_args) if f.init]
    supported = {f.name: getattr(hf_args, f.name) for f in init_fields if f.name in ours}
    # The reference gets the same supported fields, so values HF derives from them in `__post_init__` (e.g.
    # `gradient_checkpointing=True` sets `activation_checkpointing=True`) are not reported as set by the user.
    with warnings.catch_warnings():  # e.g. HF's FutureWarning for the `gradient_checkpointing` alias: not the user's
        warnings.simplefilter("ignore")
        reference = type(hf_args)(**supported)
    values: dict[str, Any] = {}
    unsupported: list[str] = []
    for f in init_fields:
        value = _plain(getattr(hf_args, f.name))
        if f.name in ours:
            values[f.name] = value
        elif f.name not in _IGNORED and value != _plain(getattr(reference, f.name)):
            unsupported.append(f"{f.name}={value!r}")
    if unsupported:
        raise ValueError(
            "These transformers.TrainingArguments fields are set to values hf_lightning does not support: "
            + ", ".join(unsupported)
            + ". Reset them to their defaults (see README, 'HF argument map'); Lightning-side settings go in "
            "`lightning_kwargs`."
        )
    report_to = values.get("report_to")
    if report_to in (["none"], "none", None, []):
        values.pop("report_to", None)  # HF's default; we keep our TensorBoard default
    values = {k: v for k, v in values.items() if k in ours}
    return TrainingArguments(**values)
