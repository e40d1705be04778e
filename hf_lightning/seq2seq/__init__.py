"""Generation-based evaluation: HF's `Seq2SeqTrainer` on Lightning, plus decoder-only (prompt/completion) models.

- `Seq2SeqTrainingArguments` (`args.py`): `predict_with_generate`, `generation_max_length`, `generation_num_beams`,
  `generation_config`.
- `Seq2SeqTransformerModule` (`module.py`): `prediction_step` by `generate`, encoder-decoder and decoder-only.
- `Seq2SeqTrainer` (`trainer.py`): the facade with `evaluate(**gen_kwargs)` / `predict(**gen_kwargs)`.
- `tokenize_prompt_completion`, `split_prompt_completion` (`prompts.py`): the decoder-only dataset format.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Seq2SeqTrainingArguments": "hf_lightning.seq2seq.args",
    "Seq2SeqTransformerModule": "hf_lightning.seq2seq.module",
    "Seq2SeqTrainer": "hf_lightning.seq2seq.trainer",
    "tokenize_prompt_completion": "hf_lightning.seq2seq.prompts",
    "split_prompt_completion": "hf_lightning.seq2seq.prompts",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hf_lightning.seq2seq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
