"""A `metric_for_best_model` that no evaluation can produce is refused before training (HF: `KeyError` after it).

The README's headline combination (two named eval sets, `load_best_model_at_end`, no `metric_for_best_model`) made
HF-style best-model tracking look for `eval_loss`, which named eval sets never produce (their keys are
`eval_dev_loss`, `eval_test_loss`): the run died after training, before any checkpoint.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import transformers
from helpers import classification_dataset, tiny_bert

import hf_lightning
from hf_lightning import HFTrainerFlow, TransformerDataModule, TransformerModule
from hf_lightning.plan import unreachable_best_metric


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


def _args(tmp_path, **kwargs) -> hf_lightning.TrainingArguments:
    base = dict(output_dir=str(tmp_path), eval_strategy="steps", eval_steps=2, save_steps=2, max_steps=4,
                per_device_train_batch_size=8, report_to="none", disable_tqdm=True)
    return hf_lightning.TrainingArguments(**{**base, **kwargs})


def _accuracy(pred) -> dict[str, float]:
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


@pytest.mark.parametrize(
    ("kwargs", "names", "loss_only", "expected"),
    [
        # named eval sets: every key is eval_<name>_<metric>
        ({"load_best_model_at_end": True}, ["dev", "test"], False, "'eval_dev_loss', 'eval_test_loss'"),
        ({"metric_for_best_model": "accuracy"}, ["dev", "test"], False, "'eval_dev_accuracy', 'eval_test_accuracy'"),
        ({"metric_for_best_model": "dev_accuracy"}, ["dev", "test"], False, None),
        ({"metric_for_best_model": "eval_test_loss", "load_best_model_at_end": True}, ["dev", "test"], True, None),
        ({"metric_for_best_model": "dev_accuracy"}, ["dev", "test"], True, "'eval_dev_loss'"),
        # one eval set: only a loss-only evaluation is certain to lack a metric
        ({"load_best_model_at_end": True}, None, True, None),
        ({"metric_for_best_model": "accuracy"}, None, False, None),
        ({"metric_for_best_model": "accuracy"}, [""], True, "no compute_metrics is given"),
        ({"metric_for_best_model": "accuracy", "prediction_loss_only": True}, None, False, "prediction_loss_only"),
        ({"metric_for_best_model": "eval_runtime"}, None, True, None),
        # nothing is looked up without evaluation or without a metric
        ({"metric_for_best_model": "accuracy", "eval_strategy": "no"}, ["dev"], True, None),
        ({}, ["dev", "test"], True, None),
    ],
)
def test_rule(tmp_path, kwargs, names, loss_only, expected):
    args = _args(tmp_path, **kwargs)
    problem = unreachable_best_metric(args, names, loss_only or args.prediction_loss_only)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem and "metric_for_best_model" in problem


def test_facade_refuses_when_train_starts(tmp_path):
    """The README's combination fails when `train()` starts, naming the keys to choose from, before any update (not
    in `Trainer(...)`: a method patched onto the instance afterwards, as HF's tests patch `_evaluate`, may make it)."""
    data = classification_dataset(16)
    args = _args(tmp_path, load_best_model_at_end=True)
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=data,
                                   eval_dataset={"dev": data, "test": data}, compute_metrics=_accuracy)
    with pytest.raises(ValueError, match="'eval_dev_loss', 'eval_test_loss'"):
        trainer.train()
    assert trainer.state.global_step == 0
    # the fix the message proposes trains, and tracks the best on the dev set
    args = _args(tmp_path, load_best_model_at_end=True, metric_for_best_model="eval_dev_loss")
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=data,
                                   eval_dataset={"dev": data, "test": data}, compute_metrics=_accuracy)
    trainer.train()
    assert trainer.state.best_metric is not None and trainer.state.best_model_checkpoint is not None


def test_hf_finds_out_only_at_the_first_evaluation(tmp_path):
    """The oracle: `transformers.Trainer` accepts the combination and fails after training has started."""
    data = classification_dataset(16)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), eval_strategy="steps", eval_steps=2, save_steps=2, max_steps=4,
        per_device_train_batch_size=8, report_to="none", disable_tqdm=True, load_best_model_at_end=True,
        use_cpu=True,
    )
    trainer = transformers.Trainer(model=tiny_bert(), args=args, train_dataset=data,
                                   eval_dataset={"dev": data, "test": data}, compute_metrics=_accuracy)
    with pytest.raises(KeyError, match="eval_loss"):
        trainer.train()
    assert trainer.state.global_step == 2  # two updates done (and lost: no checkpoint was written)


def test_hand_built_lightning_trainer_refuses_at_setup(tmp_path):
    """`HFTrainerFlow` runs the same check at `fit` setup, before the first update."""
    data = classification_dataset(16)
    args = _args(tmp_path, metric_for_best_model="accuracy")
    module = TransformerModule(tiny_bert(), args)  # no compute_metrics: the loss only
    datamodule = TransformerDataModule(train_dataset=data, eval_dataset=data, args=args)
    flow = HFTrainerFlow(args)
    trainer = pl.Trainer(callbacks=[flow], num_sanity_val_steps=0, use_distributed_sampler=False,
                         enable_checkpointing=False, logger=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="no compute_metrics is given"):
        trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 0
