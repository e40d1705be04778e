"""`Trainer.hyperparameter_search` (optuna) against `transformers.Trainer.hyperparameter_search`: same trials, same
objectives, same best run, same `run-<n>` folders and trial records, same pruning."""

from __future__ import annotations

import copy
import json
import os

import optuna
import pytest
import transformers

import hf_lightning
from helpers import classification_dataset, tiny_bert

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
COMMON = dict(per_device_train_batch_size=8, per_device_eval_batch_size=8, eval_strategy="epoch",
              save_strategy="epoch", logging_steps=1, seed=5, report_to="none")
TRAIN, DEV = classification_dataset(16), classification_dataset(8, seed=1)
BASE = tiny_bert()


def hp_space(trial):
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True),
            "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 2)}


def model_init(trial):
    assert trial is None or isinstance(trial, optuna.Trial)  # HF passes the trial to a one-argument model_init
    # a copy draws no random numbers: HF's sampler draws its order from the global RNG after `model_init`, so a model
    # built here would change HF's data order (the RNG draw order of `model_init` runs is not this test's subject)
    return copy.deepcopy(BASE)


def make(kind, output_dir):
    if kind == "hf":
        args = transformers.TrainingArguments(output_dir=output_dir, use_cpu=True, disable_tqdm=True, **COMMON)
        return transformers.Trainer(model_init=model_init, args=args, train_dataset=TRAIN, eval_dataset=DEV)
    args = hf_lightning.TrainingArguments(output_dir=output_dir, **COMMON)
    return hf_lightning.Trainer(model_init=model_init, args=args, train_dataset=TRAIN, eval_dataset=DEV,
                                lightning_kwargs=dict(LIGHTNING_KWARGS))


def search(kind, output_dir, **kwargs):
    trainer = make(kind, output_dir)
    best = trainer.hyperparameter_search(hp_space=hp_space, n_trials=3, direction="minimize",
                                         sampler=optuna.samplers.RandomSampler(seed=0), **kwargs)
    return trainer, best


def folders(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, dirs, _ in os.walk(root) for f in dirs
                  if f.startswith(("run-", "checkpoint-")))


def test_search_matches_hf(tmp_path):
    _, hf_best = search("hf", str(tmp_path / "hf"))
    ours_trainer, our_best = search("ours", str(tmp_path / "ours"))
    assert isinstance(our_best, transformers.trainer_utils.BestRun)
    assert our_best.run_id == hf_best.run_id
    assert our_best.hyperparameters == hf_best.hyperparameters
    assert our_best.objective == pytest.approx(hf_best.objective, rel=1e-5)
    assert folders(tmp_path / "ours") == folders(tmp_path / "hf")
    assert "run-2/checkpoint-2" in folders(tmp_path / "ours") or "run-2/checkpoint-4" in folders(tmp_path / "ours")
    for run in ("run-0", "run-1", "run-2"):
        checkpoint = sorted(os.listdir(tmp_path / "ours" / run))[-1]
        hf_state = json.loads((tmp_path / "hf" / run / checkpoint / "trainer_state.json").read_text())
        our_state = json.loads((tmp_path / "ours" / run / checkpoint / "trainer_state.json").read_text())
        for key in ("is_hyper_param_search", "trial_name", "trial_params", "global_step"):
            assert our_state[key] == hf_state[key], (run, key)
        assert our_state["is_hyper_param_search"] is True
    # as HF: the arguments keep the last trial's values, and output_dir is the search's folder again
    assert ours_trainer.args.output_dir == str(tmp_path / "ours")


def test_pruned_trials_stop_where_hf_s_stop(tmp_path):
    pruner = optuna.pruners.ThresholdPruner(upper=0.0)  # every reported objective (an eval loss) is above 0: prune
    results = {}
    for kind in ("hf", "ours"):
        trainer = make(kind, str(tmp_path / kind))
        study_holder = {}

        def hp(trial, holder=study_holder):
            holder["study"] = trial.study
            return hp_space(trial)

        with pytest.raises(ValueError, match="No trials are completed yet"):  # every trial pruned: optuna's error
            trainer.hyperparameter_search(hp_space=hp, n_trials=2, pruner=pruner,
                                          sampler=optuna.samplers.RandomSampler(seed=0))
        study = study_holder["study"]
        results[kind] = ([t.state for t in study.trials], [t.intermediate_values for t in study.trials])
    assert results["ours"][0] == results["hf"][0] == [optuna.trial.TrialState.PRUNED] * 2
    hf_values, our_values = results["hf"][1], results["ours"][1]
    assert [list(v) for v in our_values] == [list(v) for v in hf_values]  # reported at the same steps
    for hf_trial, our_trial in zip(hf_values, our_values):
        for step in hf_trial:
            assert our_trial[step] == pytest.approx(hf_trial[step], rel=1e-5)
    assert folders(tmp_path / "ours") == folders(tmp_path / "hf")


def test_search_without_evaluation_evaluates_once_at_the_end(tmp_path):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), max_steps=2, save_strategy="no",
                                          report_to="none")
    trainer = hf_lightning.Trainer(model_init=lambda: tiny_bert(), args=args, train_dataset=TRAIN, eval_dataset=DEV,
                                   lightning_kwargs=dict(LIGHTNING_KWARGS))
    best = trainer.hyperparameter_search(hp_space=lambda t: {"learning_rate": t.suggest_float("lr", 1e-4, 1e-3)},
                                         n_trials=1, compute_objective=lambda m: m["eval_loss"] * 2)
    assert best.objective == pytest.approx(trainer.evaluate()["eval_loss"] * 2, rel=1e-6)


def test_other_backends_and_missing_model_init_are_refused(tmp_path):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none")
    trainer = hf_lightning.Trainer(model_init=lambda: tiny_bert(), args=args, train_dataset=TRAIN,
                                   lightning_kwargs=dict(LIGHTNING_KWARGS))
    with pytest.raises(ValueError, match="backend='ray'.*optuna"):
        trainer.hyperparameter_search(backend="ray")
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=TRAIN,
                                   lightning_kwargs=dict(LIGHTNING_KWARGS))
    with pytest.raises(RuntimeError, match="model_init"):
        trainer.hyperparameter_search()
