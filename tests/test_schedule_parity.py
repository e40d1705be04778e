"""The pure "when" rules (`hf_lightning.plan`) against `transformers.DefaultFlowCallback`, without any model.

Both sides run the same loop skeleton, a copy of `Trainer._inner_training_loop` / `_run_epoch` /
`_maybe_log_save_evaluate` (T:1652-1674, 1870-1999, 2238-2286) reduced to the control flags:

- HF: the totals from `Trainer.set_initial_training_values` (called on a stub, no model), `TrainerState.compute_steps`,
  and a real `CallbackHandler([DefaultFlowCallback()])`.
- ours: `plan_training`, `epoch_progress`, `step_end_flags` / `epoch_end_flags` merged into the control exactly as
  `HFTrainerFlow` does, dispatched through our `HFCallbackHandler` (which owns the flag resets).

The sets of steps (and epochs) at which each side logs, evaluates and saves must be equal. `save_strategy="best"`
saves on a new best of a scripted metric, as `_maybe_log_save_evaluate` does.
"""

from __future__ import annotations

import itertools
import math
import random
from types import SimpleNamespace
from typing import Any

import pytest
import transformers
from transformers import TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from hf_lightning.args import TrainingArguments
from hf_lightning.flow.hf_callbacks import HFCallbackHandler
from hf_lightning.plan import epoch_end_flags, epoch_progress, plan_training, step_end_flags

BATCH_SIZE = 4
SCORES = [0.5, 0.9, 0.4, 0.95, 0.95, 0.3, 0.99, 0.2]  # scripted eval metric (greater is better)


def _hf_totals(hf_args: Any, num_samples: int) -> dict[str, Any]:
    """HF's own numbers for a sized loader of `ceil(num_samples / BATCH_SIZE)` micro-batches."""
    loader = list(range(math.ceil(num_samples / BATCH_SIZE)))
    stub = SimpleNamespace(
        get_total_train_batch_size=lambda args: args.per_device_train_batch_size * args.gradient_accumulation_steps,
        get_sp_size=lambda: 1,
        num_examples=lambda dl: num_samples,
    )
    epochs, per_epoch, _, _, _, steps_in_epoch, max_steps = transformers.Trainer.set_initial_training_values(
        stub, hf_args, loader
    )
    state = TrainerState()
    state.compute_steps(hf_args, max_steps)
    return {
        "epochs": epochs, "per_epoch": per_epoch, "steps_in_epoch": steps_in_epoch, "max_steps": max_steps,
        "logging_steps": state.logging_steps, "eval_steps": state.eval_steps, "save_steps": state.save_steps,
    }


class _OurRules(transformers.TrainerCallback):
    """Our rules in the place of `DefaultFlowCallback` (first in the list, only raising flags, as `HFTrainerFlow`)."""

    def __init__(self, args: TrainingArguments, plan: Any) -> None:
        self.args, self.plan = args, plan

    def on_step_end(self, args, state, control, **kwargs):
        step_end_flags(state.global_step, self.args, self.plan).merge_into(control)

    def on_epoch_end(self, args, state, control, **kwargs):
        epoch_end_flags(state.epoch, self.args).merge_into(control)


def _run_loop(args: Any, handler: Any, totals: dict[str, Any], epoch_of: Any) -> dict[str, list]:
    """HF's loop skeleton (T:1652-1674, 1870-1999) with only the flags; returns the (step, epoch) of each action."""
    ga = args.gradient_accumulation_steps
    state = TrainerState(max_steps=totals["max_steps"], num_train_epochs=totals["epochs"])
    # the resolved intervals, as `TrainerState.compute_steps` (HF) or `HFTrainerFlow.on_train_start` (ours) set them
    state.logging_steps, state.eval_steps, state.save_steps = (
        totals["logging_steps"], totals["eval_steps"], totals["save_steps"]
    )
    control = TrainerControl()
    seen: dict[str, list] = {"log": [], "eval": [], "save": []}
    last_logged, evals = 0, 0

    def maybe_log_save_evaluate() -> None:
        nonlocal control, last_logged, evals
        if control.should_log and state.global_step > last_logged:
            last_logged = state.global_step
            seen["log"].append((state.global_step, state.epoch))
            control = handler.on_log(args, state, control, logs={})
        if control.should_evaluate:
            seen["eval"].append((state.global_step, state.epoch))
            score, evals = SCORES[evals % len(SCORES)], evals + 1
            new_best = state.best_metric is None or score > state.best_metric
            state.best_metric = max(score, state.best_metric or score)
            control = handler.on_evaluate(args, state, control, metrics={})
            if args.save_strategy == "best":
                control.should_save = new_best
        if control.should_save:
            seen["save"].append((state.global_step, state.epoch))
            control = handler.on_save(args, state, control)

    control = handler.on_train_begin(args, state, control)
    steps_in_epoch, per_epoch = totals["steps_in_epoch"], totals["per_epoch"]
    for epoch in range(totals["epochs"]):
        control = handler.on_epoch_begin(args, state, control)
        remainder = steps_in_epoch % ga or ga
        step = -1
        for update_step in range(per_epoch):
            for _ in range(ga if update_step != per_epoch - 1 else remainder):
                step += 1
                if step % ga == 0:
                    control = handler.on_step_begin(args, state, control)
                if (step + 1) % ga == 0 or step + 1 == steps_in_epoch:
                    state.global_step += 1
                    state.epoch = epoch_of(epoch, step + 1, steps_in_epoch)
                    control = handler.on_step_end(args, state, control)
                    maybe_log_save_evaluate()
                else:
                    control = handler.on_substep_end(args, state, control)
                if control.should_epoch_stop or control.should_training_stop:
                    break
            if control.should_epoch_stop or control.should_training_stop:
                break
        control = handler.on_epoch_end(args, state, control)
        maybe_log_save_evaluate()
        if control.should_training_stop:
            break
    return seen


def _simulate_hf(kwargs: dict[str, Any], num_samples: int) -> tuple[dict[str, Any], dict[str, list]]:
    args = transformers.TrainingArguments(output_dir="unused", use_cpu=True, report_to="none", **kwargs)
    totals = _hf_totals(args, num_samples)
    handler = CallbackHandler([DefaultFlowCallback()], None, None, None, None)
    return totals, _run_loop(args, handler, totals, lambda epoch, done, steps_in_epoch: epoch + done / steps_in_epoch)


def _simulate_ours(kwargs: dict[str, Any], num_samples: int) -> tuple[dict[str, Any], dict[str, list]]:
    args = TrainingArguments(output_dir="unused", use_cpu=True, report_to="none", **kwargs)
    plan = plan_training(args, math.ceil(num_samples / BATCH_SIZE))
    totals = {
        "epochs": plan.num_train_epochs, "per_epoch": plan.updates_per_epoch,
        "steps_in_epoch": plan.microbatches_per_epoch, "max_steps": plan.max_steps,
        "logging_steps": plan.logging_steps, "eval_steps": plan.eval_steps, "save_steps": plan.save_steps,
    }
    return totals, _run_loop(args, HFCallbackHandler([_OurRules(args, plan)]), totals, epoch_progress)


def _grid() -> list[dict[str, Any]]:
    """Every strategy triple, each with 8 seeded draws of the other settings, plus the spec's observed scenarios."""
    rng = random.Random(1234)
    cases: list[dict[str, Any]] = []
    for log_s, eval_s, save_s in itertools.product(("no", "steps", "epoch"), ("no", "steps", "epoch"),
                                                   ("no", "steps", "epoch", "best")):
        for _ in range(8):
            kwargs: dict[str, Any] = {
                "logging_strategy": log_s, "eval_strategy": eval_s, "save_strategy": save_s,
                "per_device_train_batch_size": BATCH_SIZE,
                "gradient_accumulation_steps": rng.choice([1, 2, 3]),
                "logging_first_step": rng.random() < 0.3,
                "logging_steps": rng.choice([1, 2, 3, 5, 0.1, 0.25, 0.33]),
                "save_steps": rng.choice([1, 2, 4, 7, 0.2, 0.5]),
            }
            eval_steps = rng.choice([None, 1, 2, 3, 4, 0.1, 0.3])
            if eval_steps is not None:
                kwargs["eval_steps"] = eval_steps
            if rng.random() < 0.4:
                kwargs["max_steps"] = rng.choice([1, 5, 11, 13])
            kwargs["num_train_epochs"] = rng.choice([1, 2, 3, 2.5, 0.4, 1.7])
            if rng.random() < 0.3:
                kwargs["eval_delay"] = rng.choice([4, 1, 1.5]) if eval_s == "epoch" else rng.choice([3, 4, 6])
            if save_s == "best":
                kwargs["metric_for_best_model"] = "accuracy"
            num_samples = rng.choice([4, 32, 36, 37, 40, 48])
            cases.append({"num_samples": num_samples, **kwargs})
    # configurations whose schedules were first read off real `transformers.Trainer` runs: the forced final eval /
    # save, epoch strategies with a short last window, fractional intervals rounded separately, eval_delay
    observed = [
        {"num_samples": 192, "logging_steps": 5, "eval_strategy": "steps", "eval_steps": 10, "save_steps": 10,
         "num_train_epochs": 1},
        {"num_samples": 36, "gradient_accumulation_steps": 2, "num_train_epochs": 2.5, "logging_strategy": "epoch",
         "eval_strategy": "epoch", "save_strategy": "epoch"},
        {"num_samples": 160, "max_steps": 40, "logging_steps": 0.1, "eval_strategy": "steps", "eval_steps": 0.25,
         "save_steps": 0.5},
        {"num_samples": 160, "max_steps": 42, "logging_steps": 0.1, "eval_strategy": "steps", "eval_steps": 0.25,
         "save_steps": 0.5},
        {"num_samples": 48, "max_steps": 12, "logging_first_step": True, "logging_steps": 5, "eval_strategy": "steps",
         "eval_steps": 3, "eval_delay": 6, "save_strategy": "no"},
        {"num_samples": 80, "max_steps": 20, "logging_steps": 3, "eval_strategy": "steps", "eval_steps": 5,
         "save_steps": 10},
        {"num_samples": 28, "max_steps": 7, "logging_first_step": True, "logging_steps": 2, "eval_strategy": "steps",
         "eval_steps": 3, "save_steps": 3},
    ]
    for case in observed:
        case.setdefault("per_device_train_batch_size", BATCH_SIZE)
    return cases + observed


GRID = _grid()


def _case_id(case: dict[str, Any]) -> str:
    short = {"logging_strategy": "log", "eval_strategy": "ev", "save_strategy": "sv", "gradient_accumulation_steps":
             "ga", "num_samples": "n", "max_steps": "max", "num_train_epochs": "ep", "logging_first_step": "first"}
    return ",".join(f"{short.get(k, k)}={v}" for k, v in case.items() if k != "per_device_train_batch_size")


def test_grid_is_large_enough() -> None:
    assert len(GRID) >= 200


@pytest.mark.parametrize("case", GRID, ids=[_case_id(c) for c in GRID])
def test_log_eval_save_steps_match_default_flow_callback(case: dict[str, Any]) -> None:
    kwargs = dict(case)
    num_samples = kwargs.pop("num_samples")
    hf_totals, hf_seen = _simulate_hf(kwargs, num_samples)
    our_totals, our_seen = _simulate_ours(kwargs, num_samples)
    assert our_totals == hf_totals
    for action in ("log", "eval", "save"):
        assert our_seen[action] == hf_seen[action], action


def test_observed_scenario_b_epoch_strategies() -> None:
    """9 batches/epoch, GA 2, 2.5 epochs: 13 updates, a partial last epoch logged/evaluated/saved at 2.667."""
    _, seen = _simulate_ours(
        {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_train_epochs": 2.5,
         "logging_strategy": "epoch", "eval_strategy": "epoch", "save_strategy": "epoch"}, 36,
    )
    assert [step for step, _ in seen["save"]] == [5, 10, 13]
    assert seen["eval"][-1][1] == pytest.approx(2 + 6 / 9)


def test_forced_final_eval_and_save_without_final_log() -> None:
    """The last update forces an evaluation and a save for "steps", but never a log (CB:594-606)."""
    _, seen = _simulate_ours(
        {"per_device_train_batch_size": 4, "max_steps": 7, "logging_first_step": True, "logging_steps": 2,
         "eval_strategy": "steps", "eval_steps": 3, "save_steps": 3}, 28,
    )
    assert [s for s, _ in seen["log"]] == [1, 2, 4, 6]
    assert [s for s, _ in seen["eval"]] == [3, 6, 7]
    assert [s for s, _ in seen["save"]] == [3, 6, 7]
