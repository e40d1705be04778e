"""`Seq2SeqTrainer`: the facade with HF's `Seq2SeqTrainer` methods (`evaluate`/`predict` take `**gen_kwargs`)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from hf_lightning.args import TrainingArguments
from hf_lightning.facade import Trainer
from hf_lightning.seq2seq.args import SEQ2SEQ_FIELDS, Seq2SeqTrainingArguments
from hf_lightning.seq2seq.gen_kwargs import resolve_gen_kwargs
from hf_lightning.seq2seq.module import Seq2SeqTransformerModule

__all__ = ["Seq2SeqTrainer"]


def to_seq2seq_args(args: Any) -> Seq2SeqTrainingArguments:
    """Our `Seq2SeqTrainingArguments` from None, ours (plain or seq2seq) or a `transformers` (Seq2Seq)TrainingArguments.

    Raises:
        ValueError: a `transformers` field set to a value hf_lightning does not support (see `args/from_transformers.py`).
    """
    if args is None:
        return Seq2SeqTrainingArguments(output_dir="tmp_trainer")
    if isinstance(args, Seq2SeqTrainingArguments):
        return args
    if isinstance(args, TrainingArguments):
        return Seq2SeqTrainingArguments(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init})
    from hf_lightning.args.from_transformers import from_hf_training_arguments

    extra = {name: getattr(args, name) for name in SEQ2SEQ_FIELDS if hasattr(args, name)}
    plain = copy.copy(args)
    for name in SEQ2SEQ_FIELDS:
        if hasattr(plain, name):
            setattr(plain, name, False if name in ("predict_with_generate", "sortish_sampler") else None)
    base = from_hf_training_arguments(plain)
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    return Seq2SeqTrainingArguments(**values, **extra)


class Seq2SeqTrainer(Trainer):
    """Drop-in for `transformers.Seq2SeqTrainer`: same constructor as `hf_lightning.Trainer`, generation settings in
    `Seq2SeqTrainingArguments`, and `evaluate` / `predict` taking `generate` keyword arguments.

    The kwargs of the last `evaluate` / `predict` call persist (HF's `_gen_kwargs`) in `module.gen_kwargs`;
    evaluations during `train()` use the args' `generation_max_length` / `generation_num_beams`.
    """

    module_class = Seq2SeqTransformerModule
    args: Seq2SeqTrainingArguments

    @staticmethod
    def _resolve_args(args: Any) -> TrainingArguments:
        return to_seq2seq_args(args)

    @property
    def _gen_kwargs(self) -> dict[str, Any]:
        """HF's attribute name for the stored `generate` kwargs."""
        return self.module.gen_kwargs

    def evaluate(
        self,
        eval_dataset: Any = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
        **gen_kwargs: Any,
    ) -> dict[str, float]:
        """HF's `Seq2SeqTrainer.evaluate`: `max_length` / `num_beams` default to the args' generation values.

        Raises:
            ValueError: `num_beams` < 1 or a non-positive `max_length` / `max_new_tokens`.
        """
        self.module.gen_kwargs = resolve_gen_kwargs(self.args, gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(
        self,
        test_dataset: Any,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "test",
        **gen_kwargs: Any,
    ) -> Any:
        """HF's `Seq2SeqTrainer.predict`: `PredictionOutput` with generated ids when `predict_with_generate`."""
        self.module.gen_kwargs = resolve_gen_kwargs(self.args, gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
