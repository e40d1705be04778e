"""The HF-private hooks library subclasses override (sentence-transformers, TRL), honoured at HF's points: each one as
an override of a plain `transformers.Trainer` subclass against the same body on `hf_lightning.Trainer` (the real
`transformers.Trainer` is the oracle; `pair` is tests/test_overrides_parity.py's).

`_save`, `_load_from_checkpoint`, `_load_best_model`, `_push_from_checkpoint`; the writable attributes
`can_return_loss`, `model_accepts_loss_kwargs`, `label_names`; `accelerator.even_batches` and `prepare(DataLoader)`;
`accelerator_config={"use_configured_state": True}`.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import transformers
import torch.nn.functional as F
from test_overrides_parity import assert_same_run, lm_dataset, pair, stable, tiny_gpt2, with_base
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

import hf_lightning
from hf_lightning.data.windows import EpochLoader

SAVING = {"save_strategy": "steps", "save_steps": 3, "eval_strategy": "no"}


# ----- _save -----
def recording_save(self, output_dir=None, state_dict=None):
    self.count(f"_save(state_dict={'None' if state_dict is None else 'given'})")
    super(self._base, self)._save(output_dir, state_dict)
    with open(os.path.join(output_dir, "extra.txt"), "w") as f:
        f.write(str(self.state.global_step))


def test_save_override_writes_every_checkpoint_and_the_final_model(tmp_path, one_thread):
    hf, ours = pair(with_base({"_save": recording_save}), hf_args=SAVING, tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert ours.calls["_save(state_dict=None)"] == 2  # HF's call from save_model, for each checkpoint
    for step in (3, 6):
        folder = tmp_path / "ours" / f"checkpoint-{step}"
        assert (folder / "extra.txt").read_text() == str(step)
        assert (folder / "model.safetensors").is_file() and (folder / "checkpoint_manifest.json").is_file()
        hf_weights = (tmp_path / "hf" / f"checkpoint-{step}" / "model.safetensors").read_bytes()
        assert len(hf_weights) > 0
    for trainer in (hf, ours):
        trainer.save_model(str(tmp_path / f"final-{type(trainer).__mro__[2].__module__}"))
    assert ours.calls == hf.calls and ours.calls["_save(state_dict=None)"] == 3
    assert (tmp_path / "final-hf_lightning.trainer.facade" / "extra.txt").read_text() == "6"


def test_save_override_refuses_save_async_naming_it(tmp_path):
    cls = type("Sub", (hf_lightning.Trainer,), {"_save": lambda self, output_dir=None, state_dict=None: None})
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), save_async=True, report_to="none")
    with pytest.raises(ValueError, match="save_async=True cannot be combined with an overridden _save"):
        cls(model=tiny_gpt2(), args=args, train_dataset=lm_dataset(n=4))


# ----- _load_from_checkpoint -----
def recording_load(self, resume_from_checkpoint, model=None):
    self.count(f"_load_from_checkpoint({os.path.basename(resume_from_checkpoint)}, model={model is not None})")
    super(self._base, self)._load_from_checkpoint(resume_from_checkpoint, model)


def test_load_from_checkpoint_override_loads_the_weights_at_resume(tmp_path, one_thread):
    body = with_base({"_load_from_checkpoint": recording_load})
    hf, ours = pair(body, hf_args=SAVING, tmp_path=tmp_path)
    assert hf.calls == ours.calls and not ours.calls  # not called by a run from scratch
    hf_again, ours_again = pair(body, hf_args=SAVING, run=False, tmp_path=tmp_path / "again")
    hf_again.train(resume_from_checkpoint=str(tmp_path / "hf" / "checkpoint-3"))
    ours_again.train(resume_from_checkpoint=str(tmp_path / "ours" / "checkpoint-3"))
    assert ours_again.calls == hf_again.calls == {"_load_from_checkpoint(checkpoint-3, model=False)": 1}
    assert_same_run(hf_again, ours_again)
    for name, tensor in ours.model.state_dict().items():  # and the resumed run ends where the uninterrupted one did
        torch.testing.assert_close(ours_again.model.state_dict()[name], tensor, rtol=0, atol=0)


def test_load_from_checkpoint_override_decides_what_is_loaded(tmp_path, one_thread):
    """An override that loads nothing (a format of its own) is what runs: the built-in does not load behind it."""
    def load_nothing(self, resume_from_checkpoint, model=None):
        self.count("_load_from_checkpoint")

    hf, ours = pair({"_load_from_checkpoint": load_nothing}, hf_args=SAVING, tmp_path=tmp_path)
    fresh = {name: tensor.clone() for name, tensor in tiny_gpt2().state_dict().items()}
    _, ours_again = pair({"_load_from_checkpoint": load_nothing}, hf_args={**SAVING, "max_steps": 3}, run=False,
                         tmp_path=tmp_path / "again")
    ours_again.train(resume_from_checkpoint=str(tmp_path / "ours" / "checkpoint-3"))  # nothing left to train
    assert ours_again.calls["_load_from_checkpoint"] == 1
    for name, tensor in fresh.items():  # still the initial weights: the checkpoint's were not loaded
        torch.testing.assert_close(ours_again.model.state_dict()[name], tensor, rtol=0, atol=0)


# ----- _load_best_model -----
def recording_load_best(self):
    self.count(f"_load_best_model({os.path.basename(self.state.best_model_checkpoint)})")
    super(self._base, self)._load_best_model()


def test_load_best_model_override_is_called_once_at_the_end(tmp_path, one_thread):
    settings = {"save_strategy": "steps", "save_steps": 2, "load_best_model_at_end": True,
                "metric_for_best_model": "loss", "greater_is_better": True}  # the first evaluation stays the best
    hf, ours = pair(with_base({"_load_best_model": recording_load_best}), hf_args=settings, tmp_path=tmp_path)
    assert ours.calls == hf.calls == {"_load_best_model(checkpoint-2)": 1}
    assert_same_run(hf, ours)


# ----- _push_from_checkpoint -----
def test_push_from_checkpoint_override_is_accepted_and_never_called_without_the_hub(tmp_path, one_thread):
    def push(self, checkpoint_folder):
        self.count("_push_from_checkpoint")

    hf, ours = pair({"_push_from_checkpoint": push}, hf_args=SAVING, tmp_path=tmp_path)
    assert ours.calls == hf.calls == {}
    with pytest.raises(ValueError, match="push_to_hub"):  # the Hub itself is refused, by name
        hf_lightning.TrainingArguments(output_dir=str(tmp_path / "x"), push_to_hub=True)


# ----- the writable attributes -----
class SelfSupervised(nn.Module):
    """A model whose forward returns a loss without labels (next-token on its inputs), not a `PreTrainedModel`."""

    def __init__(self, vocab: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.vocab = vocab
        self.embed, self.head = nn.Embedding(vocab, 8), nn.Linear(8, vocab)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        logits = self.head(self.embed(input_ids))
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, self.vocab), input_ids[:, 1:].reshape(-1))
        return {"loss": loss, "logits": logits}


def test_can_return_loss_and_label_names_set_on_the_trainer_are_honoured(tmp_path, one_thread):
    """HF reads `self.can_return_loss` and `self.label_names` in `prediction_step`: with no label names and
    `can_return_loss = True` (sentence-transformers sets it) a batch without labels gets its loss."""
    unlabelled = lm_dataset(n=8, seed=1).remove_columns("labels")
    hf, ours = pair({}, model_fn=SelfSupervised, eval_dataset=unlabelled, run=False,
                    hf_args={"eval_strategy": "no", "remove_unused_columns": False}, tmp_path=tmp_path)
    assert ours.can_return_loss is hf.can_return_loss is False  # the forward has no `return_loss` argument
    before = {trainer: trainer.evaluate() for trainer in (hf, ours)}
    assert "eval_loss" not in before[hf] and "eval_loss" not in before[ours]
    for trainer in (hf, ours):
        trainer.label_names = []
        trainer.can_return_loss = True
    after = {trainer: stable([trainer.evaluate()])[0] for trainer in (hf, ours)}
    assert "eval_loss" in after[hf] and "eval_loss" in after[ours]  # (HF adds `eval_model_preparation_time`)
    assert after[ours]["eval_loss"] == pytest.approx(after[hf]["eval_loss"], rel=1e-6)


def init_without_loss_kwargs(self, *args, **kwargs):
    super(self._base, self).__init__(*args, **kwargs)
    self.model_accepts_loss_kwargs = False  # as a library subclass sets such attributes after HF's `__init__`


def passthrough_compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
    return super(self._base, self).compute_loss(model, inputs, return_outputs, num_items_in_batch)


def test_model_accepts_loss_kwargs_set_on_the_trainer_is_honoured_and_kept(tmp_path, one_thread):
    """False makes HF average the micro-batch means of an update (instead of normalising by its label tokens). It
    matters under HF's loss rule, which a `compute_loss` override puts in force (sentence-transformers has one);
    without one hf_lightning normalises every model by its label tokens (README "Differences")."""
    body = with_base({"__init__": init_without_loss_kwargs, "compute_loss": passthrough_compute_loss})
    hf, ours = pair(body, hf_args={"eval_strategy": "no"}, tmp_path=tmp_path)
    assert hf.model_accepts_loss_kwargs is ours.model_accepts_loss_kwargs is False
    assert_same_run(hf, ours)
    default, _ = pair(with_base({"compute_loss": passthrough_compute_loss}), hf_args={"eval_strategy": "no"},
                      tmp_path=tmp_path / "default", run=False)
    default.train()
    assert stable(default.state.log_history)[0]["loss"] != stable(hf.state.log_history)[0]["loss"]  # it matters
    ours.model = copy.deepcopy(ours.model)  # a new model rebuilds the module: the value set stays, as in HF
    assert ours.module.model_accepts_loss_kwargs is False


# ----- accelerator -----
def test_use_configured_state_needs_a_state_as_in_hf(tmp_path):
    """`use_configured_state=True` reuses an accelerate state configured before the arguments: without one it is
    HF's `ValueError` on both (HF's `test_accelerator_custom_state`); with one it is accepted and popped as HF pops
    it."""
    from accelerate.state import AcceleratorState, PartialState

    config = {"use_configured_state": True}
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        for args_cls in (transformers.TrainingArguments, hf_lightning.TrainingArguments):
            with pytest.raises(ValueError, match="requires a pre-configured `AcceleratorState` or `PartialState`"):
                args_cls(output_dir=str(tmp_path), accelerator_config=config)
        PartialState(cpu=True)
        args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), accelerator_config=config)
        assert args.accelerator_config.to_dict() == transformers.TrainingArguments(
            output_dir=str(tmp_path), accelerator_config=config).accelerator_config.to_dict()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_accumulation_kwargs_hf_does_not_read_are_kept_as_given(tmp_path):
    """`adjust_scheduler` / `sync_with_dataloader` change nothing in HF's Trainer (it syncs and steps the scheduler on
    an update's last micro-batch itself): both trainers accept them and show them in `gradient_state.plugin_kwargs`."""
    config = {"gradient_accumulation_kwargs": {"adjust_scheduler": False, "sync_with_dataloader": False}}
    kwargs = []
    for trainer_cls, args_cls, extra in ((transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True}),
                                         (hf_lightning.Trainer, hf_lightning.TrainingArguments, {})):
        trainer = trainer_cls(model=tiny_gpt2(), args=args_cls(output_dir=str(tmp_path), accelerator_config=config,
                                                               report_to="none", **extra))
        kwargs.append(trainer.accelerator.gradient_state.plugin_kwargs)
    assert kwargs[0] == kwargs[1] == {"num_steps": 1, "adjust_scheduler": False, "sync_with_dataloader": False}


class EpochBatches(BatchSampler):
    """Batches of 2 in an order that depends on the epoch (as sentence-transformers' samplers' `set_epoch`)."""

    def __init__(self, n: int) -> None:
        super().__init__(SequentialSampler(range(n)), batch_size=2, drop_last=False)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        batches = list(super().__iter__())
        return iter(batches[self.epoch:] + batches[: self.epoch])


def test_even_batches_is_settable_and_prepare_gives_accelerates_loader(tmp_path):
    trainer = hf_lightning.Trainer(model=tiny_gpt2(), args=hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), report_to="none"), train_dataset=lm_dataset(n=4))
    accelerator = trainer.accelerator
    assert accelerator.even_batches is True  # accelerate's default, `args.accelerator_config.even_batches`
    accelerator.even_batches = False
    assert trainer.accelerator.even_batches is False  # kept on the trainer (a new accelerator object each access)
    loader = DataLoader(list(range(8)), batch_sampler=EpochBatches(8))
    prepared = trainer.accelerator.prepare(loader)
    assert isinstance(prepared, EpochLoader) and [b.tolist() for b in prepared] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    prepared.set_epoch(1)  # what HF's loop does every epoch, reaching the batch sampler as accelerate's loader does
    assert [b.tolist() for b in prepared] == [[2, 3], [4, 5], [6, 7], [0, 1]]


def test_batch_shards_are_accelerates_where_no_sample_repeats():
    from hf_lightning.data.sampling import BatchShard, batch_shard_problem

    batches = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [list(BatchShard(batches, 2, rank)) for rank in (0, 1)] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert batch_shard_problem(4, True, 2, even_batches=True) is None
    assert batch_shard_problem(4, False, 2, even_batches=False) is None  # a short last batch, nothing repeated
    assert "one batch fewer" in batch_shard_problem(3, True, 2, even_batches=False)
    assert "repeat batches" in batch_shard_problem(3, True, 2, even_batches=True)
    assert "last batch is short and even_batches=True" in batch_shard_problem(4, False, 2, even_batches=True)


def test_get_output_dir_and_load_callback_state_are_hfs(tmp_path):
    """HF's `_get_output_dir(trial)` (HF's JIT checkpoint manager calls it) and `_load_callback_state()` (HF's
    callback tests call it after loading a state), on both trainers."""
    common = dict(restore_callback_states_from_checkpoint=True, report_to="none")
    built = {}
    for name, trainer_cls, args_cls, extra in (
            ("hf", transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True}),
            ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments, {})):
        early = transformers.EarlyStoppingCallback(early_stopping_patience=2)
        trainer = trainer_cls(model=tiny_gpt2(), args=args_cls(output_dir=str(tmp_path / name), **common, **extra),
                              callbacks=[early])
        assert trainer._get_output_dir(trial=None) == str(tmp_path / name)
        trainer.state.stateful_callbacks = {
            "EarlyStoppingCallback": {"args": {"early_stopping_patience": 5, "early_stopping_threshold": 0.1},
                                      "attributes": {"early_stopping_patience_counter": 3}},
            "TrainerControl": {"args": {"should_training_stop": True}, "attributes": {}},
        }
        trainer._load_callback_state()
        restored = [cb for cb in trainer.callback_handler.callbacks
                    if isinstance(cb, transformers.EarlyStoppingCallback)]
        built[name] = ([(cb.early_stopping_patience, cb.early_stopping_threshold, cb.early_stopping_patience_counter)
                        for cb in restored], restored[0] is early, trainer.control.should_training_stop)
    assert built["ours"] == built["hf"] == ([(5, 0.1, 3)], False, True)


def test_an_instance_patched_evaluate_drives_the_best_checkpoint_as_in_hf(tmp_path, one_thread):
    """HF's `test_save_best_checkpoint` patches `trainer._evaluate` on the instance: the best checkpoint follows the
    patched metrics."""
    from unittest.mock import patch

    results = {}
    for name, trainer_cls, args_cls, extra in (
            ("hf", transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True}),
            ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments,
             {"lightning_kwargs": {"accelerator": "cpu", "logger": False}})):
        lightning = extra.pop("lightning_kwargs", None)
        args = args_cls(output_dir=str(tmp_path / name), per_device_train_batch_size=2, max_steps=3,
                        eval_strategy="steps", eval_steps=1, save_strategy="best", metric_for_best_model="accuracy",
                        report_to="none", disable_tqdm=True, **extra)
        trainer = trainer_cls(model=tiny_gpt2(), args=args, train_dataset=lm_dataset(n=6),
                              eval_dataset=lm_dataset(n=2, seed=1), **({"lightning_kwargs": lightning}
                                                                        if lightning else {}))
        calls = []

        def patched(*args, **kwargs):
            calls.append(args)
            return {"eval_accuracy": [0.3, 0.9, 0.5, 0.1][min(len(calls), 4) - 1]}

        with patch.object(trainer, "_evaluate", side_effect=patched):
            trainer.train()
        results[name] = (len(calls), trainer.state.best_metric, os.path.basename(trainer.state.best_model_checkpoint),
                         sorted(p for p in os.listdir(tmp_path / name) if p.startswith("checkpoint-")))
    assert results["ours"] == results["hf"]
    assert results["hf"][1:3] == (0.9, "checkpoint-2")


def test_hfs_jit_checkpoint_callback_is_in_the_handler_with_our_signal_path(tmp_path):
    """With `enable_jit_checkpoint=True` HF's handler holds a `JITCheckpointCallback` bound to the trainer, with a
    `CheckpointManager` (code looking for it finds HF's objects); ours installs no SIGTERM handler at construction:
    the pre-emption path handles the signal during `train()` (tests/test_preemption.py)."""
    import signal

    from transformers.trainer_jit_checkpoint import CheckpointManager, JITCheckpointCallback

    before = signal.getsignal(signal.SIGTERM)
    found = {}
    try:
        for name, trainer_cls, args_cls, extra in (
                ("hf", transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True}),
                ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments, {})):
            signal.signal(signal.SIGTERM, before)
            trainer = trainer_cls(model=tiny_gpt2(), args=args_cls(output_dir=str(tmp_path / name), report_to="none",
                                                                   enable_jit_checkpoint=True, **extra))
            jit = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, JITCheckpointCallback)]
            found[name] = (len(jit), jit[0].trainer is trainer, isinstance(jit[0].jit_manager, CheckpointManager),
                           jit[0].jit_manager.trainer is trainer)
            if name == "ours":
                assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, before)
    assert found["ours"] == found["hf"] == (1, True, True, True)
    plain = hf_lightning.Trainer(model=tiny_gpt2(), args=hf_lightning.TrainingArguments(
        output_dir=str(tmp_path / "plain"), report_to="none"))
    assert not [cb for cb in plain.callback_handler.callbacks if isinstance(cb, JITCheckpointCallback)]
