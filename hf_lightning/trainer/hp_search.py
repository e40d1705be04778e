"""`Trainer.hyperparameter_search` with HF's optuna backend (transformers `integrations/integration_utils.py`:
`run_hp_search_optuna`; `Trainer._hp_search_setup`, `_report_to_hp_search`, `_get_output_dir`).

Each trial is a real training run of the same trainer, as in HF:

1. the trial's values (`hp_space(trial)`, default HF's `default_hp_space_optuna`) are set on the training arguments,
   each cast to the field's current type; unknown names are skipped with HF's warning;
2. `model_init` (with the trial when it takes one argument) gives a fresh model, and `train()` runs; its checkpoints
   go to `<output_dir>/run-<trial number>` (or `hp_name(trial)`), its `trainer_state.json` records
   `is_hyper_param_search`, `trial_name` and `trial_params`;
3. after every evaluation during training the objective (`compute_objective(metrics)`, default HF's
   `default_compute_objective`: `eval_loss`, or the sum of the other metrics) is reported to optuna at that
   `global_step`; when optuna says to prune, HF's `on_train_end` runs and the trial ends with `optuna.TrialPruned`
   (single-objective studies only, as HF);
4. a run without any evaluation is evaluated once at its end for the objective.

The result is HF's `BestRun(run_id, objective, hyperparameters)`, a list of them for several `direction`s. As in HF,
the arguments keep the last trial's values afterwards. Differences: only the optuna backend (`ray` / `wandb` raise
one error), and one process only (HF broadcasts trials to DDP processes; here a multi-process run is refused before
the first trial).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import BestRun, default_compute_objective, default_hp_space_optuna

from hf_lightning.args import TrainingArguments
from hf_lightning.trainer.script_api import PassedArguments

__all__ = ["HyperparameterSearchMixin", "apply_trial_params", "trial_run_name"]

logger = logging.getLogger(__name__)


def apply_trial_params(args: PassedArguments, params: dict[str, Any]) -> dict[str, Any]:
    """Set `params` on `args` as HF's `_hp_search_setup` does; returns what was set (unknown names are skipped)."""
    applied = {}
    for key, value in params.items():
        if not hasattr(args, key):
            logger.warning(f"Trying to set {key} in the hyperparameter search but there is no corresponding field in "
                           "`TrainingArguments`.")
            continue
        old = getattr(args, key)
        if old is not None:
            value = type(old)(value)  # HF casts to the field's current type (e.g. a float epoch count)
        setattr(args, key, value)
        applied[key] = value
    return applied


def trial_run_name(trial: Any, hp_name: Callable[[Any], str] | None) -> str:
    """The trial's folder under `output_dir`: `hp_name(trial)`, else `run-<trial number>` (HF `_get_output_dir`)."""
    return hp_name(trial) if hp_name is not None else f"run-{trial.number}"


class _TrialReporter(TrainerCallback):
    """Marks the `TrainerState` of a trial and reports the objective of each evaluation during training to optuna."""

    def __init__(self, search: HyperparameterSearchMixin, trial: Any, eval_datasets: int) -> None:
        self.search = search
        self.trial = trial
        self.eval_datasets = max(eval_datasets, 1)
        self.training = False
        self._pending: dict[str, Any] = {}
        self._seen = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        state.is_hyper_param_search = True
        if self.search.hp_name is not None:
            state.trial_name = self.search.hp_name(self.trial)
        state.trial_params = dict(self.trial.params)
        self.training = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.training = False

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        """One call per eval dataset: HF reports once per evaluation, with the metrics of every dataset merged."""
        if not self.training:
            return
        self._pending.update(metrics or {})
        self._seen += 1
        if self._seen < self.eval_datasets:
            return
        merged, self._pending, self._seen = self._pending, {}, 0
        self.search.report_objective(self.trial, state.global_step, merged)


class HyperparameterSearchMixin:
    """`hyperparameter_search` and `call_model_init` for `hf_lightning.Trainer` (see the module docstring)."""

    args: TrainingArguments
    model_init: Callable[..., Any] | None
    passed_args: PassedArguments | None
    datamodule: Any  # the facade's `TransformerDataModule` and `HFTrainerFlow`: Lightning objects, a layer above
    flow: Any  # this torch-level module (tests/test_layering.py)
    hp_search_backend: str | None = None
    hp_space: Callable[[Any], dict[str, Any]] | None = None
    hp_name: Callable[[Any], str] | None = None
    compute_objective: Callable[[dict[str, float]], Any] = staticmethod(default_compute_objective)
    objective: Any = None
    _trial: Any = None

    def call_model_init(self, trial: Any = None) -> Any:
        """A fresh model from `model_init`, given the trial when it takes one argument (HF's rule).

        Raises:
            RuntimeError: `model_init` takes more than one argument, or returns None.
        """
        assert self.model_init is not None
        count = len(inspect.signature(self.model_init).parameters)
        if count == 0:
            model = self.model_init()
        elif count == 1:
            model = self.model_init(trial)
        else:
            raise RuntimeError("model_init should have 0 or 1 argument.")
        if model is None:
            raise RuntimeError("model_init should not return None.")
        return model

    def hyperparameter_search(
        self, hp_space: Callable[[Any], dict[str, Any]] | None = None,
        compute_objective: Callable[[dict[str, float]], Any] | None = None, n_trials: int = 20,
        direction: str | list[str] = "minimize", backend: Any = None, hp_name: Callable[[Any], str] | None = None,
        **kwargs: Any,
    ) -> BestRun | list[BestRun]:
        """HF's `hyperparameter_search` with optuna: `n_trials` training runs, the best one returned as `BestRun`.

        Args:
            hp_space: `fn(trial) -> {argument: value}`; default HF's `default_hp_space_optuna`.
            compute_objective: `fn(eval metrics) -> float` (or a list for several directions).
            n_trials: number of trials.
            direction: "minimize" / "maximize", or a list of them for a multi-objective study.
            backend: "optuna" or None (the only backend here).
            hp_name: `fn(trial) -> str`, the trial's folder and `trial_name`.
            **kwargs: `optuna.create_study` arguments, and `timeout`, `n_jobs`, `gc_after_trial`, `catch` for
                `study.optimize`.

        Raises:
            ValueError: another backend, or a run on several processes.
            ImportError: optuna is not installed (`pip install "hf-lightning[optuna]"`).
            RuntimeError: no `model_init` (HF's message).
        """
        name = str(getattr(backend, "value", backend)) if backend is not None else "optuna"
        if name != "optuna":
            raise ValueError(f"hyperparameter_search(backend={name!r}): hf_lightning supports the 'optuna' backend "
                             "only; pass backend='optuna' (or leave it out).")
        try:
            import optuna
        except ImportError as error:
            raise ImportError('hyperparameter_search needs optuna: pip install "hf-lightning[optuna]"') from error
        if self.model_init is None:
            raise RuntimeError("To use hyperparameter search, you need to pass your model through a model_init "
                               "function.")
        trainer: Any = self  # the facade: `train`, `evaluate`, `add_callback`... are its methods
        world_size = max(self.args.world_size, trainer._lightning_trainer().world_size)
        if world_size > 1:
            raise ValueError(f"hyperparameter_search runs on one process only (this run has {world_size}); run the "
                             "search without a multi-process strategy, then train the best run with it.")
        self.hp_search_backend = "optuna"
        self.hp_space = hp_space or default_hp_space_optuna
        self.hp_name = hp_name
        self.compute_objective = compute_objective or default_compute_objective
        optimize = {key: kwargs.pop(key) for key in ("timeout", "n_jobs", "gc_after_trial", "catch") if key in kwargs}
        directions: Any = direction if isinstance(direction, list) else None
        single: Any = None if directions else direction
        study = optuna.create_study(direction=single, directions=directions, **kwargs)
        try:
            study.optimize(self._run_trial, n_trials=n_trials, **optimize)
        finally:
            self.hp_search_backend = None
        if directions:
            return [BestRun(str(best.number), best.values, best.params) for best in study.best_trials]
        best = study.best_trial
        value: Any = best.value
        return BestRun(str(best.number), value, best.params)

    def _run_trial(self, trial: Any) -> Any:
        """One trial: its values on the arguments, a training run in its own folder, the objective."""
        import optuna

        trainer: Any = self  # the facade: `train`, `evaluate`, `add_callback`... are its methods
        assert self.hp_space is not None
        params = self.hp_space(trial)
        passed = self.passed_args if self.passed_args is not None else self.args  # set by the constructor
        for args in {id(a): a for a in (self.args, passed)}.values():  # training_args.bin stays true
            apply_trial_params(args, params)
        logger.info(f"Trial: {trial.params}")
        base_output_dir = self.args.output_dir
        self.args.output_dir = os.path.join(self.args.resolved_output_dir, trial_run_name(trial, self.hp_name))
        reporter = _TrialReporter(self, trial, len(self.datamodule.eval_datasets or {}))
        trainer.add_callback(reporter)
        self._trial, self.objective = trial, None
        try:
            trainer.train()
        except optuna.TrialPruned:
            self.flow.hf_event("on_train_end")  # HF's `_report_to_hp_search` ends the run with it before raising
            raise
        finally:
            trainer.pop_callback(reporter)  # never raises in this `finally`
            run_dir = self.args.output_dir
            self.args.output_dir = base_output_dir
            self._trial = None
            if os.path.isdir(run_dir) and not os.listdir(run_dir):
                os.rmdir(run_dir)  # the run lock's folder of a trial that saved nothing: HF leaves no folder
        if self.objective is None:  # no evaluation during training
            self.objective = self.compute_objective(trainer.evaluate())
        return self.objective

    def report_objective(self, trial: Any, step: int, metrics: dict[str, Any]) -> None:
        """HF `_report_to_hp_search` for optuna: the objective of this evaluation, reported; prune if optuna says so.

        Raises:
            optuna.TrialPruned: the trial is pruned (single-objective studies only).
        """
        import optuna

        self.objective = self.compute_objective(dict(metrics))
        if not trial.study._is_multi_objective():
            trial.report(self.objective, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
