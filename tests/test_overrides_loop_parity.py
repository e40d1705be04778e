"""Overrides of HF's loop methods (`log`, `evaluate`, `_evaluate`, `_maybe_log_save_evaluate`, `floating_point_ops`,
`save_model`, `num_examples`) and a `Seq2SeqTrainer` subclass: the same body in a `transformers` subclass and in an
`hf_lightning` subclass gives the same logs, evaluations, checkpoints and call counts (the set-up is
test_overrides_parity.py's)."""

from __future__ import annotations

import copy
import os
from collections import Counter

import pytest
import torch
import transformers
from gen_helpers import seq2seq_dataset, tiny_t5, word_tokenizer
from helpers import lm_dataset
from test_overrides_parity import (
    COMMON,
    LIGHTNING_KWARGS,
    Counting,
    assert_same_run,
    gpt2,
    losses,
    pair,
    stable,
    with_base,
)
from transformers import DataCollatorForSeq2Seq

import hf_lightning
from hf_lightning.tasks.text_metrics import build_text_metrics


def test_log_adding_a_key(tmp_path, one_thread):
    def log(self, logs, start_time=None):
        self.count("log")
        logs["seen_at_step"] = self.state.global_step
        super(self._base, self).log(logs, start_time)

    hf, ours = pair(with_base({"log": log}), tmp_path=tmp_path)
    assert_same_run(hf, ours)  # every entry (losses, evaluations, the summary) has the key, as in HF
    assert all("seen_at_step" in entry for entry in ours.state.log_history)
    assert ours.calls["log"] == 6 + 3 + 1


def evaluate_adding_a_metric(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
    self.count("evaluate")
    metrics = super(self._base, self).evaluate(eval_dataset, ignore_keys, metric_key_prefix)
    if f"{metric_key_prefix}_loss" in metrics:  # one dataset (a dict's call merges its datasets' metrics)
        metrics[f"{metric_key_prefix}_doubled_loss"] = 2 * metrics[f"{metric_key_prefix}_loss"]
    return metrics


@pytest.mark.parametrize("named", [False, True], ids=["one", "named"])
def test_evaluate_override_is_called_during_training(named, tmp_path, one_thread):
    """HF's `_evaluate` calls `self.evaluate()`: the override runs at every evaluation of `train()`, and what it
    returns decides the best metric. With named datasets HF's `evaluate` calls `self.evaluate` once per dataset."""
    eval_dataset = {"a": lm_dataset(n=6, seed=1), "b": lm_dataset(n=5, seed=2)} if named else lm_dataset(n=10, seed=1)
    metric = "a_doubled_loss" if named else "doubled_loss"
    hf, ours = pair(with_base({"evaluate": evaluate_adding_a_metric}), eval_dataset=eval_dataset,
                    hf_args={"metric_for_best_model": metric, "greater_is_better": False}, tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert ours.calls["evaluate"] == 3 * (3 if named else 1)
    losses_a = [e["eval_a_loss" if named else "eval_loss"] for e in ours.state.log_history
                if ("eval_a_loss" if named else "eval_loss") in e]
    assert ours.state.best_metric == hf.state.best_metric == pytest.approx(2 * min(losses_a), rel=1e-5)


def test_evaluate_override_evaluating_another_dataset_during_training(tmp_path, one_thread):
    extra = lm_dataset(n=7, seed=3)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        self.count("evaluate")
        metrics = super(self._base, self).evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        if metric_key_prefix == "eval":
            metrics.update(super(self._base, self).evaluate(extra, ignore_keys, "extra"))
        return metrics

    hf, ours = pair(with_base({"evaluate": evaluate}), tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert len([e for e in ours.state.log_history if "extra_loss" in e]) == 3


def test_maybe_log_save_evaluate_override(tmp_path, one_thread):
    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                 learning_rate=None):
        self.count("_maybe_log_save_evaluate")
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            self.log({"weight_norm": float(sum(p.detach().pow(2).sum() for p in model.parameters()))})
        super(self._base, self)._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch,
                                                        ignore_keys_for_eval, start_time, learning_rate=learning_rate)

    hf, ours = pair(with_base({"_maybe_log_save_evaluate": _maybe_log_save_evaluate}), tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert ours.calls["_maybe_log_save_evaluate"] == 6 + 1  # after every update, and at the epoch's end
    assert len([e for e in ours.state.log_history if "weight_norm" in e]) == 6


def test_private_evaluate_override(tmp_path, one_thread):
    """HF's loop calls `_evaluate` at every evaluation of `train()`: an override runs there (the flow calls the
    trainer's `_evaluate` only when its class overrides it), and `super()` reaches the built-in evaluation."""
    def _evaluate(self, trial, ignore_keys_for_eval, skip_scheduler=False):
        self.count("_evaluate")
        metrics = super(self._base, self)._evaluate(trial, ignore_keys_for_eval, skip_scheduler)
        self.log({"evaluated_at": float(self.state.global_step)})
        return metrics

    hf, ours = pair(with_base({"_evaluate": _evaluate}), tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert ours.calls["_evaluate"] == 3
    assert [e["evaluated_at"] for e in ours.state.log_history if "evaluated_at" in e] == [2.0, 4.0, 6.0]


def test_floating_point_ops_override(tmp_path, one_thread):
    def floating_point_ops(self, inputs):
        self.count("floating_point_ops")
        return 1000 * inputs["input_ids"].shape[0]

    hf, ours = pair({"floating_point_ops": floating_point_ops}, tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert ours.state.total_flos == hf.state.total_flos == 1000 * 22
    assert ours.calls["floating_point_ops"] == 11


def test_save_model_override_writes_every_checkpoint(tmp_path, one_thread):
    def save_model(self, output_dir=None, _internal_call=False):
        self.count(f"save_model(internal={_internal_call})")
        super(self._base, self).save_model(output_dir, _internal_call)
        with open(os.path.join(output_dir, "extra.txt"), "w") as f:
            f.write(str(self.state.global_step))

    hf, ours = pair(with_base({"save_model": save_model}), hf_args={"save_strategy": "steps", "save_steps": 3},
                    tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert ours.calls["save_model(internal=True)"] == 2
    for step in (3, 6):
        folder = tmp_path / "ours" / f"checkpoint-{step}"
        assert (folder / "extra.txt").read_text() == str(step) and (folder / "model.safetensors").is_file()
        assert (folder / "trainer_state.json").is_file()
    ours.save_model(str(tmp_path / "final"))
    assert (tmp_path / "final" / "extra.txt").is_file() and ours.calls["save_model(internal=False)"] == 1


def test_num_examples_override(tmp_path, one_thread):
    def num_examples(self, dataloader):
        self.count("num_examples")
        return 1000

    hf, ours = pair({"num_examples": num_examples}, tmp_path=tmp_path)
    assert_same_run(hf, ours)
    summaries = [trainer.state.log_history[-1] for trainer in (hf, ours)]
    # `train_samples_per_second / train_steps_per_second` is `num_examples * epochs / max_steps` (HF's rule)
    ratios = [s["train_samples_per_second"] / s["train_steps_per_second"] for s in summaries]
    assert ratios[1] == pytest.approx(ratios[0], rel=0.05) and ratios[1] == pytest.approx(1000 / 6, rel=0.05)


# ----- a Seq2SeqTrainer subclass -----
def seq2seq_pair(body, tmp_path):
    tok = word_tokenizer()
    common = dict(per_device_train_batch_size=4, per_device_eval_batch_size=4, predict_with_generate=True,
                  generation_max_length=8, report_to="none", seed=3, learning_rate=1e-2, max_steps=4,
                  eval_strategy="steps", eval_steps=2, logging_steps=1, save_strategy="no", disable_tqdm=True)
    model = tiny_t5()
    trainers = []
    for base, args_cls, extra in (
        (transformers.Seq2SeqTrainer, transformers.Seq2SeqTrainingArguments, {"use_cpu": True}),
        (hf_lightning.Seq2SeqTrainer, hf_lightning.Seq2SeqTrainingArguments, {}),
    ):
        cls = type("Sub", (Counting, base), dict(body))
        copy_ = copy.deepcopy(model)
        kwargs = {"lightning_kwargs": dict(LIGHTNING_KWARGS)} if base is hf_lightning.Seq2SeqTrainer else {}
        trainer = cls(model=copy_, args=args_cls(output_dir=str(tmp_path / base.__module__), **common, **extra),
                      data_collator=DataCollatorForSeq2Seq(tok, model=copy_), processing_class=tok,
                      compute_metrics=build_text_metrics(tok), train_dataset=seq2seq_dataset(tok, 16, seed=5),
                      eval_dataset=seq2seq_dataset(tok, 8, seed=6), **kwargs)
        trainer.calls = Counter()
        trainer.train()
        trainers.append(trainer)
    return trainers


def test_seq2seq_trainer_subclass(tmp_path, one_thread):
    """`compute_loss` doubling the training loss (HF's generation evaluation takes the model's loss, not
    `compute_loss`) and a `prediction_step` calling `super()` with `generate` kwargs."""
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.count("compute_loss")
        loss, outputs = super(self._base, self).compute_loss(model, inputs, True, num_items_in_batch)
        return (2 * loss, outputs) if return_outputs else 2 * loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        self.count("prediction_step")
        return super(self._base, self).prediction_step(model, inputs, prediction_loss_only, ignore_keys,
                                                       **gen_kwargs)

    hf, ours = seq2seq_pair(with_base({"compute_loss": compute_loss, "prediction_step": prediction_step}), tmp_path)
    assert_same_run(hf, ours, weights_atol=1e-5)
    assert ours.calls["compute_loss"] == 4 and ours.calls["prediction_step"] == 2 * 2
    assert len([e for e in stable(ours.state.log_history) if "eval_sacrebleu" in e]) == 2
    assert losses(ours)[0] > 2  # the doubled loss of an untrained model over a 43-token vocabulary


# ----- resume with an overridden get_train_dataloader -----
def test_resume_with_an_overridden_train_loader_is_exact(tmp_path, one_thread):
    """A custom (sequential) train loader: resuming mid-epoch skips its already-trained batches without loading them
    and continues exactly as the uninterrupted run."""
    from torch.utils.data import DataLoader, SequentialSampler

    from helpers import RecordingDataset

    class Sequential(hf_lightning.Trainer):
        def get_train_dataloader(self):
            return DataLoader(self.train_dataset, batch_size=self._train_batch_size, collate_fn=self.data_collator,
                              sampler=SequentialSampler(self.train_dataset))

    def train(folder, resume=None):
        data = RecordingDataset(lm_dataset(n=22))
        args = hf_lightning.TrainingArguments(output_dir=str(folder), **{**COMMON, "save_strategy": "steps",
                                                                         "save_steps": 1, "num_train_epochs": 2})
        trainer = Sequential(model=gpt2(), args=args, train_dataset=data, eval_dataset=lm_dataset(n=10, seed=1),
                             lightning_kwargs=dict(LIGHTNING_KWARGS))
        trainer.train(resume_from_checkpoint=resume)
        return trainer, data.seen

    full, _ = train(tmp_path / "full")
    resumed, seen = train(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-4"))
    later = [e for e in stable(full.state.log_history) if e["step"] > 4 and "train_loss" not in e]
    assert [e for e in stable(resumed.state.log_history) if e["step"] > 4 and "train_loss" not in e] == later
    assert seen == list(range(16, 22)) + list(range(22))  # the first 8 micro-batches were never loaded
    assert all(torch.equal(a, b) for a, b in zip(full.model.state_dict().values(),
                                                 resumed.model.state_dict().values()))
