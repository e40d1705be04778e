"""`evaluation_loop` / `prediction_loop` and the accelerate surface, each against `transformers.Trainer` (one process).

- A question-answering trainer written as HF's examples write it (tests/scripts/qa_loop.py: `evaluate` / `predict`
  overridden, `self.evaluation_loop` called with `compute_metrics` set to None, predictions post-processed) trains,
  evaluates during and after training and predicts exactly as the same class on `transformers.Trainer`.
- `evaluation_loop` on a user's own `DataLoader` returns HF's `EvalLoopOutput`, equal to HF's.
- An `evaluation_loop` override is honoured by `evaluate()`, `predict()` and the evaluations during `train()`.
- The accelerate members on `trainer.accelerator` and the trainer: what each answers on one process (the
  2-process answers are in tests/test_eval_loop_ddp.py), and what is refused by name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from helpers import tiny_bert
from torch.utils.data import DataLoader
from transformers.trainer_utils import EvalLoopOutput

import hf_lightning

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
import qa_loop  # noqa: E402

TIMING = qa_loop.TIMING


def _plain(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.endswith(TIMING)}


def test_qa_trainer_calling_evaluation_loop_matches_transformers(tmp_path):
    ours = qa_loop.collect(hf_lightning.Trainer, str(tmp_path / "ours"))
    hf = qa_loop.collect(transformers.Trainer, str(tmp_path / "hf"))
    assert len(ours["eval_logs"]) == 3  # steps 4 and 8 during train(), then evaluate()
    assert set(ours["evaluate"]) == {"eval_exact_match", "eval_f1", "eval_loss", "epoch"}
    assert set(ours["predict_metrics"]) == {"test_exact_match", "test_f1", "test_loss"}
    for key in ("eval_logs", "evaluate", "predict_metrics", "spans", "ids", "weights"):
        assert ours[key] == hf[key], key


def _loop_trainer(cls, tmp_path, **kwargs):
    args_cls = hf_lightning.TrainingArguments if cls is hf_lightning.Trainer else transformers.TrainingArguments
    args = args_cls(output_dir=str(tmp_path), per_device_eval_batch_size=4, report_to="none", disable_tqdm=True,
                    use_cpu=True, max_steps=4, per_device_train_batch_size=4, eval_strategy="steps", eval_steps=2,
                    save_strategy="no", logging_steps=2, learning_rate=5e-3, seed=3)
    extra = {"lightning_kwargs": {"accelerator": "cpu", "devices": 1}} if cls is hf_lightning.Trainer else {}
    return cls(model=qa_loop.qa_model(), args=args, train_dataset=qa_loop.qa_features(16, seed=1),
               eval_dataset=qa_loop.qa_features(10, seed=2), **extra, **kwargs)


def _columns(rows):
    keep = ("input_ids", "attention_mask", "start_positions", "end_positions")
    return {k: torch.tensor([row[k] for row in rows]) for k in keep}


@pytest.mark.parametrize("description", ["Evaluation", "Prediction"])
def test_evaluation_loop_on_a_users_dataloader_equals_hfs(tmp_path, description):
    features = qa_loop.qa_features(11, seed=5)
    outputs = []
    for cls in (hf_lightning.Trainer, transformers.Trainer):
        trainer = _loop_trainer(cls, tmp_path / cls.__module__.split(".")[0])
        loader = DataLoader(list(features), batch_size=4, collate_fn=_columns)  # the user's own (11 rows: 4, 4, 3)
        if cls is transformers.Trainer:
            # the oracle made right: HF repeats each batch loss `args.eval_batch_size` times whatever the loader's
            # batch size, and trims the last batch's repeats only for a loader its accelerator prepared; on a raw
            # loader, or one whose batch size is not `per_device_eval_batch_size`, its `eval_loss` is not the
            # per-sample mean (ours always is). Prepared, as HF's `get_eval_dataloader` does, with that size, it is
            loader = trainer.accelerator.prepare(loader)
        outputs.append(trainer.evaluation_loop(loader, description=description, metric_key_prefix="mine"))
    ours, hf = outputs
    assert isinstance(ours, EvalLoopOutput)
    assert ours.num_samples == hf.num_samples == 11
    for got, want in zip(ours.predictions, hf.predictions):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(ours.label_ids, hf.label_ids):
        np.testing.assert_array_equal(got, want)
    assert set(ours.metrics) == {"mine_loss"}  # no speed metrics: evaluate() / predict() add those
    assert _plain(ours.metrics) == _plain(hf.metrics)


def test_prediction_loop_is_evaluation_loop(tmp_path):
    trainer = _loop_trainer(hf_lightning.Trainer, tmp_path)
    loader = trainer.get_test_dataloader(qa_loop.qa_features(5, seed=6))
    legacy = trainer.prediction_loop(loader, description="Prediction")
    current = trainer.evaluation_loop(loader, description="Prediction")
    assert legacy.num_samples == current.num_samples == 5
    np.testing.assert_array_equal(legacy.predictions[0], current.predictions[0])
    assert legacy.metrics == current.metrics


def _counting_loop_class(base):
    class Counting(base):
        calls: list

        def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                            metric_key_prefix="eval"):
            self.calls.append((description, metric_key_prefix))
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                             metric_key_prefix)
            output.metrics[f"{metric_key_prefix}_samples_seen"] = float(output.num_samples)
            return output

    return Counting


def test_an_evaluation_loop_override_is_honoured_everywhere_as_in_hf(tmp_path):
    results = []
    for base in (hf_lightning.Trainer, transformers.Trainer):
        cls = _counting_loop_class(base)
        cls.calls = []
        trainer = _loop_trainer(cls, tmp_path / base.__module__.split(".")[0])
        trainer.train()
        evaluated = trainer.evaluate()
        predicted = trainer.predict(qa_loop.qa_features(6, seed=7))
        logs = [_plain(e) for e in trainer.state.log_history if "eval_loss" in e]
        results.append((list(cls.calls), logs, _plain(evaluated), _plain(predicted.metrics)))
    ours, hf = results
    assert ours[0] == [("Evaluation", "eval")] * 3 + [("Prediction", "test")]
    assert all(entry["eval_samples_seen"] == 10.0 for entry in ours[1])
    assert ours[3]["test_samples_seen"] == 6.0
    assert ours == hf


# ----- the accelerate surface, one process -----
def _bert_trainer(tmp_path, **args):
    defaults = dict(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, use_cpu=True)
    return hf_lightning.Trainer(model=tiny_bert(), args=hf_lightning.TrainingArguments(**{**defaults, **args}),
                                lightning_kwargs={"accelerator": "cpu", "devices": 1})


def test_accelerator_members_on_one_process(tmp_path):
    trainer = _bert_trainer(tmp_path)
    acc = trainer.accelerator
    assert (acc.num_processes, acc.process_index, acc.is_main_process, acc.is_local_main_process) == (1, 0, True, True)
    assert acc.use_distributed is False and acc.split_batches is False and acc.even_batches is True
    assert acc.parallelism_config is None
    assert acc.state.deepspeed_plugin is None and acc.state.fsdp_plugin is None
    assert trainer.is_deepspeed_enabled is False and trainer.is_fsdp_enabled is False
    t = torch.arange(6).reshape(3, 2)
    assert acc.gather(t) is t and acc.gather_for_metrics(t) is t
    assert acc.gather({"a": t})["a"] is t
    assert acc.gather_for_metrics(["x"], use_gather_object=True) == ["x"]
    assert acc.pad_across_processes(t, dim=1, pad_index=-100) is t
    assert acc.reduce(torch.tensor([2.0]), reduction="mean").tolist() == [2.0]
    with pytest.raises(ValueError, match="reduction='max'"):
        acc.reduce(torch.tensor([2.0]), reduction="max")
    acc.wait_for_everyone()  # no run yet: nothing to wait for
    assert acc.unwrap_model(trainer.model) is trainer.model
    assert acc.gradient_state.plugin_kwargs == {"num_steps": 1}  # as HF's Trainer configures accelerate
    with pytest.raises(AttributeError, match="has no 'register_for_checkpointing'"):
        acc.register_for_checkpointing  # noqa: B018


def test_prepare_is_identity_for_what_lightning_prepared(tmp_path):
    trainer = _bert_trainer(tmp_path)
    acc = trainer.accelerator
    optimizer = torch.optim.SGD(trainer.model.parameters(), lr=0.1)
    model, same_optimizer = acc.prepare(trainer.model, optimizer)
    assert model is trainer.model and same_optimizer is optimizer
    assert acc.prepare_model(trainer.model) is trainer.model
    reference = tiny_bert(seed=1)
    assert acc.prepare_model(reference, evaluation_mode=True) is reference  # moved to the device (the CPU)
    loader = DataLoader(list(range(4)), batch_size=2)
    prepared = acc.prepare(loader)  # one process: nothing to shard; `set_epoch` as accelerate's loader has it
    assert callable(prepared.set_epoch) and [b.tolist() for b in prepared] == [b.tolist() for b in loader]


def test_strategy_plugins_say_which_sharded_strategy_runs(tmp_path):
    deepspeed = _bert_trainer(tmp_path / "ds", deepspeed={"zero_optimization": {"stage": 2},
                                                           "train_micro_batch_size_per_gpu": "auto"})
    assert deepspeed.is_deepspeed_enabled and not deepspeed.is_fsdp_enabled
    plugin = deepspeed.accelerator.state.deepspeed_plugin
    assert plugin.kind == "deepspeed" and plugin.zero_stage == 2
    assert deepspeed.accelerator.state.fsdp_plugin is None
    with pytest.raises(AttributeError, match="deepspeed_plugin has no 'hf_ds_config'"):
        plugin.hf_ds_config  # noqa: B018
    for config, version in ((None, 2), ({"version": 1}, 1)):  # HF's default FSDP version is 2
        fsdp = _bert_trainer(tmp_path / f"fsdp{version}", fsdp="full_shard", fsdp_config=config)
        assert fsdp.is_fsdp_enabled and not fsdp.is_deepspeed_enabled
        assert fsdp.accelerator.state.deepspeed_plugin is None
        assert fsdp.accelerator.state.fsdp_plugin.fsdp_version == version


def test_trainer_attributes_subclasses_read_match_hf(tmp_path):
    seen = {}

    def recording(base):
        class Recording(base):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                if model.training:
                    with self.compute_loss_context_manager():
                        pass
                    seen.setdefault(base.__module__, []).append(
                        (self.is_in_train, self.current_gradient_accumulation_steps,
                         self.model_wrapped is self.model, self.accelerator.sync_gradients))
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return Recording

    for base in (hf_lightning.Trainer, transformers.Trainer):
        args_cls = hf_lightning.TrainingArguments if base is hf_lightning.Trainer else transformers.TrainingArguments
        args = args_cls(output_dir=str(tmp_path / base.__module__), max_steps=2, per_device_train_batch_size=2,
                        gradient_accumulation_steps=2, report_to="none", disable_tqdm=True, use_cpu=True,
                        save_strategy="no")
        trainer = recording(base)(model=tiny_bert(), args=args, train_dataset=qa_loop.qa_features(8, seed=1).map(
            lambda row: {"labels": row["start_positions"] % 2}).remove_columns(
            ["start_positions", "end_positions", "example_id"]))
        trainer.train()
        assert trainer.is_in_train is False
        seen[base.__module__ + ".columns"] = None
        if base is transformers.Trainer:
            trainer._set_signature_columns_if_needed()
        seen[base.__module__ + ".columns"] = list(trainer._signature_columns)
    assert seen["hf_lightning.trainer.facade"] == seen["transformers.trainer"]
    assert seen["hf_lightning.trainer.facade"] == [(True, 2, True, False), (True, 2, True, True)] * 2
    ours, hf = seen["hf_lightning.trainer.facade.columns"], seen["transformers.trainer.columns"]
    # HF appends `set(["label", "label_ids", *label_names])`: its order follows string hashing and `labels` (also a
    # forward parameter) appears twice; ours is the same columns, forward's order first, each once
    assert set(ours) == set(hf) and len(ours) == len(set(hf))
    assert ours[:len(ours) - 2] == hf[:len(ours) - 2]  # the forward parameters, in order


def test_signature_columns_override_decides_the_kept_columns_as_in_hf(tmp_path):
    """TRL's pattern: `_set_signature_columns_if_needed` overridden to set `_signature_columns` itself (here without
    `attention_mask`); the batches the loss sees have the same columns in both trainers."""
    from helpers import classification_dataset

    def recording(base):
        class Columns(base):
            def _set_signature_columns_if_needed(self):
                self.__dict__.setdefault("asked", 0)
                self.asked += 1
                if self._signature_columns is None:
                    self._signature_columns = ["input_ids", "label", "labels"]

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                self.__dict__.setdefault("keys", set()).add(tuple(sorted(inputs)))
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return Columns

    seen = {}
    for base in (hf_lightning.Trainer, transformers.Trainer):
        args_cls = hf_lightning.TrainingArguments if base is hf_lightning.Trainer else transformers.TrainingArguments
        args = args_cls(output_dir=str(tmp_path / base.__module__), max_steps=2, per_device_train_batch_size=2,
                        report_to="none", disable_tqdm=True, use_cpu=True, save_strategy="no")
        trainer = recording(base)(model=tiny_bert(), args=args, train_dataset=classification_dataset(n=8))
        assert trainer._signature_columns is None  # HF's: set at the first loader
        trainer.train()
        seen[base] = (trainer.keys, trainer._signature_columns, trainer.asked > 0)
    assert seen[hf_lightning.Trainer] == seen[transformers.Trainer]
    assert seen[transformers.Trainer][0] == {("input_ids", "labels")}
