"""The `transformers.Trainer` step and optimizer hooks of `hf_lightning.Trainer`, and the attributes they read.

`TransformerModule` calls these methods on the trainer (`TransformerModule.hooks`), where and as often as HF's loop
calls them (`module/hooks.py` lists the order). Each base method here calls the module's built-in, so a subclass's
override runs in their place and its `super()` call reaches the built-in behaviour; no behaviour lives here.

The attributes pasted override bodies read (`self.optimizer`, `self.lr_scheduler`, `self.model_accepts_loss_kwargs`,
`self.label_smoother`, `self.label_names`, `self.compute_loss_func`, `self.current_gradient_accumulation_steps`,
`self.can_return_loss`, ...) are the module's, read and written through. `model_accepts_loss_kwargs`, `label_names` and
`can_return_loss` are computed once from the model, as HF's `__init__` does, and a value the trainer is given (e.g.
sentence-transformers sets `can_return_loss = True`) is what the loops read; it stays when the module is rebuilt for
another model (`model_init`, `trainer.model = ...`), as HF never recomputes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hf_lightning.args import TrainingArguments
from hf_lightning.module.module import TransformerModule

__all__ = ["StepHooks", "STICKY_ATTRIBUTES"]

STICKY_ATTRIBUTES = ("model_accepts_loss_kwargs", "label_names", "can_return_loss")
"""Module attributes HF computes once in `Trainer.__init__`: a value set on the trainer survives a module rebuild."""


def _module_attribute(name: str, doc: str) -> property:
    """A trainer attribute that is the module's (read and written through)."""

    def get(self: StepHooks) -> Any:
        return getattr(self.module, name)

    def set_(self: StepHooks, value: Any) -> None:
        if "module" in vars(self):  # set before `Trainer.__init__` ran: its own value replaces it, as in HF
            setattr(self.module, name, value)
            if name in STICKY_ATTRIBUTES:  # kept for a rebuilt module (`Trainer._build_module`)
                vars(self).setdefault("_set_attributes", {})[name] = value

    return property(get, set_, doc=doc)


class StepHooks:
    """HF's step and optimizer hooks (base implementations calling `self.module`'s built-ins): with them the
    `Trainer` is an `hf_lightning.contracts.HFStepHooks`, the owner of the module's hooks."""

    module: TransformerModule
    args: TrainingArguments

    loss_is_scaled_for_ga: bool | None = None
    """As HF's class attribute: True / False forces whether a loss is already normalised over the accumulation
    window (else the loss hooks' rule decides, see `module/hooks.py`)."""

    optimizer = _module_attribute("optimizer", "HF's `Trainer.optimizer`: the user's, else None until `train()` "
                                               "creates it (`create_optimizer`); the trained one afterwards.")
    lr_scheduler = _module_attribute("lr_scheduler", "HF's `Trainer.lr_scheduler` (see `optimizer`).")
    model_accepts_loss_kwargs = _module_attribute("model_accepts_loss_kwargs", "HF's: whether the model's forward "
                                                                              "takes loss kwargs.")
    label_smoother = _module_attribute("label_smoother", "HF's `LabelSmoother`, or None.")
    label_names = _module_attribute("label_names", "The label columns (HF's `label_names`): what evaluation reads the "
                                                   "labels from and what `remove_unused_columns` keeps.")
    can_return_loss = _module_attribute("can_return_loss", "HF's `can_return_loss`: whether evaluation computes the "
                                                           "loss of a batch without labels (default: the model's "
                                                           "forward has `return_loss=True`).")
    compute_loss_func = _module_attribute("compute_loss_func", "The constructor's `compute_loss_func`.")
    optimizer_cls_and_kwargs = _module_attribute("optimizer_cls_and_kwargs",
                                                 "The constructor's `optimizer_cls_and_kwargs`.")

    @property
    def current_gradient_accumulation_steps(self) -> int:
        """The micro-batches of the update running now (HF's; the last update of an epoch may be shorter)."""
        return self.module.micro_batches_in_update

    # ----- the loss -----
    def compute_loss(
        self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """HF's `compute_loss`: the model's loss (`compute_loss_func`'s, the label smoother's), normalised by
        `num_items_in_batch` (see `module/hooks.py`)."""
        return self.module.compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        """HF's `training_step` for one micro-batch: loss, normalisation, backward; returns the detached loss."""
        return self.module.hf_training_step(model, inputs, num_items_in_batch)

    def prediction_step(
        self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
        ignore_keys: list[str] | None = None, **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """HF's `prediction_step`: `(loss, logits, labels)` of one eval / predict batch (`generate` kwargs for a
        `Seq2SeqTrainer`)."""
        return self.module.prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)

    def compute_loss_context_manager(self) -> contextlib.AbstractContextManager[Any]:
        """HF's context around `compute_loss` (it enters `autocast_smart_context_manager` unless that is a no-op)."""
        return self.module.compute_loss_context_manager()

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True
                                       ) -> contextlib.AbstractContextManager[Any]:
        """A no-op, as HF's: Lightning's precision plugin does the autocast."""
        return self.module.autocast_smart_context_manager(cache_enabled)

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """HF's `_prepare_inputs`: `_prepare_input`, and an error for an empty batch."""
        return self.module._prepare_inputs(inputs)

    def _prepare_input(self, data: Any) -> Any:
        """HF's `_prepare_input`: tensors moved to the model's device."""
        return self.module._prepare_input(data)

    def _prepare_context_parallel_inputs(
        self, model: nn.Module, inputs: dict[str, Any]
    ) -> tuple[Callable[[], contextlib.AbstractContextManager[Any]], dict[str, Any]]:
        """`(a no-op context, inputs)`: no context parallelism under Lightning."""
        return self.module._prepare_context_parallel_inputs(model, inputs)

    def _get_num_items_in_batch(self, batch_samples: list[Any], device: torch.device | None) -> torch.Tensor | None:
        """HF's `num_items_in_batch` of a window of micro-batches (or of `[inputs]` in evaluation)."""
        return self.module._get_num_items_in_batch(batch_samples, device)

    def _get_learning_rate(self) -> float:
        """HF's `_get_learning_rate`: the learning rate of the update just run."""
        return self.module.current_learning_rate()

    # HF's parallelism sizes, read by pasted HF `compute_loss` bodies: always 1 (no tensor, context or sequence
    # parallelism under hf_lightning; overriding them is refused, the built-ins never call them)
    def get_tp_size(self) -> int:
        return 1

    def get_cp_size(self) -> int:
        return 1

    def get_sp_size(self) -> int:
        return 1

    # ----- optimizer and scheduler -----
    def get_num_trainable_parameters(self) -> int:
        """HF's `get_num_trainable_parameters`: the elements of the model's parameters that require a gradient."""
        return sum(p.numel() for p in self.module.model.parameters() if p.requires_grad)

    def _optimizer_or_error(self) -> torch.optim.Optimizer:
        optimizer = self.optimizer
        if optimizer is None:  # HF's words
            raise ValueError("Trainer optimizer is None, please make sure you have setup the optimizer before.")
        return optimizer

    def get_learning_rates(self) -> list[float]:
        """HF's `get_learning_rates`: each parameter group's `lr`.

        Raises:
            ValueError: there is no optimizer yet (before `train()` or `create_optimizer()`), HF's error.
        """
        return [group["lr"] for group in self._optimizer_or_error().param_groups]

    def get_optimizer_group(self, param: str | nn.Parameter | None = None) -> Any:
        """HF's `get_optimizer_group`: the parameter group holding `param`, else every group's `params` list.

        Raises:
            ValueError: there is no optimizer yet, HF's error.
        """
        groups = self._optimizer_or_error().param_groups
        if param is not None:
            for group in groups:
                if any(p is param for p in group["params"]):  # HF's `in`, without comparing tensors elementwise
                    return group
        return [group["params"] for group in groups]

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """HF's `get_decay_parameter_names`: every parameter but biases and normalisation weights."""
        return self.module.get_decay_parameter_names(model)

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: TrainingArguments, model: nn.Module | None = None
                                     ) -> tuple[Any, dict[str, Any]]:
        """HF's `get_optimizer_cls_and_kwargs`: the class and keyword arguments `args.optim` names."""
        return TransformerModule.get_optimizer_cls_and_kwargs(args, model)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """HF's `create_optimizer`: sets `self.optimizer` (if None) with HF's parameter groups; returns it."""
        return self.module.create_optimizer(model)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """HF's `create_scheduler`: sets `self.lr_scheduler` (if None) for `num_training_steps` updates; returns it."""
        return self.module.create_scheduler(num_training_steps, optimizer)

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """HF's `create_optimizer_and_scheduler`: `self.create_optimizer()`, then `self.create_scheduler(...)`."""
        self.module.create_optimizer_and_scheduler(num_training_steps)
