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
from hf_lightning.seq2seq.gen_kwargs import check_gen_kwargs, resolve_gen_kwargs
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

    The kwargs of the last `evaluate` / `predict` call persist (HF's `_gen_kwargs`, settable) in
    `module.gen_kwargs`; evaluations during `train()` use the args' `generation_max_length` /
    `generation_num_beams` unless an overridden `evaluate` sets `_gen_kwargs` itself. `evaluate` / `predict` set
    `gather_function` to `accelerator.gather` (each batch's mean loss counted as a full batch, as HF); a direct
    `evaluation_loop` call counts it per sample, as HF's.
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
        """HF's attribute for the stored `generate` kwargs, which `prediction_step` uses.

        Settable, as HF's plain attribute: HF's `trainer_seq2seq_qa.py` sets it in its own `evaluate` / `predict`
        before calling `evaluation_loop`; the value is used as given (HF's `evaluate` fills `max_length` /
        `num_beams` from the args, a direct assignment does not), also for evaluations during `train()`.
        """
        return self.module.gen_kwargs

    @_gen_kwargs.setter
    def _gen_kwargs(self, gen_kwargs: dict[str, Any]) -> None:
        check_gen_kwargs(gen_kwargs)
        self.module.set_gen_kwargs(dict(gen_kwargs))

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
        self.gather_function = self.accelerator.gather  # HF S2S:189: each batch's loss counts as a full batch
        self._gen_kwargs = resolve_gen_kwargs(self.args, gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(
        self,
        test_dataset: Any,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "test",
        **gen_kwargs: Any,
    ) -> Any:
        """HF's `Seq2SeqTrainer.predict`: `PredictionOutput` with generated ids when `predict_with_generate`."""
        self.gather_function = self.accelerator.gather  # HF S2S:250, as `evaluate`
        self._gen_kwargs = resolve_gen_kwargs(self.args, gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
