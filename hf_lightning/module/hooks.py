"""The HF Trainer's overridable step hooks, with the `transformers.Trainer` signatures: the built-in behaviour.

`TransformerModule` calls every hook of an update and of an evaluation step through one owner,
`TransformerModule.hooks` (HF's call order, T:2051-2128, T:3193-3300):

    training_step(model, inputs, num_items_in_batch)                  once per micro-batch
        _prepare_context_parallel_inputs -> _prepare_inputs (-> _prepare_input)
        compute_loss_context_manager (-> autocast_smart_context_manager) -> compute_loss
        backward (inside training_step, as HF's), returns the detached loss
    _get_num_items_in_batch(window, device)                          once per update
    prediction_step(model, inputs, prediction_loss_only, ignore_keys) once per eval / predict batch
        _prepare_inputs -> _get_num_items_in_batch -> compute_loss_context_manager -> compute_loss
    create_optimizer_and_scheduler -> create_optimizer (-> get_decay_parameter_names,
        get_optimizer_cls_and_kwargs) -> create_scheduler                                  once per fit

The owner (`TransformerModule.hooks`, typed by `hf_lightning.contracts.HFStepHooks`, chosen once) is the module's
`ModuleStepHooks` (these built-ins under HF's names, or a `TransformerModule` subclass's overrides) or an attached
`hf_lightning.Trainer`, whose subclass may override any of them; the Trainer's own methods call these built-ins, so
`super().compute_loss(...)` in a subclass reaches this code.

Loss normalisation (README "Gradient accumulation"): with the built-in `compute_loss` and `training_step`, every
micro-batch loss is its share of the window's token-weighted mean, for every model (`mean * tokens / window_tokens`;
HF skips this for models that take `**kwargs` but ignore `num_items_in_batch`). As soon as a user override of
`compute_loss` or `training_step` is in force, HF's rule applies instead (T:2110-2119, T:2306-2367), so a loss ported
from a `transformers.Trainer` subclass gives HF's numbers: `num_items_in_batch` is counted only for models that
accept loss kwargs (or with `compute_loss_func`), and a loss not normalised by it is divided by the window length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import nn

from hf_lightning._lightning_compat import attached_trainer
from hf_lightning.args import TrainingArguments
from hf_lightning.contracts import HFStepHooks
from hf_lightning.module.evaluation import hf_prediction_step
from hf_lightning.module.loss import count_label_tokens, is_causal_lm, loss_from_outputs
from hf_lightning.module.optim import (
    build_scheduler,
    keep_embeddings_in_32_bits,
    optimizer_cls_and_kwargs,
    parameter_groups,
)
from hf_lightning.module.optim import decay_parameter_names as default_decay_parameter_names
from hf_lightning.parallel.runtime import steps_like_a_scheduler
from hf_lightning.run_options.device_cache import empty_device_cache

__all__ = ["HFHooksModule", "ModuleStepHooks", "WindowContext"]

LOSS_HOOKS = frozenset({"compute_loss", "training_step"})
"""Overriding either puts HF's normalisation rule in force (see the module docstring)."""
_MODULE_HOOKS = ("compute_loss", "prediction_step", "_get_num_items_in_batch", "create_optimizer_and_scheduler")
"""Hooks whose override on a `TransformerModule` subclass changes what the module does (HF's `training_step` is
`hf_training_step` there)."""


@dataclass(frozen=True)
class WindowContext:
    """The update being run: what `training_step` needs to normalise one micro-batch's loss as HF does.

    Attributes:
        size: the micro-batches of the update (HF's `current_gradient_accumulation_steps`).
        scaled: whether `compute_loss` already normalises over the window (else the loss is divided by `size`).
        empty_cache: `torch_empty_cache_steps` says this update empties the device cache (after each forward pass).
    """

    size: int = 1
    scaled: bool = True
    empty_cache: bool = False


def current_lr(optimizer: torch.optim.Optimizer | LightningOptimizer, scheduler: Any) -> float:
    """The LR the update just used (HF reads it after `optimizer.step()`, before `scheduler.step()`): the scheduler's
    last LR, or the optimizer's first group's for a plateau scheduler (it has none)."""
    if steps_like_a_scheduler(scheduler):
        return float(scheduler.get_last_lr()[0])
    return float(optimizer.param_groups[0]["lr"])


class HFHooksModule(pl.LightningModule):
    """The built-in HF hooks of `TransformerModule` (its base class): HF's signatures and semantics, and their owner.

    `hf_training_step` is HF's `training_step` (Lightning owns the name `training_step` for the whole update). The
    methods stay on the module because a `TransformerModule` subclass overrides them as a `transformers.Trainer`
    subclass would (README, the Lightning-native path); `hooks` is the one object the steps call them through.
    """

    model: nn.Module
    args: TrainingArguments
    compute_loss_func: Callable[..., torch.Tensor] | None
    label_smoother: Callable[..., torch.Tensor] | None
    label_names: list[str]
    can_return_loss: bool
    """HF's `can_return_loss`: evaluation computes the loss of a batch without labels (see `hf_prediction_step`)."""
    shift_labels: bool
    model_accepts_loss_kwargs: bool
    loss_is_scaled_for_ga: bool | None
    optimizer: torch.optim.Optimizer | None
    """HF's `Trainer.optimizer`: None until `create_optimizer` (or the user's `optimizers` pair)."""
    lr_scheduler: Any  # any scheduler-like object a user pair or `create_scheduler` override gives (HF's `Any` too)
    """HF's `Trainer.lr_scheduler`: None until `create_scheduler` (or the user's `optimizers` pair)."""
    optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None

    def __init__(self) -> None:
        super().__init__()
        self._builtin_hooks = ModuleStepHooks(self)
        self.hooks: HFStepHooks = self._builtin_hooks
        """The owner of the HF hooks the steps call: this module's built-ins (`ModuleStepHooks`), or the
        `hf_lightning.Trainer` attached by `attach_hooks`."""
        self._owner_overrides: frozenset[str] = frozenset()
        self._overrides: frozenset[str] | None = None
        self._created_lr_scheduler = False
        self._window = WindowContext()

    # ----- the owner -----
    def attach_hooks(self, owner: HFStepHooks, overridden: frozenset[str] = frozenset()) -> None:
        """Route every hook through `owner` (an object with the `transformers.Trainer` hook methods).

        Args:
            owner: the `hf_lightning.Trainer` whose (possibly overridden) methods the steps call.
            overridden: the hook names the owner's class overrides (they decide the loss normalisation rule).
        """
        self.hooks = owner
        self._owner_overrides = frozenset(overridden)
        self._overrides = None

    def __getstate__(self) -> dict[str, Any]:
        """A pickled or deep-copied module (e.g. by an EMA callback) is its own hook owner: the trainer stays out."""
        state = super().__getstate__()
        state["hooks"] = state["_builtin_hooks"]
        return state

    def overrides(self) -> frozenset[str]:
        """The hook names overridden by the owner's class or by a `TransformerModule` subclass (computed once)."""
        if self._overrides is None:
            own = {name for name in _MODULE_HOOKS
                   if getattr(type(self), name, None) is not getattr(HFHooksModule, name, None)}
            if type(self).hf_training_step is not HFHooksModule.hf_training_step:
                own.add("training_step")
            self._overrides = frozenset(own) | self._owner_overrides
        return self._overrides

    @property
    def hf_loss_rule(self) -> bool:
        """Whether HF's loss normalisation rule is in force (a user `compute_loss` / `training_step`)."""
        return bool(self.overrides() & LOSS_HOOKS)

    def _is_training(self) -> bool:
        trainer = attached_trainer(self)
        return trainer is not None and bool(trainer.training)

    def _world_size(self) -> int:
        trainer = attached_trainer(self)
        return trainer.world_size if trainer is not None else 1

    # ----- the loss -----
    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """HF's `Trainer.compute_loss` (T:2130-2217): the model's loss, `compute_loss_func`'s or the label smoother's.

        With `num_items_in_batch` (the label tokens of the whole window) the loss is this micro-batch's share of the
        window's token-weighted mean; counted over every process, it is multiplied by the number of processes (HF's
        `average_tokens_across_devices`), so the gradients averaged by DDP are the global token mean's.
        """
        counted = num_items_in_batch is not None and (
            not self.hf_loss_rule or self.model_accepts_loss_kwargs or self.compute_loss_func is not None
        )
        labels = None
        if (self.label_smoother is not None or self.compute_loss_func is not None) and "labels" in inputs:
            labels = inputs.pop("labels")
        outputs = model(**inputs)
        if self.compute_loss_func is not None:
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        elif labels is not None and self.label_smoother is not None:
            loss = self.label_smoother(
                outputs, labels, shift_labels=is_causal_lm(model), num_items_in_batch=num_items_in_batch
            )
        else:
            loss = loss_from_outputs(outputs, inputs)
            if counted:
                assert num_items_in_batch is not None  # `counted` says so
                loss = self._token_share(loss, inputs, num_items_in_batch)
        if counted and self.args.average_tokens_across_devices and self._world_size() > 1 and self._is_training():
            loss = loss * self._world_size()  # T:2207-2215: the count is global, DDP averages the gradients
        return (loss, outputs) if return_outputs else loss

    def _token_share(self, loss: torch.Tensor, inputs: Mapping[str, Any], num_items: torch.Tensor | int
                     ) -> torch.Tensor:
        """`mean_loss * tokens / num_items`: the micro-batch's part of the window's token-weighted mean."""
        tokens = count_label_tokens(inputs, self.shift_labels)
        if tokens is None:
            return loss
        share = tokens.to(loss.dtype) / torch.as_tensor(num_items, device=loss.device)
        # A micro-batch without label tokens has a NaN mean loss (0/0) in most models; its share of the window is
        # 0 (HF's sum/N gives 0). `where` keeps the NaN out of the value and the gradients.
        return torch.where(tokens > 0, loss * share, torch.zeros_like(loss))

    def _get_num_items_in_batch(self, batch_samples: list[Any], device: torch.device | None) -> torch.Tensor | None:
        """HF's `num_items_in_batch` of a window (T:2306-2367): its label tokens (over `labels[..., 1:]` for
        causal-LM losses, or `shift_labels`), summed over processes with `average_tokens_across_devices` in training.

        The built-in loss counts for every model; under HF's rule only models that accept loss kwargs (or with
        `compute_loss_func`) get a count, as in HF.
        """
        if not batch_samples:
            return None
        if self.hf_loss_rule and (
            "labels" not in batch_samples[0] or not (self.model_accepts_loss_kwargs or self.compute_loss_func)
        ):
            return None
        counts = [count_label_tokens(micro, self.shift_labels) for micro in batch_samples]
        if any(count is None for count in counts):
            return None
        total = torch.stack([c for c in counts if c is not None]).sum()
        trainer = attached_trainer(self)
        if self.args.average_tokens_across_devices and trainer is not None and trainer.world_size > 1 \
                and trainer.training:
            total = trainer.strategy.reduce(total, reduce_op="sum")
        return total.to(device) if device is not None else total

    def hf_training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        """HF's `Trainer.training_step` for one micro-batch (T:2051-2128): loss, normalisation, backward.

        Returns:
            The detached loss, as HF's `training_step` returns it (what the logged loss sums).
        """
        # HF puts the model in train mode at every micro-batch: a callback or a save may have switched it to eval
        model.train()
        hooks = self.hooks
        cp_context, inputs = hooks._prepare_context_parallel_inputs(model, inputs)
        with cp_context():
            inputs = hooks._prepare_inputs(inputs)
            with hooks.compute_loss_context_manager():
                # without `return_outputs`, HF's contract is the loss tensor alone
                loss = cast(torch.Tensor, hooks.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch))
            # HF: after the forward pass, before the backward pass (run_options/device_cache.py)
            if self._window.empty_cache:
                empty_device_cache()
            if not self._window.scaled:
                loss = loss / self._window.size
            self.manual_backward(loss)
        return loss.detach()

    def loss_is_scaled(self, num_items: torch.Tensor | int | None) -> bool:
        """Whether a micro-batch loss is already normalised over the window (else divided by its length).

        The built-in loss always is when it gets a token count; under HF's rule (T:2110-2119) when the model takes
        loss kwargs and got a count, or with `compute_loss_func`. The owner's `loss_is_scaled_for_ga` decides first.
        """
        forced = self.hooks.loss_is_scaled_for_ga  # the Trainer's class attribute, or this module's
        forced = forced if forced is not None else self.loss_is_scaled_for_ga
        if forced is not None:
            return bool(forced)
        if self.compute_loss_func is not None:
            return True
        if not self.hf_loss_rule:
            return num_items is not None
        return self.model_accepts_loss_kwargs and num_items is not None

    def current_learning_rate(self) -> float:
        """HF's `_get_learning_rate`: the scheduler's last LR (a plateau scheduler: the optimizer's).

        Raises:
            ValueError: there is no optimizer yet (HF's words).
        """
        if self.optimizer is None:
            raise ValueError("Trainer optimizer is None, please make sure you have setup the optimizer before.")
        return current_lr(self.optimizer, self.lr_scheduler)

    # ----- inputs and contexts -----
    def compute_loss_context_manager(self) -> contextlib.ExitStack:
        """HF's context around `compute_loss`: the owner's `autocast_smart_context_manager` when it is not a no-op.

        Lightning's precision plugin already runs the step under autocast, as accelerate does for HF.
        """
        stack = contextlib.ExitStack()
        autocast = self.hooks.autocast_smart_context_manager()
        if not isinstance(autocast, nullcontext):
            stack.enter_context(autocast)
        return stack

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True) -> contextlib.AbstractContextManager:
        """A no-op, as HF's: Lightning's precision plugin does the autocast (HF relies on accelerate for it)."""
        return nullcontext()

    def _prepare_input(self, data: Any) -> Any:
        """HF's `_prepare_input`: tensors (nested in mappings / sequences) moved to the module's device (Lightning
        moved the batch already: a no-op, unless the owner overrides it)."""
        recurse = self.hooks._prepare_input if "_prepare_input" in self.overrides() else self._prepare_input
        if isinstance(data, Mapping):
            mapping_type: Any = type(data)  # the batch's own mapping class (a dict, a `BatchEncoding`...)
            return mapping_type({k: recurse(v) for k, v in data.items()})
        if isinstance(data, (tuple, list)):
            return type(data)(recurse(v) for v in data)
        if isinstance(data, torch.Tensor):
            return data.to(device=self.device)
        return data

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """HF's `_prepare_inputs`: `_prepare_input`, and HF's error for an empty batch.

        Raises:
            ValueError: the batch has no column left.
        """
        prepare = self.hooks._prepare_input if "_prepare_input" in self.overrides() else self._prepare_input
        inputs = prepare(inputs)
        if len(inputs) == 0:
            raise ValueError(
                "The batch received was empty, your model won't be able to train on it. Double-check that your "
                "training dataset contains keys expected by the model."
            )
        return inputs

    def _prepare_context_parallel_inputs(self, model: nn.Module, inputs: dict[str, Any]
                                         ) -> tuple[Callable[[], contextlib.AbstractContextManager], dict[str, Any]]:
        """HF's hook for context parallelism: `(a no-op context, inputs)` (no context parallelism under Lightning)."""
        return nullcontext, inputs

    # ----- evaluation -----
    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """HF's `Trainer.prediction_step` (T:3193-3300): returns `(loss, logits, labels)`."""
        return hf_prediction_step(self.hooks, self.label_names, model, inputs, prediction_loss_only, ignore_keys,
                                  self.device, can_return=self.can_return_loss)

    # ----- optimizer and scheduler -----
    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """HF's `get_decay_parameter_names`: every parameter but biases and normalisation weights."""
        return default_decay_parameter_names(model)

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: TrainingArguments, model: nn.Module | None = None
                                     ) -> tuple[Any, dict[str, Any]]:
        """HF's `get_optimizer_cls_and_kwargs`: the optimizer class and keyword arguments `args.optim` names."""
        return optimizer_cls_and_kwargs(args, model)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """HF's `create_optimizer` (T:1259-1345): HF's two parameter groups, `optimizer_cls_and_kwargs` or `optim`."""
        if self.optimizer is None:
            model = model if model is not None else self.model
            hooks = self.hooks
            decay = hooks.get_decay_parameter_names(model)
            if self.optimizer_cls_and_kwargs is not None:
                cls, kwargs = self.optimizer_cls_and_kwargs
            else:
                cls, kwargs = hooks.get_optimizer_cls_and_kwargs(self.args, model)
            kwargs = dict(kwargs)
            groups: Any = parameter_groups(model, self.args.weight_decay, decay)
            for key in ("params", "model", "optimizer_dict"):  # HF lets these kwargs replace the groups
                if key in kwargs:
                    groups = kwargs.pop(key)
            self.optimizer = cls(groups, **kwargs)
            keep_embeddings_in_32_bits(model, cls, kwargs)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """HF's `create_scheduler` (T:1347-1376): `lr_scheduler_type` over `num_training_steps` updates.

        Raises:
            ValueError: no `optimizer` given and none created (a `create_optimizer` override that set none).
        """
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            if optimizer is None:
                raise ValueError("`create_optimizer` left `optimizer` None: set `self.optimizer` (and return it), as "
                                 "transformers.Trainer.create_optimizer does.")
            self.lr_scheduler = build_scheduler(optimizer, self.args, num_training_steps)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """HF's `create_optimizer_and_scheduler`: the owner's `create_optimizer`, then its `create_scheduler`."""
        self.hooks.create_optimizer()
        self.hooks.create_scheduler(num_training_steps=num_training_steps)


class ModuleStepHooks:
    """The default HF step hooks (`hf_lightning.contracts.HFStepHooks`): a `TransformerModule`'s own built-ins, or a
    `TransformerModule` subclass's overrides, under HF's names (HF's `training_step` is the module's
    `hf_training_step`, Lightning owning the name `training_step` for the whole update).

    Built once per module; `hf_lightning.Trainer` is the other implementation of the protocol.

    Args:
        module: the module whose built-in (or subclass-overridden) hooks these are.
    """

    def __init__(self, module: HFHooksModule) -> None:
        self._module = module

    @property
    def loss_is_scaled_for_ga(self) -> bool | None:
        return self._module.loss_is_scaled_for_ga

    def training_step(self, model: nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        return self._module.hf_training_step(model, inputs, num_items_in_batch)

    def compute_loss(
        self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        return self._module.compute_loss(model, inputs, return_outputs=return_outputs,
                                         num_items_in_batch=num_items_in_batch)

    def prediction_step(
        self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        return self._module.prediction_step(model, inputs, prediction_loss_only, ignore_keys)

    def compute_loss_context_manager(self) -> contextlib.AbstractContextManager[Any]:
        return self._module.compute_loss_context_manager()

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True
                                       ) -> contextlib.AbstractContextManager[Any]:
        return self._module.autocast_smart_context_manager(cache_enabled)

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return self._module._prepare_inputs(inputs)

    def _prepare_input(self, data: Any) -> Any:
        return self._module._prepare_input(data)

    def _prepare_context_parallel_inputs(
        self, model: nn.Module, inputs: dict[str, Any]
    ) -> tuple[Callable[[], contextlib.AbstractContextManager[Any]], dict[str, Any]]:
        return self._module._prepare_context_parallel_inputs(model, inputs)

    def _get_num_items_in_batch(self, batch_samples: list[Any], device: torch.device | None
                                ) -> torch.Tensor | None:
        return self._module._get_num_items_in_batch(batch_samples, device)

    def _get_learning_rate(self) -> float:
        return self._module.current_learning_rate()

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        return self._module.get_decay_parameter_names(model)

    def get_optimizer_cls_and_kwargs(self, args: TrainingArguments, model: nn.Module | None = None
                                     ) -> tuple[Any, dict[str, Any]]:
        return self._module.get_optimizer_cls_and_kwargs(args, model)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        return self._module.create_optimizer(model)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        return self._module.create_scheduler(num_training_steps, optimizer)

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self._module.create_optimizer_and_scheduler(num_training_steps)
