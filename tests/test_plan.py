"""The run's plan (`hf_lightning.plan`): the save policy, the best-model rule, the best-save rule, the resumed
intervals and the unreachable-best check, as pure functions; HF's own `_determine_best_metric` is the oracle of the
best rule. And the structural rule of issue 23: `checkpoint/` asks the plan, it reads no save / eval / logging /
best-model argument itself."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers
from transformers import Trainer as HFTrainer
from transformers import TrainerState

from hf_lightning import TrainingArguments
from hf_lightning.plan import (
    BestRule,
    SavePolicy,
    best_rule,
    evaluates_during_fit,
    evaluates_on_start,
    is_better,
    plan_training,
    resume_intervals,
    save_policy,
    saves_now,
    unreachable_best_checkpoint,
)

PACKAGE = Path(__file__).resolve().parents[1] / "hf_lightning"


@pytest.mark.parametrize("strategy", ["no", "steps", "epoch", "best"])
def test_save_policy_follows_save_strategy(tmp_path, strategy):
    extra = {"eval_strategy": "steps", "metric_for_best_model": "loss"} if strategy == "best" else {}
    args = TrainingArguments(output_dir=str(tmp_path), save_strategy=strategy, save_total_limit=2, **extra)
    policy = save_policy(args)
    assert policy.saves == (strategy != "no")
    assert policy.tracks_best_step == (strategy != "no")  # HF: steps, epoch, best (T:3460-3462)
    assert policy.saves_on_new_best == (strategy == "best")
    assert policy.total_limit == 2
    assert (policy.only_model, policy.asynchronous, policy.nonfinite_allowed) == (False, False, False)
    flags = save_policy(TrainingArguments(output_dir=str(tmp_path), save_only_model=True, save_async=True,
                                          save_nonfinite_checkpoints=True))
    assert (flags.only_model, flags.asynchronous, flags.nonfinite_allowed) == (True, True, True)


@pytest.mark.parametrize("flags_say", [False, True])
@pytest.mark.parametrize("new_best", [False, True])
def test_saves_now_is_hfs_best_rule(flags_say, new_best):
    """`save_strategy="best"` saves exactly on a new best, whatever the flags say; otherwise the flags decide
    (T:2281-2282); a pass without an evaluation saves as the flags say."""
    assert saves_now(SavePolicy(saves_on_new_best=True), 7, flags_say, new_best) is new_best
    assert saves_now(SavePolicy(), 7, flags_say, new_best) is flags_say
    assert saves_now(SavePolicy(saves_on_new_best=True), 7, flags_say, None) is flags_say


def _hf_best(args: transformers.TrainingArguments, metrics: dict[str, float], state: TrainerState) -> bool:
    """HF's own `_determine_best_metric`, run on the state and arguments only (all it reads)."""
    return HFTrainer._determine_best_metric(SimpleNamespace(args=args, state=state), metrics, None)


@pytest.mark.parametrize("greater", [False, True])
@pytest.mark.parametrize("strategy", ["no", "steps", "epoch"])
def test_best_rule_matches_hf_determine_best_metric(tmp_path, greater, strategy):
    """The same sequence of metrics (a tie, a NaN, a better value) gives the same new-best answers, best metric and
    best step as HF's `_determine_best_metric`."""
    from hf_lightning.checkpoint.best import BestModelTracker

    kwargs = dict(output_dir=str(tmp_path), eval_strategy="steps", save_strategy=strategy,
                  metric_for_best_model="accuracy", greater_is_better=greater, report_to="none")
    ours_args, hf_args = TrainingArguments(**kwargs), transformers.TrainingArguments(**kwargs)
    tracker = BestModelTracker(best_rule(ours_args), save_policy(ours_args))
    ours, theirs = TrainerState(), TrainerState()
    for step, value in enumerate([0.5, 0.5, float("nan"), 0.7, 0.2], start=1):
        ours.global_step = theirs.global_step = step
        metrics = {"eval_accuracy": value, "eval_loss": 1.0}
        assert tracker.update(ours, metrics) == _hf_best(hf_args, metrics, theirs), step
        assert (ours.best_metric, ours.best_global_step) == (theirs.best_metric, theirs.best_global_step), step


def test_best_rule_keys_and_comparison():
    assert BestRule("accuracy").key == "eval_accuracy"
    assert BestRule("eval_f1").key == "eval_f1"
    assert BestRule(None).key is None and BestRule(None).scheduler_key == "eval_loss"
    assert is_better(0.1, None, greater_is_better=False) and is_better(0.1, None, greater_is_better=True)  # vs inf
    assert not is_better(float("nan"), None, greater_is_better=True)  # NaN is never a best
    assert not is_better(1.0, 1.0, greater_is_better=True)  # strict
    assert is_better(2.0, 1.0, greater_is_better=True) and is_better(0.5, 1.0, greater_is_better=False)


def test_evaluation_switches(tmp_path):
    assert not evaluates_during_fit(TrainingArguments(output_dir=str(tmp_path)))
    assert evaluates_during_fit(TrainingArguments(output_dir=str(tmp_path), eval_on_start=True))
    assert evaluates_during_fit(TrainingArguments(output_dir=str(tmp_path), eval_strategy="epoch"))
    assert evaluates_on_start(TrainingArguments(output_dir=str(tmp_path), eval_on_start=True))


def test_resume_intervals_keep_the_checkpoints_and_name_the_differences(tmp_path):
    """HF keeps the checkpoint's intervals (T:1694-1710) and names what differs (TU:1133-1169)."""
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=100, logging_steps=5, eval_steps=10, save_steps=20)
    plan = plan_training(args, 50)
    recorded = TrainerState(logging_steps=5, eval_steps=25, save_steps=50, train_batch_size=4)
    resumed, changed = resume_intervals(plan, recorded, batch_size=8)
    assert (resumed.logging_steps, resumed.eval_steps, resumed.save_steps) == (5, 25, 50)
    assert (resumed.max_steps, resumed.updates_per_epoch) == (plan.max_steps, plan.updates_per_epoch)
    assert len(changed) == 3
    assert changed[0] == "eval_steps: 10 (from args) != 25 (from trainer_state.json)"
    assert changed[2].startswith("per_device_train_batch_size: 8 (from args) != 4")
    same, nothing = resume_intervals(plan, TrainerState(logging_steps=5, eval_steps=10, save_steps=20), 8)
    assert same == plan and nothing == []


def test_unreachable_best_checkpoint_on_resolved_ratios(tmp_path):
    """0.1 / 0.2 of 105 updates resolve to 11 / 21: not multiples (HF only checks the given ratios)."""
    kwargs = dict(output_dir=str(tmp_path), max_steps=105, eval_strategy="steps", save_strategy="steps",
                  load_best_model_at_end=True)
    ratios = TrainingArguments(eval_steps=0.1, save_steps=0.2, **kwargs)
    problem = unreachable_best_checkpoint(ratios, plan_training(ratios, 105))
    assert problem is not None and "resolve to 11 and 21 updates for max_steps=105" in problem
    steps = TrainingArguments(eval_steps=10, save_steps=20, **kwargs)
    assert unreachable_best_checkpoint(steps, plan_training(steps, 105)) is None
    assert math.ceil(105 * 0.1) == 11  # the rounding the message names


_PLAN_ONLY = ("save_", "eval_", "logging_")
_PLAN_ONLY_NAMES = {"metric_for_best_model", "greater_is_better", "load_best_model_at_end"}


def test_checkpoint_package_reads_no_cadence_argument():
    """`checkpoint/` asks the plan (`SavePolicy`, `BestRule`, `resume_intervals`): no module of it reads a save /
    eval / logging / best-model argument (issue 23: adding one touches args, its validation and the plan only)."""
    found = []
    for path in sorted((PACKAGE / "checkpoint").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if "args" in name and (node.attr.startswith(_PLAN_ONLY) or node.attr in _PLAN_ONLY_NAMES):
                found.append(f"{path.name}:{node.lineno} {name}.{node.attr}")
    assert found == []
