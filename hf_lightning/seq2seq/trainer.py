"""`Seq2SeqTrainer`: the facade with HF's `Seq2SeqTrainer` methods (`evaluate`/`predict` take `**gen_kwargs`)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from hf_lightning.args import TrainingArguments
from hf_lightning.args.from_transformers import from_hf_training_arguments
from hf_lightning.seq2seq.args import SEQ2SEQ_FIELDS, Seq2SeqTrainingArguments
from hf_lightning.seq2seq.gen_kwargs import resolve_gen_kwargs
from hf_lightning.seq2seq.module import Seq2SeqTransformerModule
from hf_lightning.trainer.facade import Trainer
from hf_lightning.trainer.script_api import PassedArguments

__all__ = ["Seq2SeqTrainer"]


def to_seq2seq_args(args: PassedArguments | None) -> Seq2SeqTrainingArguments:
    """Our `Seq2SeqTrainingArguments` from None, ours (plain or seq2seq) or a `transformers` (Seq2Seq)TrainingArguments.

    Raises:
        ValueError: a `transformers` field set to a value hf_lightning does not support (see
            `args/from_transformers.py`).
    """
    if args is None:
        return Seq2SeqTrainingArguments(output_dir="tmp_trainer")
    if isinstance(args, Seq2SeqTrainingArguments):
        return args
    if isinstance(args, TrainingArguments):
        return Seq2SeqTrainingArguments(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init})
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
    module: Seq2SeqTransformerModule

    def __init__(
        self,
        model: nn.Module | None = None,
        args: PassedArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        model_init: Callable[..., nn.Module] | None = None,
        compute_loss_func: Callable[..., Any] | None = None,
        compute_metrics: Callable[..., dict] | None = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        preprocess_logits_for_metrics: Callable | None = None,
        *,
        optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None,
        lightning_kwargs: dict[str, Any] | None = None,
        eval_loss_weighting: str = "samples",
    ) -> None:
        """`transformers.Seq2SeqTrainer`'s parameters in its order (it has no `optimizer_cls_and_kwargs` there)."""
        super().__init__(
            model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
            eval_dataset=eval_dataset, processing_class=processing_class, model_init=model_init,
            compute_loss_func=compute_loss_func, compute_metrics=compute_metrics, callbacks=callbacks,
            optimizers=optimizers, optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics, lightning_kwargs=lightning_kwargs,
            eval_loss_weighting=eval_loss_weighting,
        )

    @staticmethod
    def _resolve_args(args: PassedArguments | None) -> TrainingArguments:
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
