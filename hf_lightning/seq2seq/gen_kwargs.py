"""Pure rules for the `generate` keyword arguments and the width of the returned predictions.

- `resolve_gen_kwargs`: HF's `Seq2SeqTrainer.evaluate/predict` filling (S2S:139-257): the args' `max_length` and
  `num_beams` unless the call gives them; the result is what later `prediction_step` calls use.
- `generation_width`: the length the generation actually used, to pad every batch to the same width (HF pads to
  `model.generation_config.max_length`, 20 by default, whatever `max_length` was used).
- `load_generation_config`: HF's `Seq2SeqTrainer.load_generation_config` (S2S:89-137).
- `settle_generation_config`: what HF's `prediction_step` does to `model.generation_config` after each `generate`
  (S2S:331-342).
"""

from __future__ import annotations

from copy import deepcopy
from pathlib import Path
from typing import Any

from transformers import GenerationConfig

from hf_lightning.args import TrainingArguments
from hf_lightning.pretrained_source import check_pretrained_source
from hf_lightning.seq2seq.args import Seq2SeqTrainingArguments

__all__ = ["resolve_gen_kwargs", "check_gen_kwargs", "generation_width", "load_generation_config",
           "settle_generation_config", "DEFAULT_MAX_LENGTH"]

DEFAULT_MAX_LENGTH = 20
"""`generate`'s library default `max_length` when neither the call nor the generation config sets one."""


def resolve_gen_kwargs(args: TrainingArguments, gen_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of `gen_kwargs` with `max_length` / `num_beams` filled from `args` when the caller gave none (plain
    `TrainingArguments` have no generation fields: nothing is filled).

    Raises:
        ValueError: `num_beams` < 1 or a non-positive `max_length` / `max_new_tokens`.
    """
    out = dict(gen_kwargs or {})
    generation = args if isinstance(args, Seq2SeqTrainingArguments) else None
    max_length = generation.generation_max_length if generation is not None else None
    if out.get("max_length") is None and out.get("max_new_tokens") is None and max_length is not None:
        out["max_length"] = max_length
    num_beams = generation.generation_num_beams if generation is not None else None
    if out.get("num_beams") is None and num_beams is not None:
        out["num_beams"] = num_beams
    check_gen_kwargs(out)
    return out


def check_gen_kwargs(gen_kwargs: dict[str, Any]) -> None:
    """Reject values `generate` would fail on late (or silently misuse), naming the argument."""
    for name in ("num_beams", "max_length", "max_new_tokens"):
        value = gen_kwargs.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            source = {"num_beams": "generation_num_beams", "max_length": "generation_max_length"}.get(name)
            hint = f" (from `{source}` or the `{name}` keyword)" if source else ""
            raise ValueError(f"`{name}`={value!r}{hint} must be an integer >= 1.")


def generation_width(gen_kwargs: dict[str, Any], generation_config: Any, is_encoder_decoder: bool) -> int:
    """The longest output the generation can produce with these kwargs.

    Encoder-decoder outputs start with the decoder start token, so `max_new_tokens` allows `max_new_tokens + 1`
    ids; decoder-only predictions are the completions only, so `max_new_tokens` ids, or at most `max_length`
    (the prompt takes part of it).
    """
    extra = 1 if is_encoder_decoder else 0
    if gen_kwargs.get("max_new_tokens") is not None:
        return int(gen_kwargs["max_new_tokens"]) + extra
    if gen_kwargs.get("max_length") is not None:
        return int(gen_kwargs["max_length"])
    if getattr(generation_config, "max_new_tokens", None) is not None:
        return int(generation_config.max_new_tokens) + extra
    max_length = getattr(generation_config, "max_length", None)
    return int(max_length) if max_length is not None else DEFAULT_MAX_LENGTH


def load_generation_config(value: Any) -> Any:
    """A `GenerationConfig` from an object (deep-copied), a file, a folder or a name; strictly validated.

    Raises:
        ValueError: the config is invalid (HF's strict validation), naming `generation_config`.
    """
    if isinstance(value, GenerationConfig):
        config = deepcopy(value)
    elif isinstance(value, (str, Path)):
        path = Path(value)
        if path.is_file():
            config = GenerationConfig.from_pretrained(path.parent, path.name)
        else:
            check_pretrained_source("generation_config", str(value))  # one line for a typo or no network
            config = GenerationConfig.from_pretrained(str(value))
    else:
        raise ValueError(
            f"`generation_config`={value!r} must be a transformers.GenerationConfig, a path or a name "
            f"(got {type(value).__name__})."
        )
    try:
        config.validate(strict=True)
    except ValueError as exc:
        raise ValueError(f"`generation_config` is invalid: {exc}") from exc
    return config


def settle_generation_config(config: Any) -> None:
    """HF's `Seq2SeqTrainer.prediction_step` after each `generate` (S2S:331-342), in place on the model's config.

    `_from_model_config` is cleared, and every field still None gets `generate`'s library default (transformers 5
    leaves them None and applies the defaults per call). The fill changes later generations: with `max_length`
    None, `generate` uses its model-agnostic default (20 new tokens: 21 ids for an encoder-decoder), with 20 set
    it stops at 20 ids. HF's evaluations during training therefore generate 21 ids in the first batch of the first
    evaluation and 20 afterwards, and every `generation_config.json` saved after an evaluation lists all the
    fields (`max_length`, `num_beams`, ...); the same mutation here gives the same numbers and files.
    """
    if getattr(config, "_from_model_config", False):
        config._from_model_config = False  # no rebuilding from the model config at every batch
    defaults = getattr(config, "_get_default_generation_params", None)
    if callable(defaults):  # transformers >= 5: earlier versions built the config with the defaults set
        config.update(**defaults(), defaults_only=True)
