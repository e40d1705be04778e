"""`Seq2SeqTransformerModule`: evaluation and prediction by generation, for encoder-decoder and decoder-only models.

With `args.predict_with_generate`, `prediction_step` follows HF's `Seq2SeqTrainer.prediction_step` (S2S:259-372):
`generate` with the stored `gen_kwargs`, a separate teacher-forced forward pass for the loss, and `(loss,
generated_ids, labels)` returned. Differences (README "Generation-based evaluation"):

- predictions are right-padded with the pad id to the length the generation actually used (`max_length`, or
  `max_new_tokens` (+1 for the decoder start token)), not to `model.generation_config.max_length` (20);
- labels keep -100 as their only padding (HF appends pad ids after the collator's -100);
- a decoder-only model (HF has no support) generates completions of left-padded prompts; the predictions are the
  completion tokens and the labels the reference completions (format in `prompts.py`).

`eval_loss` is weighted as HF's `Seq2SeqTrainer.evaluate` / `predict` weight it (`EvalSettings.eval_loss_repeats`):
every batch's mean loss counts `per_device_eval_batch_size` times, a short last batch as a full one; a direct
`evaluation_loop` call counts it per sample, as HF's (the caller's `gather_function`, `EvalRequest.loss_per_batch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import nn
from typing_extensions import override

from hf_lightning._lightning_compat import attached_trainer
from hf_lightning.module.evaluation import EvalSettings
from hf_lightning.module.module import TransformerModule
from hf_lightning.parallel.lockstep import needs_lockstep_forwards
from hf_lightning.parallel.runtime import generation_context
from hf_lightning.seq2seq.args import Seq2SeqTrainingArguments
from hf_lightning.seq2seq.gen_kwargs import (
    generation_width,
    load_generation_config,
    resolve_gen_kwargs,
    settle_generation_config,
)
from hf_lightning.seq2seq.prompts import left_pad_prompts, pad_right, split_prompt_completion

__all__ = ["Seq2SeqTransformerModule", "can_generate"]


def can_generate(model: nn.Module) -> bool:
    """Whether `model.generate` exists and the model class supports generation."""
    check = getattr(model, "can_generate", None)
    return hasattr(model, "generate") and (check() if callable(check) else True)


def _is_encoder_decoder(model: nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


class Seq2SeqTransformerModule(TransformerModule):
    """A `TransformerModule` that evaluates by generation when `args.predict_with_generate` (same constructor).

    Attributes:
        gen_kwargs: the `generate` keyword arguments used by `prediction_step` (HF's `_gen_kwargs`): the args'
            `generation_max_length` / `generation_num_beams`, replaced by `Seq2SeqTrainer.evaluate/predict(**kw)`
            and reset to the args' values at each evaluation during training (as HF).

    Raises:
        ValueError: `predict_with_generate` with a model that cannot generate, or an invalid `generation_config`.
    """

    def __init__(
        self,
        model: nn.Module,
        args: Seq2SeqTrainingArguments | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        compute_loss_func: Callable[..., torch.Tensor] | None = None,
        compute_metrics: Callable[..., dict] | None = None,
        preprocess_logits_for_metrics: Callable[..., torch.Tensor] | None = None,
        processing_class: Any = None,
        optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(
            model, args if args is not None else Seq2SeqTrainingArguments(), optimizers=optimizers,
            compute_loss_func=compute_loss_func, compute_metrics=compute_metrics,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics, processing_class=processing_class,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
        )
        if self.predict_with_generate and not can_generate(model):
            raise ValueError(
                f"`predict_with_generate`=True needs a model that can generate, but {type(model).__name__} has no "
                "usable `generate` (use a *ForConditionalGeneration / *ForCausalLM / *LMHeadModel class, or set "
                "`predict_with_generate`=False)."
            )
        generation = self.generation_args
        if generation is not None and generation.generation_config is not None:
            model.generation_config = load_generation_config(generation.generation_config)
        self.gen_kwargs: dict[str, Any] = resolve_gen_kwargs(self.args)
        self._gen_kwargs_from_caller = False  # set by `set_gen_kwargs` until the evaluation it is for has run

    @property
    def generation_args(self) -> Seq2SeqTrainingArguments | None:
        """`args` when they carry the generation fields; None for plain `TrainingArguments` (a lightning-native run
        may pass them), which evaluate as `TransformerModule` does."""
        return self.args if isinstance(self.args, Seq2SeqTrainingArguments) else None

    @property
    def predict_with_generate(self) -> bool:
        """Whether evaluation and prediction generate (`args.predict_with_generate`)."""
        generation = self.generation_args
        return generation is not None and generation.predict_with_generate

    # ----- evaluation steps that report their generate calls -----
    @override
    def eval_settings(self) -> EvalSettings:
        """The base settings, with `eval_loss` weighted as HF's `Seq2SeqTrainer` weights it: its `evaluate/predict`
        gather with `accelerator.gather` instead of `gather_for_metrics` (S2S:136, 199), so the loss repeated
        `eval_batch_size` times is never cut to the short last batch: every batch weighs the same (the plain mean of
        the batch means). The base `TransformerModule` counts each batch's samples, as HF's `Trainer`."""
        return dataclasses.replace(super().eval_settings(), eval_loss_repeats=self.args.per_device_eval_batch_size)

    @override
    def eval_forwards_in_lockstep(self, world_size: int) -> bool:
        """As the base module, and also whenever `generate` runs with `synced_gpus` (each decoding step is a
        collective, under DDP too): every rank then makes the same number of `generate` calls."""
        if world_size > 1 and self.generation_is_synced():
            return True
        return super().eval_forwards_in_lockstep(world_size)

    def set_gen_kwargs(self, gen_kwargs: dict[str, Any]) -> None:
        """The kwargs the next evaluation / prediction generates with, set by its caller (`Seq2SeqTrainer`'s
        `evaluate` / `predict`, or a subclass setting `_gen_kwargs`): kept for an evaluation during `train()` too."""
        self.gen_kwargs = gen_kwargs
        self._gen_kwargs_from_caller = True

    @override
    def on_validation_epoch_start(self) -> None:
        """HF's training-time evaluation calls `evaluate()` without kwargs: the args' values apply (and persist),
        unless the evaluation's caller (an overridden `evaluate`) set them."""
        super().on_validation_epoch_start()
        trainer = attached_trainer(self)
        if trainer is not None and trainer.state.fn == "fit" and not self._gen_kwargs_from_caller:
            self.gen_kwargs = resolve_gen_kwargs(self.args)

    @override
    def on_validation_epoch_end(self) -> None:
        """The caller's kwargs were for this evaluation; the next one during `train()` starts from the args'."""
        super().on_validation_epoch_end()
        self._gen_kwargs_from_caller = False

    @override
    def on_predict_epoch_end(self) -> None:
        """As `on_validation_epoch_end`, for a `predict()` run."""
        super().on_predict_epoch_end()
        self._gen_kwargs_from_caller = False

    # ----- generation -----
    def generation_is_synced(self) -> bool:
        """Whether `generate` runs with `synced_gpus` (the same on every process)."""
        if not self.predict_with_generate:
            return False
        return bool(self.gen_kwargs.get("synced_gpus", self._default_synced_gpus()))

    def _default_synced_gpus(self) -> bool:
        """HF's default: True when parameters are sharded (DeepSpeed ZeRO-3, FSDP 1 or 2) on several processes, i.e.
        when forwards are collectives (`parallel/lockstep.py`)."""
        trainer = attached_trainer(self)
        return trainer is not None and needs_lockstep_forwards(trainer.strategy, trainer.world_size, self.model)

    def run_generate(self, generation_inputs: dict[str, Any], gen_kwargs: dict[str, Any]) -> torch.Tensor:
        """`model.generate` with HF's cleaned kwargs (None `num_beams`/`max_length` dropped, `synced_gpus` set)."""
        kwargs = {k: v for k, v in gen_kwargs.items() if not (k in ("num_beams", "max_length") and v is None)}
        kwargs.setdefault("synced_gpus", self._default_synced_gpus())
        if kwargs["synced_gpus"] and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            kwargs["synced_gpus"] = False  # one process: nothing to sync (generate would fail without a group)
        trainer = attached_trainer(self)
        with torch.no_grad(), generation_context(trainer.strategy if trainer is not None else None):
            generated = cast(Any, self.model).generate(**generation_inputs, **kwargs)  # checked by `can_generate`
        config = getattr(self.model, "generation_config", None)
        if config is not None and _is_encoder_decoder(self.model):
            settle_generation_config(config)  # as HF: later generations, and the saved generation_config.json
        elif config is not None and getattr(config, "_from_model_config", False):
            # decoder-only (no HF counterpart): a fixed max_length of 20 would leave no room after a long prompt
            config._from_model_config = False
        return generated

    def pad_token_id(self) -> int:
        """The id used to pad generated tokens: the tokenizer's pad (or EOS), else the model's / generation config's.

        Raises:
            ValueError: no pad or EOS id anywhere.
        """
        tokenizer = self.processing_class
        candidates = [
            getattr(tokenizer, "pad_token_id", None),
            getattr(tokenizer, "eos_token_id", None),
            getattr(getattr(self.model, "config", None), "pad_token_id", None),
            getattr(getattr(self.model, "generation_config", None), "pad_token_id", None),
            getattr(getattr(self.model, "generation_config", None), "eos_token_id", None),
        ]
        for value in candidates:
            if isinstance(value, (list, tuple)):
                value = value[0] if value else None
            if value is not None:
                return int(value)
        raise ValueError(
            "Padding generated tokens needs a pad token id: set `pad_token_id` (or `eos_token_id`) on the "
            "`processing_class` tokenizer or on `model.config`."
        )

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
        **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """HF's `Seq2SeqTrainer.prediction_step`: `(teacher-forced loss, generated ids, labels)`."""
        if not self.predict_with_generate or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        has_labels = inputs.get("labels") is not None  # HF: `"labels" in inputs`; a None value has no loss either
        inputs = self.hooks._prepare_inputs(inputs)
        gen_kwargs = dict(gen_kwargs) if gen_kwargs else dict(self.gen_kwargs)
        encoder_decoder = _is_encoder_decoder(self.model)
        if encoder_decoder:
            generated, labels = self._generate_seq2seq(inputs, gen_kwargs)
        else:
            generated, labels = self._generate_completions(inputs, gen_kwargs)
        width = generation_width(gen_kwargs, getattr(self.model, "generation_config", None), encoder_decoder)
        generated = pad_right(generated, width, self.pad_token_id())
        loss = None
        if has_labels:  # HF's loss here is the model's (or the label smoother's), not `compute_loss` (S2S:349-357)
            with torch.no_grad():
                with self.hooks.compute_loss_context_manager():
                    outputs = model(**inputs)
                if self.label_smoother is not None:
                    loss = self.label_smoother(outputs, inputs["labels"]).detach().mean()
                else:
                    loss = (outputs["loss"] if isinstance(outputs, Mapping) else outputs[0]).detach().mean()
        if self.args.prediction_loss_only:
            return loss, None, None
        return loss, generated, labels

    def _generate_seq2seq(self, inputs: dict[str, Any], gen_kwargs: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        generation_inputs = dict(inputs)
        labels = inputs.get("labels")
        decoder_ids = inputs.get("decoder_input_ids")
        # decoder_input_ids made from the labels by the collator would make `generate` continue them: drop them
        if labels is not None and decoder_ids is not None and labels.shape == decoder_ids.shape:
            generation_inputs.pop("decoder_input_ids")
            generation_inputs.pop("decoder_attention_mask", None)
        generation_inputs.pop("labels", None)
        return self.run_generate(generation_inputs, gen_kwargs), labels

    def _generate_completions(self, inputs: dict[str, Any], gen_kwargs: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        if inputs.get("labels") is not None:
            prompt_ids, prompt_mask, references = split_prompt_completion(
                inputs["input_ids"], inputs.get("attention_mask"), inputs["labels"], self.pad_token_id()
            )
        else:  # prediction on prompts alone: every attended token is prompt, nothing to compare with
            prompt_ids, prompt_mask = left_pad_prompts(inputs["input_ids"], inputs.get("attention_mask"),
                                                       self.pad_token_id())
            references = None
        max_length = gen_kwargs.get("max_length")
        if gen_kwargs.get("max_new_tokens") is None:
            limit = max_length if max_length is not None else generation_width({}, self.model.generation_config, False)
            if limit <= prompt_ids.shape[1]:
                raise ValueError(
                    f"`generation_max_length` (max_length={limit}) must be longer than the prompts: this batch has "
                    f"prompts of {prompt_ids.shape[1]} tokens, leaving no room for a completion. Raise "
                    "`generation_max_length` or pass `max_new_tokens` to evaluate()/predict()."
                )
        generation_inputs = {"input_ids": prompt_ids, "attention_mask": prompt_mask}
        generated = self.run_generate(generation_inputs, gen_kwargs)
        return generated[:, prompt_ids.shape[1]:], references
