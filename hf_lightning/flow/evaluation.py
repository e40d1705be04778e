"""`HFEvaluator`: HF's `evaluate()` and `predict()` on Lightning's loops; every run returns its results.

`HFTrainerFlow` holds one and forwards Lightning's validation and prediction hooks to it (`start`, `batch_start`,
`batch_end`, `end`). A run is one `EvaluationRun` (`module/eval_run.py`): the module's `validation_step` /
`predict_step` return an `EvalStep` per batch, the evaluator adds it to the dataset's accumulator, and finishes each
dataset when the next one starts (HF evaluates datasets one after another, each with its `log` and `on_evaluate`) or
when the loop ends.

Entry points, each returning what the run produced:

- `evaluate`: `lightning.Trainer.validate` for one request (`metric_key_prefix`, `ignore_keys`), as HF's
  `Trainer.evaluate`; an `EvaluationOutput` (every dataset's `EvalResult`, `.metrics` merged as HF returns them);
- `predict`: `lightning.Trainer.predict`, as HF's `Trainer.predict`; the dataset's `EvalResult`;
- `evaluate_during_fit`: the validation loop run right now inside `fit`, at an HF evaluation step.

A `validate` / `predict` started by the user directly (`lightning.Trainer.validate(...)`) runs the same code with
the default request; its entries land in `state.log_history` and reach HF callbacks as usual.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import lightning.pytorch as pl

from hf_lightning._lightning_compat import datamodule_of, run_validation_now
from hf_lightning.contracts import FlowDataModule, flow_module
from hf_lightning.data.sampling import dataset_length
from hf_lightning.module.eval_run import EvalAccumulator, EvaluationRun
from hf_lightning.module.evaluation import EvalRequest, EvalResult, EvalStep, EvaluationOutput

__all__ = ["EvaluationHost", "HFEvaluator"]


class EvaluationHost(Protocol):
    """What the evaluator reports to (the flow): HF callback events, and each finished dataset."""

    def hf_event(self, name: str, **extra: Any) -> None:
        """Call the HF callbacks' `name` event (`on_prediction_step`, `on_predict`)."""

    def set_eval_dataloader(self, loader: Any) -> None:
        """The dataloader HF callbacks receive as `eval_dataloader`."""

    def announce_evaluation(self, loader: Any, is_prediction: bool) -> None:
        """HF's evaluation-loop header for a dataset about to be evaluated (or predicted)."""

    def dataset_evaluated(self, trainer: pl.Trainer, pl_module: pl.LightningModule, metrics: dict[str, Any]) -> None:
        """One eval dataset is finished: HF's `log`, `on_evaluate` and the evaluation listeners (metrics get
        `epoch` added in place, as HF's `log` does)."""


def _loader(loaders: Any, index: int) -> Any:
    return loaders[index] if isinstance(loaders, list) else loaders


class HFEvaluator:
    """Runs HF evaluations and predictions through Lightning's loops and returns their results.

    Args:
        host: the flow (events and log entries of finished datasets).
    """

    def __init__(self, host: EvaluationHost) -> None:
        self.host = host
        self._requested: EvaluationRun | None = None  # the run an entry point asked for, filled by the hooks
        self._active: EvaluationRun | None = None
        self._current = -1

    # ----- entry points -----
    @contextmanager
    def _expect(self, request: EvalRequest) -> Iterator[EvaluationRun]:
        """The run the next validation / prediction loop fills (the hooks open it with the trainer's datasets)."""
        run = EvaluationRun(request)
        self._requested = run
        try:
            yield run
        finally:
            self._requested = None

    def evaluate(
        self, trainer: pl.Trainer, module: pl.LightningModule, datamodule: pl.LightningDataModule, request: EvalRequest,
        ckpt_path: str | None = None,
    ) -> EvaluationOutput:
        """HF's `evaluate()`: `trainer.validate` over every eval dataset; one log entry and `on_evaluate` each."""
        with self._expect(request) as run:
            trainer.validate(module, datamodule=datamodule, ckpt_path=ckpt_path, verbose=False)
        return run.output

    def predict(
        self, trainer: pl.Trainer, module: pl.LightningModule, datamodule: pl.LightningDataModule, request: EvalRequest,
        ckpt_path: str | None = None,
    ) -> EvalResult:
        """HF's `predict()`: `trainer.predict` over the prediction dataset; `on_predict`, no log entry.

        Returns:
            The dataset's `EvalResult` (HF's `PredictionOutput` fields: predictions, label_ids, metrics).
        """
        with self._expect(EvalRequest(request.metric_key_prefix, request.ignore_keys, is_prediction=True)) as run:
            trainer.predict(module, datamodule=datamodule, ckpt_path=ckpt_path, return_predictions=False)
        return run.output.results[""]

    def evaluate_during_fit(self, trainer: pl.Trainer, request: EvalRequest | None = None) -> EvaluationOutput:
        """Run Lightning's validation loop now, inside `fit` (an HF evaluation step), for `request` (default: HF's
        `evaluate()` without arguments)."""
        with self._expect(request if request is not None else EvalRequest()) as run:
            run_validation_now(trainer)
        return run.output

    # ----- Lightning hooks, forwarded by the flow -----
    def start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, is_prediction: bool) -> None:
        """A validation or prediction loop starts: open the requested run (or a default one) for its datasets."""
        module = flow_module(pl_module)
        datamodule: FlowDataModule = datamodule_of(trainer)  # checked in the flow's setup
        if is_prediction:
            names: list[str] = [""]
            datasets = [datamodule.predict_dataset]
            loaders = trainer.predict_dataloaders
        else:
            names = list(datamodule.eval_datasets or {}) or [""]
            datasets = list((datamodule.eval_datasets or {}).values())
            loaders = trainer.val_dataloaders
        run = self._requested
        if run is None or run.request.is_prediction != is_prediction:  # a loop the user started directly
            run = EvaluationRun(EvalRequest(is_prediction=is_prediction))
        self._requested = None  # one request, one loop
        module.start_eval_run(run.request)
        world_size = trainer.world_size

        keeps_predictions = is_prediction or run.request.keeps_predictions

        def new_accumulator(index: int) -> EvalAccumulator:
            return module.new_eval_accumulator(keeps_predictions, world_size, _loader(loaders, index))

        run.open(names, [dataset_length(d) for d in datasets], world_size, new_accumulator)
        self._active = run
        self._current = -1

    def batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, dataloader_idx: int, loaders: Any
                    ) -> None:
        """A new dataset starts: finish the earlier ones first, as HF evaluates datasets one after another."""
        if dataloader_idx == self._current:
            return
        for index in range(dataloader_idx):
            self._finish(trainer, pl_module, index)
        self._current = dataloader_idx
        loader = _loader(loaders, dataloader_idx)
        self.host.set_eval_dataloader(loader)
        if self._active is not None:
            self.host.announce_evaluation(loader, self._active.request.is_prediction)

    def batch_end(self, batch: Any, step: Any, dataloader_idx: int) -> None:
        """Accumulate one batch's `EvalStep`; HF's `on_prediction_step`."""
        if self._active is None:
            return
        if not isinstance(step, EvalStep):
            raise TypeError(
                f"An HF evaluation step must return an hf_lightning.module.evaluation.EvalStep (see "
                f"hf_lightning.contracts.FlowModule), got {type(step).__name__} from the module's validation_step / "
                "predict_step."
            )
        self._active.add(dataloader_idx, batch, step)
        self.host.hf_event("on_prediction_step")

    def end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, num_dataloaders: int) -> None:
        """Finish the datasets not finished yet, then close the run."""
        run = self._active
        if run is None:
            return
        for index in run.unfinished(num_dataloaders):
            self._finish(trainer, pl_module, index)
        self._active = None

    def _finish(self, trainer: pl.Trainer, pl_module: pl.LightningModule, index: int) -> None:
        run = self._active
        assert run is not None
        result = run.finish(index)
        if result is None or run.request.description is not None:  # `evaluation_loop`: the caller logs
            return
        if run.request.is_prediction:
            self.host.hf_event("on_predict", metrics=result.metrics)
        else:
            self.host.dataset_evaluated(trainer, pl_module, result.metrics)
