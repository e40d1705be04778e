"""What the Lightning pieces need from each other, declared as `typing.Protocol`s.

`HFTrainerFlow` drives a run through the objects the user hands to `lightning.Trainer`; what it needs from each is
written here, once, and checked once in the flow's `setup` (`check_flow_contracts`: one error naming everything
missing). `TransformerModule` and `TransformerDataModule` implement them; a user class may too.

- `FlowModule`: the LightningModule (its `model`, ending an epoch early, HF evaluation steps, whether evaluation
  computes the loss only).
- `FlowDataModule`: the data module (datasets, the epoch length, the resumed start position).
- `ResumableTrainStream` (optional): a data module whose unsized train stream reports its position for checkpoints
  and starts from a saved one; without it such a stream is resumed by reading, as HF does.
- `TrainingStepListener`: a Lightning callback told about HF's events inside an update (`on_substep_end`,
  `on_pre_optimizer_step`, `on_optimizer_step`); the module calls every callback of the trainer that is one.
- `HFEvaluationListener`: a Lightning callback told about each finished HF evaluation (e.g. `HFEarlyStopping`).
- `HFStepHooks`: the owner of the HF hooks with `transformers.Trainer`'s signatures (`training_step`, `compute_loss`,
  `prediction_step`, `create_optimizer`, ...), which the module calls through `TransformerModule.hooks` (the
  module's built-ins, `module.hooks.ModuleStepHooks`, or an `hf_lightning.Trainer` whose subclass may override them).
- `HFDataHooks`: the owner of HF's dataloader methods (`get_train_dataloader`, `get_eval_dataloader`,
  `get_test_dataloader`), which `TransformerDataModule` asks for its loaders (`loader_owner`: an `hf_lightning.Trainer`;
  without one, the data module itself; `hf_lightning/trainer/data_hooks.py` is the `Trainer`'s side).
- `HFLoopHooks`: the owner of HF's loop methods (`_maybe_log_save_evaluate`, `log`, `_evaluate`, `evaluate`,
  `num_examples`, `floating_point_ops`), which `HFTrainerFlow` calls where HF's loop does when its class overrides
  them (`evaluate` always; the flow's `owner`: an `hf_lightning.Trainer`; without one, or for a method not
  overridden, the flow's built-ins run; `hf_lightning/trainer/loop_hooks.py`).
- `TrainingStepOutput`: what the module's `training_step` returns, read by the flow for logging.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

import torch
from torch import nn
from typing_extensions import NotRequired, get_protocol_members

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from transformers import TrainerControl, TrainerState

    from hf_lightning.args import TrainingArguments
    from hf_lightning.module.eval_run import EvalAccumulator
    from hf_lightning.module.evaluation import EvalRequest

__all__ = [
    "ElasticTrainOrder", "FlowDataModule", "FlowModule", "HFDataHooks", "HFEvaluationListener", "HFFlowView",
    "HFLoopHooks", "HFStepHooks", "ResumableTrainStream", "TrainingStepListener",
    "TrainingStepOutput", "check_flow_contracts", "flow_model", "flow_module", "missing_members",
]


@runtime_checkable
class FlowModule(Protocol):
    """What `HFTrainerFlow` needs from the LightningModule it drives (`TransformerModule` is one)."""

    model: nn.Module
    """The wrapped model: passed to HF callbacks, counted for FLOPs, saved in checkpoints, the best one loaded."""

    def request_epoch_stop(self) -> None:
        """End the current epoch before the next batch (an HF `control.should_epoch_stop`)."""

    def prediction_loss_only(self, is_prediction: bool) -> bool:
        """Whether an evaluation (or, with `is_prediction`, a prediction) computes the loss only: the flow refuses a
        `metric_for_best_model` that such evaluations cannot produce before training starts."""

    def start_eval_run(self, request: EvalRequest) -> None:
        """An evaluation or prediction run starts: its `validation_step` / `predict_step` follow `request`
        (`ignore_keys`), and return an `EvalStep` each."""

    def new_eval_accumulator(self, is_prediction: bool, world_size: int, loader: Any) -> EvalAccumulator:
        """A fresh accumulator for one dataset of the run (the module's kind: generation evaluation counts
        `generate` calls); `loader` is that dataset's dataloader."""


@runtime_checkable
class FlowDataModule(Protocol):
    """What `HFTrainerFlow` needs from the data module (`TransformerDataModule` is one)."""

    train_dataset: Any
    """The training data (its length gives `train_samples_per_second`)."""
    eval_datasets: dict[str, Any] | None
    """The eval datasets by name, in loader order (`""` for a single unnamed one)."""
    predict_dataset: Any
    """The prediction data."""
    resume_position: tuple[int, int] | None
    """`(epoch, windows)`: set on a resume; the next train loader starts at that window of that epoch."""

    def num_train_microbatches(self) -> int | None:
        """Micro-batches per epoch on one process (HF's `len(train_dataloader)`); None for an unsized dataset."""

    def train_loader(self) -> Any:
        """The micro-batch loader of the running fit (HF's `train_dataloader`, passed to HF callbacks)."""


@runtime_checkable
class ElasticTrainOrder(Protocol):
    """A data module whose sized train order can be resumed at a sample position (`TransformerDataModule`): what an
    elastic resume needs (`checkpoint/elastic.py`)."""

    resume_start_sample: int
    """Set on a resume with `resume_position`: the resumed epoch is the rest of its order after this many samples."""

    def sample_position(self, windows_done: int) -> dict[str, Any] | None:
        """The order and the samples of it trained after `windows_done` windows of the current epoch, or None."""

    def train_order(self) -> dict[str, Any] | None:
        """This run's train order (`num_samples`, `seed`, `shuffle`), or None when it cannot start at a sample."""

    def rest_windows(self, start_sample: int) -> int | None:
        """This run's windows left in an epoch resumed after `start_sample` samples, or None."""


@runtime_checkable
class ResumableTrainStream(Protocol):
    """A data module that saves and restores the position of its unsized train stream (`TransformerDataModule`)."""

    resume_stream_position: Any
    """Set on a resume with `resume_position`: the saved position after those windows (None: read and skip)."""

    def train_stream_position(self, windows_done: int) -> Any:
        """The stream's position after `windows_done` windows of the current pass, in plain containers, or None."""


@runtime_checkable
class TrainingStepListener(Protocol):
    """A Lightning callback receiving HF's step-internal events from the module, at HF's points of the update."""

    def on_substep_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After each micro-batch's backward but the window's last."""

    def on_pre_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After clipping, before `optimizer.step()` runs."""

    def on_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After `optimizer.step()`, before the scheduler steps."""


class HFFlowView(Protocol):
    """What an `HFEvaluationListener` may read and set on the flow: HF's `args`, `state` and `control`."""

    args: TrainingArguments
    state: TrainerState
    control: TrainerControl


@runtime_checkable
class HFEvaluationListener(Protocol):
    """A Lightning callback told about each finished HF evaluation (per eval dataset), before the best metric moves."""

    def on_hf_evaluate(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, flow: HFFlowView, metrics: dict[str, Any]
    ) -> None:
        """`metrics` is the dataset's metric dict (`eval_*` keys and `epoch`); set `flow.control` flags to act."""


class HFStepHooks(Protocol):
    """The HF step hooks `TransformerModule` calls through `TransformerModule.hooks`, with the `transformers.Trainer`
    signatures (`module/hooks.py` gives the order).

    Two implementations: `module.hooks.ModuleStepHooks`, the module's own built-ins (or a `TransformerModule`
    subclass's overrides; HF's `training_step` is the module's `hf_training_step`), and `hf_lightning.Trainer`, whose
    subclass may override any of them (`trainer/step_hooks.py`). The module holds one of them, chosen once
    (`TransformerModule.attach_hooks`).

    Besides the methods, the owner answers the trainer attributes HF's step reads from `self` (a read-only
    property here, so a class attribute, an instance attribute or a property satisfies it): the module reads them
    through its `hooks`, so a value set on a `Trainer` subclass is the one in force.
    """

    @property
    def loss_is_scaled_for_ga(self) -> bool | None:
        """HF's class attribute: True / False forces whether a micro-batch loss is already normalised over the
        accumulation window; None lets the loss hooks' rule decide."""

    def training_step(self, model: nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        """One micro-batch: loss, normalisation over the window, backward; the detached loss."""

    def compute_loss(
        self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """The loss of one micro-batch (and the model outputs with `return_outputs`)."""

    def prediction_step(
        self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """`(loss, logits, labels)` of one eval / predict batch."""

    def compute_loss_context_manager(self) -> AbstractContextManager[Any]:
        """The context around `compute_loss`."""

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True) -> AbstractContextManager[Any]:
        """The autocast context `compute_loss_context_manager` enters (a no-op: Lightning autocasts)."""

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """A batch ready for the model."""

    def _prepare_input(self, data: Any) -> Any:
        """One (nested) value moved to the device."""

    def _prepare_context_parallel_inputs(
        self, model: nn.Module, inputs: dict[str, Any]
    ) -> tuple[Callable[[], AbstractContextManager[Any]], dict[str, Any]]:
        """`(context factory, inputs)` for context parallelism (a no-op context under Lightning)."""

    def _get_num_items_in_batch(self, batch_samples: list[Any], device: torch.device | None
                                ) -> torch.Tensor | None:
        """The label tokens of a window of micro-batches."""

    def _get_learning_rate(self) -> float:
        """The learning rate of the update just run (called only when overridden)."""

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """The parameters that get weight decay."""

    def get_optimizer_cls_and_kwargs(self, args: TrainingArguments, model: nn.Module | None = None
                                     ) -> tuple[Any, dict[str, Any]]:
        """The optimizer class and keyword arguments."""

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """Set (if None) and return the owner's `optimizer`."""

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """Set (if None) and return the owner's `lr_scheduler`."""

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """Both of the above."""


class HFDataHooks(Protocol):
    """HF's dataloader methods `TransformerDataModule` asks for its loaders, with the `transformers.Trainer`
    signatures (`hf_lightning/trainer/data_hooks.py` is the `Trainer`'s side; the data module has its own)."""

    def get_train_dataloader(self) -> Any:
        """The training loader of micro-batches, once per `train()`."""

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """One eval loader: `eval_dataset` is a dataset, the name of one of the eval datasets, or None."""

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        """The loader of a `predict()` call."""

    def _get_dataloader(
        self, dataset: Any, description: str, batch_size: int, sampler_fn: Any = None, is_training: bool = False,
        dataloader_key: str | None = None,
    ) -> Any:
        """A loader of `dataset` (columns the model cannot take removed) in `sampler_fn(dataset)`'s order."""

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        """The training order (a sampler), or None."""

    def _get_eval_sampler(self, eval_dataset: Any) -> Any:
        """The evaluation order (a sampler), or None."""


class HFColumnHooks(Protocol):
    """HF's signature columns, which `TransformerDataModule` asks its `columns_owner` for when it removes unused
    columns (`hf_lightning/trainer/loop_hooks.py` is the `Trainer`'s side)."""

    _signature_columns: list[str] | None
    """The columns `remove_unused_columns` keeps; None until `_set_signature_columns_if_needed` sets them."""

    def _set_signature_columns_if_needed(self) -> None:
        """Set `_signature_columns` when it is None."""


class HFLoopHooks(Protocol):
    """HF's loop methods `HFTrainerFlow` calls where HF's loop calls them, with the `transformers.Trainer`
    signatures (`hf_lightning/trainer/loop_hooks.py` is the `Trainer`'s side)."""

    _trial: Any
    """HF's current hyperparameter-search trial (None outside `hyperparameter_search`), passed to `_save_checkpoint`."""

    def _maybe_log_save_evaluate(
        self, tr_loss: Any, grad_norm: Any, model: nn.Module, trial: Any, epoch: float,
        ignore_keys_for_eval: list[str] | None, start_time: float, learning_rate: float | None = None,
    ) -> None:
        """After every update: log, evaluate and save as the control flags say."""

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """One log entry: `log_history`, the callbacks' `on_log`, the loggers."""

    def _evaluate(self, trial: Any, ignore_keys_for_eval: list[str] | None, skip_scheduler: bool = False
                  ) -> dict[str, float]:
        """An evaluation during `train()`: its metrics."""

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """HF's `evaluate()`: the metrics of every eval dataset, evaluated one after another."""

    def num_examples(self, dataloader: Any) -> int:
        """The examples of a (sized) loader."""

    def floating_point_ops(self, inputs: Any) -> int:
        """The FLOPs of one micro-batch (a mapping: the collator's output, as HF passes it)."""

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        """Write the checkpoint of the current step (at HF's point: after the update's evaluation, before
        `on_save`)."""

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """At a resume: the checkpoint folder's model weights into the model (`model`: the sharded one, FSDP)."""

    def _load_best_model(self) -> None:
        """At the end of training with `load_best_model_at_end`: the best checkpoint's weights into the model."""


class TrainingStepOutput(TypedDict):
    """What `TransformerModule.training_step` returns for one optimizer update."""

    loss: torch.Tensor
    """The update's loss (the sum of its micro-batch losses, each already normalised over the window)."""
    micro_losses: NotRequired[torch.Tensor]
    """Each micro-batch's loss, so the NaN/Inf filter applies per micro-batch as in HF."""
    grad_norm: NotRequired[torch.Tensor | None]
    """The gradient norm before clipping (None when no parameter had a gradient)."""
    learning_rate: NotRequired[float]
    """The learning rate this update used."""
    label_tokens: NotRequired[torch.Tensor | None]
    """The window's label-token count (`num_items_in_batch`), when the module counted it (None: not counted); an
    update with none gets the flow's one warning."""


def missing_members(obj: Any, protocol: type) -> list[str]:
    """The members of `protocol` that `obj` lacks, sorted."""
    return sorted(name for name in get_protocol_members(protocol) if not hasattr(obj, name))


def flow_module(pl_module: Any) -> FlowModule:
    """`pl_module` as the `FlowModule` the flow's `setup` checked it to be.

    Raises:
        TypeError: it is not one (the flow's `setup` did not run for it).
    """
    if not isinstance(pl_module, FlowModule):
        raise TypeError(f"{type(pl_module).__name__} is not an hf_lightning.contracts.FlowModule; lacks "
                        f"{', '.join(missing_members(pl_module, FlowModule))}.")
    return pl_module


def flow_model(pl_module: Any) -> nn.Module:
    """The model a `FlowModule` wraps."""
    return flow_module(pl_module).model


def check_flow_contracts(pl_module: Any, datamodule: Any) -> None:
    """Raise one error naming everything the module and the data module lack for `HFTrainerFlow`.

    Raises:
        TypeError: a member of `FlowModule` / `FlowDataModule` is missing, or there is no data module.
    """
    problems = []
    module_missing = missing_members(pl_module, FlowModule)
    if module_missing:
        problems.append(f"the LightningModule {type(pl_module).__name__} lacks {', '.join(module_missing)} "
                        "(hf_lightning.contracts.FlowModule; subclass hf_lightning.TransformerModule)")
    if datamodule is None:
        problems.append("there is no data module (pass `datamodule=hf_lightning.TransformerDataModule(...)` to the "
                        "Lightning Trainer's fit / validate / predict, not dataloaders)")
    else:
        data_missing = missing_members(datamodule, FlowDataModule)
        if data_missing:
            problems.append(f"the data module {type(datamodule).__name__} lacks {', '.join(data_missing)} "
                            "(hf_lightning.contracts.FlowDataModule; use hf_lightning.TransformerDataModule)")
    if problems:
        raise TypeError("HFTrainerFlow cannot drive this run: " + "; ".join(problems) + ".")
