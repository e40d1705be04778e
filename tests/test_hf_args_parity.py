"""Issue 22 items 14 and 15 against `transformers.Trainer`: the `greedy` scheduler and HF's rule for which schedulers
get the eval metric, `hub_strategy` / `debug`, the derived defaults of `TrainingArguments`, and its choice fields held
as HF's str enums."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType
from transformers.training_args import OptimizerNames

import hf_lightning
from helpers import CPU_QUIET, assert_logs_close, classification_dataset, stable_log, tiny_bert

TRAIN, EVAL = classification_dataset(32), classification_dataset(8, seed=1)


def run_args(**overrides) -> dict:
    """A tiny BERT classification run, evaluated after every update (HF's names, valid for both trainers)."""
    return {**dict(per_device_train_batch_size=4, max_steps=6, logging_steps=1, eval_strategy="steps", eval_steps=1,
                   save_strategy="no", learning_rate=1e-2, seed=7, report_to="none", disable_tqdm=True,
                   optim="adamw_torch"), **overrides}


def _pair(tmp_path, optimizers=None, **overrides):
    """The same run on both trainers: (ours, HF's), trained."""
    settings = run_args(**overrides)
    out = []
    for name, trainer_cls, args_cls, extra in (
            ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments, {"lightning_kwargs": dict(CPU_QUIET)}),
            ("hf", transformers.Trainer, transformers.TrainingArguments, {})):
        args = args_cls(output_dir=str(tmp_path / name), **({"use_cpu": True} if name == "hf" else {}), **settings)
        model = tiny_bert()
        opt = optimizers(model) if optimizers else (None, None)
        trainer = trainer_cls(model=model, args=args, train_dataset=TRAIN, eval_dataset=EVAL, optimizers=opt,
                              **extra)
        trainer.train()
        out.append(trainer)
    return out


def test_greedy_scheduler_steps_on_the_eval_metric_as_hf(tmp_path):
    ours, hf = _pair(tmp_path, lr_scheduler_type="greedy", lr_scheduler_kwargs={"patience": 1, "cooldown": 0})
    assert ours.args.metric_for_best_model == hf.args.metric_for_best_model == "loss"
    assert_logs_close(stable_log(ours), stable_log(hf))
    assert len({e["learning_rate"] for e in stable_log(hf) if "learning_rate" in e}) > 1  # the LR moved


class _MetricStepped(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """A user's scheduler: a subclass of a metric-stepped class, so HF passes the metric to its `step`."""

    def step(self, metrics, epoch=None):  # type: ignore[override]
        self.seen = [*getattr(self, "seen", []), float(metrics)]
        super().step(metrics)


def test_a_users_metric_scheduler_gets_the_metric_by_hfs_rule(tmp_path):
    """HF passes the metric to a scheduler that is a `ReduceLROnPlateau` or a `GreedyLR` (subclasses included)."""
    def make(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        return optimizer, _MetricStepped(optimizer, patience=0, factor=0.5)

    ours, hf = _pair(tmp_path, optimizers=make, metric_for_best_model="loss")  # HF needs it named (T:3325)
    assert ours.lr_scheduler.seen == pytest.approx(hf.lr_scheduler.seen, rel=1e-5)
    assert len(hf.lr_scheduler.seen) == 6
    user_greedy = transformers.GreedyLR

    def make_greedy(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        return optimizer, user_greedy(optimizer, patience=1)

    ours, hf = _pair(tmp_path / "greedy", optimizers=make_greedy, metric_for_best_model="loss")
    assert_logs_close(stable_log(ours), stable_log(hf))


def test_hub_strategy_and_debug_are_accepted_as_hf(tmp_path):
    for value in ("end", "checkpoint", "all_checkpoints"):
        ours = hf_lightning.TrainingArguments(output_dir=str(tmp_path), hub_strategy=value)
        assert ours.hub_strategy == transformers.TrainingArguments(output_dir=str(tmp_path), hub_strategy=value
                                                                   ).hub_strategy
    ours = hf_lightning.TrainingArguments(output_dir=str(tmp_path), debug="underflow_overflow")
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), debug="underflow_overflow")
    assert ours.debug == hf.debug and repr(ours.debug) == repr(hf.debug)
    assert hf_lightning.TrainingArguments(output_dir=str(tmp_path)).debug == []
    with pytest.raises(ValueError, match="`debug` option 'tpu_metrics_debug' is not supported"):
        hf_lightning.TrainingArguments(output_dir=str(tmp_path), debug="tpu_metrics_debug")


def test_debug_underflow_overflow_stops_at_the_first_inf_as_hf(tmp_path):
    """HF hooks `DebugUnderflowOverflow` on the model; a weight set to inf makes the first forward raise."""
    errors = []
    for name, trainer_cls, args_cls, extra in (
            ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments, {"lightning_kwargs": dict(CPU_QUIET)}),
            ("hf", transformers.Trainer, transformers.TrainingArguments, {})):
        model = tiny_bert()
        with torch.no_grad():
            model.bert.encoder.layer[0].intermediate.dense.weight[0, 0] = float("inf")
        args = args_cls(output_dir=str(tmp_path / name), debug="underflow_overflow",
                        **({"use_cpu": True} if name == "hf" else {}), **run_args(eval_strategy="no"))
        with pytest.raises(ValueError) as info:
            trainer_cls(model=model, args=args, train_dataset=TRAIN, **extra).train()
        errors.append(str(info.value))
    assert "DebugUnderflowOverflow: inf/nan detected" in errors[1]
    assert errors[0] == errors[1]


def test_derived_defaults_as_hf(tmp_path, monkeypatch):
    ours = hf_lightning.TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    assert ours.dataloader_pin_memory == hf.dataloader_pin_memory
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://localhost:1")
    for report_to in (None, "all", "none"):
        kwargs = {} if report_to is None else {"report_to": report_to}
        ours = hf_lightning.TrainingArguments(output_dir=str(tmp_path), **kwargs)
        hf = transformers.TrainingArguments(output_dir=str(tmp_path), **kwargs)
        assert ("kubeflow" in ours.report_to) == ("kubeflow" in hf.report_to), (report_to, hf.report_to)


def test_choice_fields_are_hfs_str_enums(tmp_path):
    ours = hf_lightning.TrainingArguments(output_dir=str(tmp_path), eval_strategy="steps", save_strategy="best",
                                          metric_for_best_model="loss", lr_scheduler_type="cosine",
                                          optim="adamw_torch_fused")
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), eval_strategy="steps", save_strategy="best",
                                        metric_for_best_model="loss", lr_scheduler_type="cosine",
                                        optim="adamw_torch_fused")
    for name, enum in (("eval_strategy", IntervalStrategy), ("logging_strategy", IntervalStrategy),
                       ("save_strategy", SaveStrategy), ("lr_scheduler_type", SchedulerType),
                       ("optim", OptimizerNames), ("hub_strategy", transformers.trainer_utils.HubStrategy)):
        # our classes mirror HF's (the arguments are built without importing transformers: hf_lightning/args/enums.py)
        assert type(getattr(hf, name)) is enum and type(getattr(ours, name)).__name__ == enum.__name__, name
        assert repr(getattr(ours, name)) == repr(getattr(hf, name)), name
        assert getattr(ours, name) == getattr(hf, name) and hash(getattr(ours, name)) == hash(getattr(hf, name))
    assert ours.optim.value == "adamw_torch_fused"
    assert f"{ours.optim}" == f"{hf.optim}" == "OptimizerNames.ADAMW_TORCH_FUSED"
    # a str-mixin enum hashes as its value, so lookups by the plain string still find it
    assert {"adamw_torch_fused": 1}[ours.optim] == 1 and ours.optim == "adamw_torch_fused"
    assert ours.to_dict()["optim"] == hf.to_dict()["optim"] == "adamw_torch_fused"
    assert ours.to_json_string()
    assert hf_lightning.TrainingArguments(**{k: v for k, v in ours.to_dict().items()
                                             if not k.endswith("_token")}).optim == OptimizerNames.ADAMW_TORCH_FUSED


def test_our_enums_mirror_hfs():
    """Every member of our enums is HF's member of the same name and value (guards a drift after an upgrade)."""
    from transformers.debug_utils import DebugOption

    from hf_lightning.args import enums

    for theirs in (IntervalStrategy, SaveStrategy, SchedulerType, OptimizerNames, DebugOption,
                   transformers.trainer_utils.HubStrategy):
        mine = getattr(enums, theirs.__name__)
        assert all(theirs[m.name].value == m.value for m in mine), theirs
        assert [m.value for m in mine] == [m.value for m in theirs], theirs
    assert transformers.get_scheduler(enums.SchedulerType.CONSTANT, torch.optim.SGD([torch.zeros(1)], lr=1.0))
