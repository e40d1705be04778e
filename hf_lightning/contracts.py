"""What the Lightning pieces need from each other, declared as `typing.Protocol`s.

`HFTrainerFlow` drives a run through the objects the user hands to `lightning.Trainer`; what it needs from each is
written here, once, and checked once in the flow's `setup` (`check_flow_contracts`: one error naming everything
missing). `TransformerModule` and `TransformerDataModule` implement them; a user class may too.

- `FlowModule`: the LightningModule (its `model`, ending an epoch early, HF evaluation steps).
- `FlowDataModule`: the data module (datasets, the epoch length, the resumed start position).
- `TrainingStepListener`: a Lightning callback told about HF's events inside an update (`on_substep_end`,
  `on_pre_optimizer_step`, `on_optimizer_step`); the module calls every callback of the trainer that is one.
- `HFEvaluationListener`: a Lightning callback told about each finished HF evaluation (e.g. `HFEarlyStopping`).
- `HFStepHooks`: the owner of `compute_loss` / `prediction_step` with the HF signatures, which the module's steps call
  through `TransformerModule.hooks` (the module itself; a `transformers.Trainer`-style subclass may own them).
- `TrainingStepOutput`: what the module's `training_step` returns, read by the flow for logging.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

import torch
from torch import nn
from typing_extensions import NotRequired, get_protocol_members

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from hf_lightning.eval_run import EvalAccumulator
    from hf_lightning.evaluation import EvalRequest

__all__ = [
    "FlowDataModule", "FlowModule", "HFEvaluationListener", "HFFlowView", "HFStepHooks", "TrainingStepListener",
    "TrainingStepOutput", "check_flow_contracts", "flow_model", "flow_module", "missing_members",
]


@runtime_checkable
class FlowModule(Protocol):
    """What `HFTrainerFlow` needs from the LightningModule it drives (`TransformerModule` is one)."""

    model: nn.Module
    """The wrapped model: passed to HF callbacks, counted for FLOPs, saved in checkpoints, the best one loaded."""

    def request_epoch_stop(self) -> None:
        """End the current epoch before the next batch (an HF `control.should_epoch_stop`)."""

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

    args: Any
    state: Any
    control: Any


@runtime_checkable
class HFEvaluationListener(Protocol):
    """A Lightning callback told about each finished HF evaluation (per eval dataset), before the best metric moves."""

    def on_hf_evaluate(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, flow: HFFlowView, metrics: dict[str, Any]
    ) -> None:
        """`metrics` is the dataset's metric dict (`eval_*` keys and `epoch`); set `flow.control` flags to act."""


class HFStepHooks(Protocol):
    """The two HF hooks the module's steps call, with the `transformers.Trainer` signatures."""

    def compute_loss(
        self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> Any:
        """The loss of one micro-batch (and the model outputs with `return_outputs`)."""

    def prediction_step(
        self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """`(loss, logits, labels)` of one eval / predict batch."""


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
