"""`TransformerModule`: a LightningModule that trains any `PreTrainedModel` with the HF Trainer's semantics.

One Lightning training batch is one optimizer update (a window of micro-batches from `TransformerDataModule`), so the
module runs the update itself (manual optimisation): per micro-batch HF's `training_step` (loss + backward, gradient
sync only on the last one), then clipping, `optimizer.step()`, `scheduler.step()`, `zero_grad()` - HF's order
(T:1895-1957). Lightning keeps precision (autocast, grad scaler), strategies and device placement.

The HF hooks the update, the evaluation steps and `configure_optimizers` call (`training_step`, `compute_loss`,
`prediction_step`, `create_optimizer`, ...) are called through `hooks`, their one owner, typed by the
`hf_lightning.contracts.HFStepHooks` protocol and chosen once: this module's built-ins (`ModuleStepHooks` over the
methods of `module/hooks.py`, which also explains the token-correct loss normalisation) or an attached
`hf_lightning.Trainer` whose subclass overrides them.

The module implements `hf_lightning.contracts.FlowModule`: `HFTrainerFlow` ends epochs through
`request_epoch_stop`, and evaluation steps return an `EvalStep` that the flow's evaluator accumulates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from transformers.utils import can_return_loss
from typing_extensions import override

from hf_lightning._lightning_compat import attached_trainer, callbacks_of, grad_scaler, optimizer_unscales_itself
from hf_lightning.args import TrainingArguments
from hf_lightning.args.accelerator_config import syncs_each_batch
from hf_lightning.contracts import TrainingStepListener, TrainingStepOutput
from hf_lightning.data.collate import find_label_names
from hf_lightning.model_wrappers import without_compile
from hf_lightning.module.eval_run import EvalAccumulator
from hf_lightning.module.evaluation import EvalRequest, EvalSettings, EvalStep
from hf_lightning.module.hooks import HFHooksModule, WindowContext, current_lr
from hf_lightning.module.loss import label_smoother, loss_shifts_labels, model_accepts_loss_kwargs
from hf_lightning.module.micro_batching import AgreedEval, MicroBatchGuard
from hf_lightning.parallel.lockstep import needs_lockstep_forwards
from hf_lightning.parallel.runtime import (
    any_process_failed,
    check_micro_batch_strategy,
    check_update_strategy,
    clip_by_strategy,
    configure_model_for_strategy,
    deepspeed_step_report,
    failure_agreement,
    hold_gradient_sync,
    micro_batch_context,
    reduce_gradients,
    reset_sharded_state,
    step_model,
    steps_like_a_scheduler,
)
from hf_lightning.run_options.activation_checkpointing import enable_activation_checkpointing
from hf_lightning.run_options.device_cache import should_empty_cache
from hf_lightning.run_options.torch_compile import model_to_call

if TYPE_CHECKING:
    from hf_lightning.parallel.oom_agreement import FailureAgreement

__all__ = ["TransformerModule"]


def _unsplit_generation_step(step: Callable[[dict[str, Any]], EvalStep], batch: Mapping[str, Any]) -> EvalStep:
    """An evaluation batch that generates with `synced_gpus` on several processes, whole: `auto_micro_batch` does
    not retry it (generate's per-token all-reduce has no agreement before it, so a process out of memory mid-generate
    could not leave it); an out-of-memory error stops the run, naming why.

    Raises:
        torch.OutOfMemoryError: the batch ran out of memory.
    """
    try:
        return step(dict(batch))
    except torch.OutOfMemoryError as error:
        raise torch.OutOfMemoryError(
            f"auto_micro_batch: out of memory in an evaluation that generates with synced_gpus on several processes "
            f"({error}); such batches are not retried (generate's own all-reduce at each token cannot be agreed "
            "first). Lower per_device_eval_batch_size.") from error

_LOSS_INPUT_HOOKS = frozenset({
    "compute_loss", "training_step", "_get_num_items_in_batch", "_prepare_inputs", "_prepare_input",
    "_prepare_context_parallel_inputs",
})
"""Overrides that may change a micro-batch's loss or its labels: the one-micro-batch shortcut is not taken then."""

StepEvent = Literal["on_substep_end", "on_pre_optimizer_step", "on_optimizer_step"]


class TransformerModule(HFHooksModule):
    """Wraps a `transformers.PreTrainedModel` (or an `nn.Module` returning a loss) for Lightning, HF-style.

    Override `compute_loss`, `prediction_step` (and the other HF hooks of `module.hooks.HFHooksModule`; HF's
    `training_step` is `hf_training_step` here) exactly as in a `transformers.Trainer` subclass; `self.model`,
    `self.args`, `self.label_smoother`, `self.label_names`, `self.compute_loss_func`, `self.optimizer`,
    `self.lr_scheduler` and `self.model_accepts_loss_kwargs` exist as they do there.

    Args:
        model: the model to train.
        args: training arguments (optimizer, schedule, accumulation, clipping, label smoothing).
        optimizers: a user `(optimizer, scheduler)` pair; a None scheduler gets HF's for the optimizer.
        optimizer_cls_and_kwargs: HF's `(optimizer class, kwargs)` replacing `args.optim` (HF's parameter groups).
        compute_loss_func: `fn(outputs, labels, num_items_in_batch=...)` replacing the model's loss.
        compute_metrics: `fn(EvalPrediction) -> dict` called at the end of each evaluation, or a torchmetrics
            `Metric` / `MetricCollection` updated per batch (see `hf_lightning.module.metrics`).
        preprocess_logits_for_metrics: `fn(logits, labels) -> tensor` applied per eval batch.
        processing_class: the tokenizer / processor (saved with checkpoints).

    Attributes:
        loss_is_scaled_for_ga: as HF's class attribute; None lets the module decide (see `loss_is_scaled`).
        eval_loss_weighting: "samples" (HF's `eval_loss`: sample-weighted mean of batch means) or "tokens" (the
            mean over every label token of the eval set, independent of batching; see README).
    """

    loss_is_scaled_for_ga: bool | None = None
    eval_loss_weighting: str = "samples"  # "tokens": eval_loss over every label token (see EvalAccumulator.finish)

    def __init__(
        self,
        model: nn.Module,
        args: TrainingArguments | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        compute_loss_func: Callable[..., torch.Tensor] | None = None,
        compute_metrics: Callable[..., dict] | None = None,
        preprocess_logits_for_metrics: Callable[..., torch.Tensor] | None = None,
        processing_class: Any = None,
        optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module (a PreTrainedModel), got {type(model).__name__}.")
        self.automatic_optimization = False
        self.args = args if args is not None else TrainingArguments()
        self.model = without_compile(model)  # what is saved, loaded and inspected (HF's `Trainer.model`)
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.processing_class = processing_class
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self._micro_index = 0
        self._step_skipped = False
        self.model_accepts_loss_kwargs = model_accepts_loss_kwargs(model)
        self.shift_labels = loss_shifts_labels(model)
        """Whether the model's loss predicts `labels[..., 1:]` (label tokens are counted accordingly)."""
        self.label_names = self.args.label_names if self.args.label_names is not None else find_label_names(model)
        self.can_return_loss = bool(can_return_loss(type(without_compile(model))))  # HF's, T:533
        self.label_smoother = label_smoother(self.model, self.args.label_smoothing_factor)
        config = getattr(model, "config", None)  # any nn.Module is accepted; only HF models have a config
        if config is not None and hasattr(config, "use_cache"):
            config.use_cache = self.args.use_cache  # HF 5 forces args.use_cache onto the config (T:645-646)
        enable_activation_checkpointing(self.model, self.args)
        # HF's `model_wrapped` (see the property), kept out of the registered modules: it shares `model`'s parameters
        self.__dict__["_compiled"] = model_to_call(model, self.args)
        self._epoch_stop_requested = False
        self._grad_norm: torch.Tensor | None = None
        self._trainable: list[nn.Parameter] | None = None
        self._step_listeners: list[TrainingStepListener] = []
        self._eval_request = EvalRequest()
        self._micro_batch_guard: MicroBatchGuard | None = None
        self._agreement: tuple[nn.Module, FailureAgreement | None] | None = None
        self._sync_held = False

    @override
    def forward(self, **inputs: Any) -> Any:
        """Calls the wrapped model."""
        return self.model_wrapped(**inputs)

    @property
    def model_wrapped(self) -> nn.Module:
        """HF's `model_wrapped`, what the steps call: the compiled model when compiling, else `model`."""
        compiled = self.__dict__.get("_compiled")
        return compiled if compiled is not None and without_compile(compiled) is self.model else self.model

    @property
    def micro_batches_in_update(self) -> int:
        """The micro-batches of the update running now (the last update of an epoch may have fewer)."""
        return self._window.size

    @property
    def is_last_micro_batch(self) -> bool:
        """Whether the micro-batch running now is the last of its update (gradients are synchronised after it)."""
        return self._micro_index == self._window.size - 1

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (the AMP grad scaler or DeepSpeed found inf / NaN)."""
        return self._step_skipped

    def _normalisation(self, window: list[Mapping[str, Any]], micro_batches: int | None = None
                       ) -> tuple[torch.Tensor | None, WindowContext]:
        """`(num_items_in_batch, the update's WindowContext)`: the window's label tokens and whether the loss is
        already normalised over the window; `micro_batches`: the micro-batches the update runs (more than the
        window's when `auto_micro_batch` cuts them, `module/micro_batching.py`)."""
        micro_batches = len(window) if micro_batches is None else micro_batches
        empty_cache = should_empty_cache(self.trainer.global_step, self.args.torch_empty_cache_steps)
        if micro_batches == 1 and self._plain_model_loss and self.trainer.world_size == 1:
            # One micro-batch on one process: the token-weighted window mean is the model's own mean loss, so
            # skip the count and the rescale (they cost a few kernels per update on small models).
            return None, WindowContext(1, True, empty_cache)
        num_items = self.hooks._get_num_items_in_batch(window, self.device)
        return num_items, WindowContext(micro_batches, self.loss_is_scaled(num_items), empty_cache)

    @property
    def micro_batch_guard(self) -> MicroBatchGuard | None:
        """The `auto_micro_batch` retries and sizes found (`module/micro_batching.py`), None when it is off."""
        if not self.args.auto_micro_batch:
            return None
        if self._micro_batch_guard is None:
            self._micro_batch_guard = MicroBatchGuard(self.args)
        return self._micro_batch_guard

    def _failure_agreement(self) -> FailureAgreement | None:
        """Under FSDP2 on several processes: the agreement before each of FSDP's collectives, installed on the
        sharded model at its first guarded step (`parallel/oom_agreement.py`); None elsewhere."""
        trainer = attached_trainer(self)
        if trainer is None:
            return None
        if self._agreement is None or self._agreement[0] is not self.model:
            self._agreement = (self.model, failure_agreement(trainer.strategy, self.model))
        return self._agreement[1]

    def _generates_in_lockstep(self) -> bool:
        """Whether evaluation's `generate` runs with `synced_gpus` (a collective per decoding step, which no
        agreement precedes); `Seq2SeqTransformerModule` answers, other modules do not generate."""
        synced = getattr(self, "generation_is_synced", None)
        return bool(synced()) if callable(synced) else False

    def _drop_failed_try(self) -> None:
        """After a try that failed on some process: FSDP2's iteration state reset, the try's gradients dropped."""
        reset_sharded_state(self.model, drop_grads=True)

    def end_guarded_update(self) -> None:
        """Give DDP its gradient sync back after an `auto_micro_batch` update (its forward has returned)."""
        if self._sync_held:
            hold_gradient_sync(self.trainer.strategy, False)
            self._sync_held = False

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.end_guarded_update()  # done already by `MicroBatchRecord` when the facade added it

    @override
    def training_step(self, batch: Any, batch_idx: int) -> TrainingStepOutput:
        """One optimizer update over a window of micro-batches: HF's `training_step` per micro-batch, then the step.

        Returns the update's loss, each micro-batch's loss (so the flow applies HF's `logging_nan_inf_filter` per
        micro-batch), the gradient norm before clipping, the learning rate the update used, and the window's
        label-token count when it was computed (for the warning about updates without a label token).
        """
        window = [batch] if isinstance(batch, Mapping) else list(batch)
        guard = self.micro_batch_guard
        micro_batches = window if guard is None else guard.pieces(window)
        num_items, self._window = self._normalisation(window, len(micro_batches))
        optimizer = self.optimizers()
        if isinstance(optimizer, list):
            raise TypeError(f"TransformerModule steps one optimizer; configure_optimizers returned {len(optimizer)}.")
        micro_losses: list[torch.Tensor] = []
        strategy = self.trainer.strategy
        self._grad_norm = None
        hooks = self.hooks
        model = step_model(strategy, self.model_wrapped)  # FSDP1: each micro-batch a forward of the FSDP root
        sync_each = syncs_each_batch(self.args)

        def run(micro_batches: Sequence[Mapping[str, Any]], sync_last: bool = True) -> None:
            micro_losses.clear()  # a closure is called once, but an optimizer may call it again (LBFGS)
            for i, micro in enumerate(micro_batches):
                last = i == len(micro_batches) - 1
                self._micro_index = i
                # Gradients are all-reduced once per update: no sync on every micro-batch but the last (every one
                # with HF's `sync_each_batch`; `sync_last` False: auto_micro_batch reduces after its agreement)
                with micro_batch_context(strategy, last and sync_last, sync_each):
                    # a copy of a dict micro-batch (an override may pop from it); any other one (TRL's GRPO: the
                    # rows of a generation batch) as the collator made it, as HF passes it
                    loss = hooks.training_step(model, dict(micro) if isinstance(micro, Mapping) else micro,
                                               num_items)
                # HF logs what `training_step` returns (with a process-global count: the share times the world
                # size, averaged over processes at log time, which is the global mean)
                micro_losses.append(torch.as_tensor(loss).detach().reshape(()))
                if not last:
                    self._step_event("on_substep_end")

        def try_update(pieces: list[dict[str, Any]]) -> None:
            nonlocal num_items
            if len(pieces) != self._window.size:  # a retry with smaller pieces: the window's count is kept
                if num_items is None and self.trainer.world_size == 1:  # the one-micro-batch shortcut was taken
                    num_items, self._window = self._normalisation(window, len(pieces))
                else:
                    self._window = dataclasses.replace(self._window, size=len(pieces))
            run(pieces, sync_last=False)  # DDP's reduction is held: see MicroBatchGuard

        @torch.enable_grad()  # optimizers that step under `no_grad` call it there (transformers' Adafactor)
        def closure() -> None:
            if guard is None:
                run(window)
                return
            params = self._trainable_params()
            agreement = self._failure_agreement()
            guard.run_update(
                window, try_update, zero_grads=self._drop_failed_try,
                any_failed=lambda failed: any_process_failed(strategy, failed, agreement),
                reduce=lambda: reduce_gradients(strategy, params), is_global_zero=self.trainer.is_global_zero,
                step=self.trainer.global_step + 1)

        if guard is not None:
            hold_gradient_sync(strategy, True)  # given back once DDP's forward has returned (end_guarded_update)
            self._sync_held = True

        scaler = grad_scaler(self.trainer)
        scale_before = scaler.get_scale() if scaler is not None else None
        optimizer.step(closure=closure)
        self._step_event("on_optimizer_step")
        scheduler = self.lr_schedulers()
        if "_get_learning_rate" in self.overrides():
            learning_rate = float(hooks._get_learning_rate())  # HF reads it here, before the scheduler steps
        else:
            learning_rate = current_lr(optimizer, scheduler)
        skipped = scaler is not None and scaler.get_scale() < scale_before
        engine_report = deepspeed_step_report(strategy)  # DeepSpeed clips and skips inside its step
        if engine_report is not None:
            self._grad_norm, skipped = engine_report  # type: ignore[assignment]  # a float or a tensor
        self._step_skipped = skipped
        # a plateau scheduler is stepped after evaluations, on the eval metric (checkpoint/best.py)
        if steps_like_a_scheduler(scheduler) and not skipped:
            scheduler.step()  # type: ignore[union-attr]  # checked by steps_like_a_scheduler
        optimizer.zero_grad()
        stacked = torch.stack(micro_losses)
        return {"loss": stacked.sum(), "micro_losses": stacked, "grad_norm": self._grad_norm,
                "learning_rate": learning_rate, "label_tokens": num_items}

    @override
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip (after AMP unscaling) and keep the pre-clip norm for logging; then HF's `on_pre_optimizer_step`."""
        scaler = grad_scaler(self.trainer)
        # Lightning unscales before this hook, except for optimizers that unscale inside step(); clipping needs
        # true gradients now
        if scaler is not None and optimizer_unscales_itself(optimizer):
            scaler.unscale_(optimizer)
        handled, norm = clip_by_strategy(self.trainer.strategy, self.args.max_grad_norm)  # FSDP1, DeepSpeed
        if handled:
            self._grad_norm = norm
        elif self.args.max_grad_norm is not None and self.args.max_grad_norm > 0:
            # `clip_grad_norm_` itself skips parameters without a gradient
            self._grad_norm = torch.nn.utils.clip_grad_norm_(self._trainable_params(), self.args.max_grad_norm)
        else:
            grads = [p.grad for p in self._trainable_params() if p.grad is not None]
            if grads:
                self._grad_norm = torch.nn.utils.get_total_norm(grads)
        self._step_event("on_pre_optimizer_step")

    def _trainable_params(self) -> list[nn.Parameter]:
        """The parameters that can get a gradient, listed once per fit (walking the module tree costs per update)."""
        if self._trainable is None:
            self._trainable = [p for p in self.model.parameters() if p.requires_grad]
        return self._trainable

    @property
    def _plain_model_loss(self) -> bool:
        """Whether the loss is the built-in one taking the model's own loss (no override, smoother, loss function)."""
        return (
            not self.overrides() & _LOSS_INPUT_HOOKS
            and self.compute_loss_func is None
            and self.label_smoother is None
        )

    def _step_event(self, name: StepEvent) -> None:
        """Tell the trainer's `TrainingStepListener` callbacks (the flow) about an HF event inside the update."""
        trainer = attached_trainer(self)
        if trainer is None:
            return
        for listener in self._step_listeners:
            getattr(listener, name)(trainer, self)  # one of the three methods of the protocol, by its `StepEvent` name

    def request_epoch_stop(self) -> None:
        """End the current epoch before the next batch (an HF `control.should_epoch_stop`; see `FlowModule`)."""
        self._epoch_stop_requested = True

    @override
    def on_train_epoch_start(self) -> None:
        self._epoch_stop_requested = False

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        """Honour `request_epoch_stop`: returning -1 makes Lightning end the epoch here."""
        if self._epoch_stop_requested:
            self._epoch_stop_requested = False
            return -1
        return None

    @override
    def configure_model(self) -> None:
        """Under a `ModelParallelStrategy` (e.g. from HF's `fsdp`): FSDP2 sharding per layer, then the root
        (`parallel/runtime.py`). Call `super().configure_model()` when overriding it for something else."""
        configure_model_for_strategy(self, self.model)

    @override
    def on_fit_start(self) -> None:
        """`from_pretrained` returns a model in eval mode; HF trains with dropout on, so do we. Here rather than in
        `on_train_start`: Lightning warns about modules in eval mode between the two hooks.

        Raises:
            ValueError: a strategy that cannot run one update per `training_step` (`check_update_strategy`).
        """
        check_update_strategy(self.trainer.strategy)
        if self.args.auto_micro_batch:
            check_micro_batch_strategy(self.trainer.strategy)
        self.model.train()

    @override
    def on_train_start(self) -> None:
        """Per fit: trainable parameters are found again, and the trainer's `TrainingStepListener`s."""
        self._trainable = None  # parameters may have been frozen or replaced since the last fit
        self._step_listeners = [cb for cb in callbacks_of(self.trainer) if isinstance(cb, TrainingStepListener)]

    @override
    def configure_optimizers(self) -> Any:
        """HF's `create_optimizer()` then `create_scheduler(num_training_steps=max_steps)` (T:1715-1778) through
        `hooks`; the scheduler steps once per update.

        A scheduler this module created for an earlier fit is replaced (HF's `_created_lr_scheduler`); an overridden
        `create_optimizer_and_scheduler` is called instead of the two (HF 5's `train()` never calls it; see README).

        Raises:
            ValueError: no step budget, or no optimizer after `create_optimizer`.
        """
        max_steps = self.trainer.max_steps
        if max_steps is None or max_steps <= 0:
            raise ValueError(
                "TransformerModule needs the total number of updates: use `hf_lightning.Trainer`, add the "
                f"`HFTrainerFlow` callback, or set `max_steps` (got trainer.max_steps={max_steps})."
            )
        if self._created_lr_scheduler:
            self.lr_scheduler, self._created_lr_scheduler = None, False
        hooks = self.hooks
        if "create_optimizer_and_scheduler" in self.overrides():
            hooks.create_optimizer_and_scheduler(max_steps)
        else:
            created = hooks.create_optimizer()
            if self.optimizer is None:  # an override that returned its optimizer without setting `self.optimizer`
                self.optimizer = created
            hooks.create_scheduler(num_training_steps=max_steps)
        if self.optimizer is None:
            raise ValueError("`create_optimizer` left `optimizer` None: set `self.optimizer` (and return it), as "
                             "transformers.Trainer.create_optimizer does.")
        if self.lr_scheduler is None:
            raise ValueError("`create_scheduler` left `lr_scheduler` None: set `self.lr_scheduler` (and return it), "
                             "as transformers.Trainer.create_scheduler does.")
        return {"optimizer": self.optimizer, "lr_scheduler": {"scheduler": self.lr_scheduler, "interval": "step"}}

    # ----- evaluation and prediction (driven by HFTrainerFlow's evaluator) -----
    def eval_settings(self) -> EvalSettings:
        """What the evaluation accumulators need from this module."""
        return EvalSettings(
            args=self.args, compute_metrics=self.compute_metrics,
            preprocess_logits_for_metrics=self.preprocess_logits_for_metrics, label_names=list(self.label_names),
            shift_labels=self.shift_labels, main_input_name=getattr(self.model, "main_input_name", "input_ids"),
            eval_loss_weighting=self.eval_loss_weighting,
        )

    def prediction_loss_only(self, is_prediction: bool) -> bool:
        """HF's rule: `predict` keeps logits unless `args.prediction_loss_only`; `evaluate` also without metrics; an
        `evaluation_loop` call's own `prediction_loss_only` wins."""
        if self._eval_request.prediction_loss_only is not None:
            return self._eval_request.prediction_loss_only
        return bool(self.args.prediction_loss_only) or (not is_prediction and self.compute_metrics is None)

    def start_eval_run(self, request: EvalRequest) -> None:
        """The run's `ignore_keys` apply to the following evaluation / prediction steps (see `FlowModule`)."""
        self._eval_request = request

    def new_eval_accumulator(self, is_prediction: bool, world_size: int, loader: Any) -> EvalAccumulator:
        """A fresh accumulator for one dataset of an evaluation / prediction run (see `FlowModule`); it runs padding
        steps on a short shard when `eval_forwards_in_lockstep` (see `module/eval_run.py`)."""
        pad_step = self.padding_step(is_prediction) if self.eval_forwards_in_lockstep(world_size) else None
        settings = self.eval_settings()
        per_batch = self._eval_request.loss_per_batch
        if per_batch is not None:  # the caller's gathering decides, as HF's `gather_function` (EvalRequest)
            settings = dataclasses.replace(
                settings, eval_loss_repeats=self.args.per_device_eval_batch_size if per_batch else None)
        return EvalAccumulator(settings, self.prediction_loss_only(is_prediction), is_prediction,
                               world_size, self.device, loader=loader, pad_step=pad_step)

    def eval_forwards_in_lockstep(self, world_size: int) -> bool:
        """Whether every rank must run as many evaluation steps: each forward is a collective under FSDP1, FSDP2 and
        ZeRO-3 (`parallel/lockstep.py`)."""
        trainer = attached_trainer(self)
        return trainer is not None and needs_lockstep_forwards(trainer.strategy, world_size, self.model)

    def padding_step(self, is_prediction: bool) -> Callable[[dict[str, Any]], object]:
        """One evaluation step whose outputs are dropped, run as Lightning runs the real ones: through the strategy
        (its precision context, and the FSDP1 root's or DeepSpeed engine's forward), so its collectives are the same."""
        strategy = self.trainer.strategy

        def step(batch: dict[str, Any]) -> object:
            return strategy.predict_step(batch, 0) if is_prediction else strategy.validation_step(batch, 0)

        return step

    def _eval_step(self, batch: Mapping[str, Any], is_prediction: bool) -> EvalStep:
        self._window = WindowContext()
        loss_only = self.prediction_loss_only(is_prediction)
        model, ignore_keys = self.model_wrapped, self._eval_request.ignore_keys

        def step(inputs: Any) -> EvalStep:
            return EvalStep(*self.hooks.prediction_step(model, inputs, loss_only, ignore_keys))

        guard = self.micro_batch_guard
        if guard is None or not isinstance(batch, Mapping):
            # a copy of a dict batch (an override may pop from it); any other one (TRL's GRPO: the rows of a
            # generation batch) as the collator made it, as HF passes it (auto_micro_batch cuts dict batches only)
            return step(dict(batch) if isinstance(batch, Mapping) else batch)
        trainer = attached_trainer(self)
        if trainer is not None and trainer.world_size > 1 and self._generates_in_lockstep():
            return _unsplit_generation_step(step, batch)
        agreement = self._failure_agreement()
        if agreement is None:  # no collective inside an evaluation batch: each process finds its own size
            return guard.run_eval(batch, step, self.shift_labels, trainer is None or trainer.is_global_zero)
        agreed = AgreedEval(agreement.any_failed, lambda: reset_sharded_state(self.model, drop_grads=False))
        return guard.run_eval(batch, step, self.shift_labels, trainer is None or trainer.is_global_zero, agreed)

    @override
    def validation_step(  # type: ignore[override]  # Lightning types step outputs as tensors / mappings
        self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0
    ) -> EvalStep:
        """HF evaluation of one batch: `prediction_step`'s `(loss, logits, labels)`, accumulated by the flow."""
        return self._eval_step(batch, is_prediction=False)

    @override
    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> EvalStep:
        """HF prediction of one batch: like evaluation, with `args.prediction_loss_only` (default False)."""
        return self._eval_step(batch, is_prediction=True)
