"""`Seq2SeqTrainingArguments`: `TrainingArguments` plus HF's generation fields (S2SA:55-82).

Pure Python like `hf_lightning.args` (no torch import): `generation_config` may be a `GenerationConfig` object, a
path to a folder or file, or a name; it is loaded by the module (`load_generation_config`), not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_lightning.args import TrainingArguments
from hf_lightning.args.keyword_hints import with_keyword_hints

__all__ = ["Seq2SeqTrainingArguments", "SEQ2SEQ_FIELDS"]

SEQ2SEQ_FIELDS = (
    "sortish_sampler", "predict_with_generate", "generation_max_length", "generation_num_beams", "generation_config",
)
"""The fields this class adds to `TrainingArguments` (every field HF's adds, same names and defaults)."""


@with_keyword_hints
@dataclass
class Seq2SeqTrainingArguments(TrainingArguments):
    """`TrainingArguments` with HF's `Seq2SeqTrainingArguments` generation fields.

    Raises:
        ValueError: an invalid base field (all reported together), `generation_num_beams` < 1 or
            `generation_max_length` < 1.
    """

    sortish_sampler: bool = False
    """Accepted as in HF, whose `Seq2SeqTrainer` does not use it either (no effect)."""
    predict_with_generate: bool = False
    """Evaluate and predict by calling `model.generate` (predictions are token ids, metrics compare texts)."""
    generation_max_length: int | None = None
    """`max_length` passed to `generate` when `evaluate`/`predict` get neither `max_length` nor `max_new_tokens`.
    For a decoder-only model it counts the prompt too (HF's `generate` semantics)."""
    generation_num_beams: int | None = None
    """`num_beams` passed to `generate` when `evaluate`/`predict` do not get one (1 = greedy)."""
    generation_config: str | Path | Any | None = None
    """A `transformers.GenerationConfig`, a folder/file path or a name; replaces `model.generation_config`.
    (HF's type `str | Path | GenerationConfig | None`, with `Any` for the config so that importing needs no
    transformers.)"""

    def __post_init__(self) -> None:
        super().__post_init__()
        issues = []
        for name in ("generation_num_beams", "generation_max_length"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                issues.append(f"`{name}`={value!r} must be None or an integer >= 1.")
        if issues:
            raise ValueError("Invalid Seq2SeqTrainingArguments: " + " ".join(issues))
