"""Which `transformers.Trainer` overrides are honoured, which are refused, and the refusal at construction.

The tables of `hf_lightning/trainer/overrides.py` cover every method of the installed `transformers.Trainer` and
`Seq2SeqTrainer` exactly once; an override of a refused method, or of one the strategy cannot honour, raises one
error at construction naming each; `Trainer.accelerator` answers what pasted HF code asks and names what it cannot.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers

import hf_lightning
from helpers import classification_dataset, tiny_bert
from hf_lightning.trainer.accelerator import SUPPORTED
from hf_lightning.trainer.overrides import (
    CALLED_BY_USER,
    HUB_ONLY,
    REFUSED,
    ROUTED,
    check_overrides,
    deepspeed_refusals,
    overridden_methods,
)


def hf_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if not name.startswith("__")
            and (inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod, property)))}


def test_every_hf_trainer_method_is_in_exactly_one_table():
    tables = [set(ROUTED), set(CALLED_BY_USER), set(HUB_ONLY), set(REFUSED)]
    assert all(not (a & b) for i, a in enumerate(tables) for b in tables[i + 1:])
    known = set().union(*tables)
    hf = hf_methods(transformers.Trainer) | hf_methods(transformers.Seq2SeqTrainer)
    assert hf - known == set(), "classify these transformers.Trainer methods in trainer/overrides.py"
    assert known - hf == set(), "these names are not transformers.Trainer methods"


def test_every_routed_method_exists_on_our_trainer_with_hfs_parameters():
    for name in ROUTED:
        ours, theirs = getattr(hf_lightning.Trainer, name), getattr(transformers.Trainer, name)
        hf_params = list(inspect.signature(theirs).parameters)
        our_params = list(inspect.signature(ours).parameters)
        assert our_params[: len(hf_params)] == hf_params, name  # pasted calls keep working (ours may add **kwargs)


def test_readme_lists_every_honoured_method():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Subclassing the Trainer", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in ROUTED if f"`{name}`" not in section]
    assert not missing, f"README 'Subclassing the Trainer' does not list {missing}"


def _trainer(cls, tmp_path, **kwargs):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none", save_strategy="no")
    return cls(model=tiny_bert(), args=args, train_dataset=classification_dataset(n=8), **kwargs)


def test_refused_overrides_raise_one_error_naming_each(tmp_path):
    class Custom(hf_lightning.Trainer):
        def _save_rng_state(self, output_dir):
            pass

        def _inner_training_loop(self, *args, **kwargs):
            pass

        def my_helper(self):  # not an HF method: the user's own
            pass

    with pytest.raises(TypeError) as info:
        _trainer(Custom, tmp_path)
    message = str(info.value)
    assert "_save_rng_state: checkpoints are written by HFTrainerFlow" in message
    assert "_inner_training_loop: HF's own training loop" in message
    assert "my_helper" not in message


def test_refusal_walks_the_users_class_hierarchy_only(tmp_path):
    class Base(hf_lightning.Trainer):
        def get_batch_samples(self, epoch_iterator, num_batches, device):
            pass

    class Leaf(Base):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    assert set(overridden_methods(Leaf)) == {"get_batch_samples", "compute_loss"}
    assert overridden_methods(hf_lightning.Seq2SeqTrainer) == []  # our own classes define no "override"
    with pytest.raises(TypeError, match="get_batch_samples"):
        _trainer(Leaf, tmp_path)
    _trainer(type("Fine", (hf_lightning.Trainer,), {"compute_loss": Leaf.compute_loss}), tmp_path)


def test_deepspeed_config_refuses_the_optimizer_overrides_it_would_ignore():
    class Custom(hf_lightning.Trainer):
        def create_optimizer(self, model=None):
            return super().create_optimizer(model)

        def create_scheduler(self, num_training_steps, optimizer=None):
            return super().create_scheduler(num_training_steps, optimizer)

    check_overrides(Custom, deepspeed_refusals({"zero_optimization": {"stage": 2}}))  # nothing defined by DeepSpeed
    with pytest.raises(TypeError) as info:
        check_overrides(Custom, deepspeed_refusals({"optimizer": {"type": "AdamW"}, "scheduler": {"type": "WarmupLR"}}))
    assert "create_optimizer: the DeepSpeed config defines an `optimizer`" in str(info.value)
    assert "create_scheduler: the DeepSpeed config defines a `scheduler`" in str(info.value)


@pytest.mark.gpu
def test_deepspeed_strategy_with_an_optimizer_refuses_create_optimizer_at_construction(tmp_path):
    from lightning.pytorch.strategies import DeepSpeedStrategy

    class Custom(hf_lightning.Trainer):
        def create_optimizer(self, model=None):
            return super().create_optimizer(model)

    strategy = DeepSpeedStrategy(config={"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                         "train_micro_batch_size_per_gpu": 1})
    with pytest.raises(TypeError, match="create_optimizer"):
        _trainer(Custom, tmp_path, lightning_kwargs={"strategy": strategy})


# ----- Trainer.accelerator -----
def test_accelerator_answers_what_hf_code_asks_inside_a_run(tmp_path):
    seen = []

    class Custom(hf_lightning.Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            acc = self.accelerator
            seen.append((acc.sync_gradients, acc.num_processes, acc.process_index, acc.is_main_process,
                         acc.distributed_type, acc.gradient_accumulation_steps, acc.mixed_precision,
                         acc.unwrap_model(model) is self.model, acc.gather(torch.ones(2)).shape[0],
                         float(acc.reduce(torch.ones(()))), acc.device.type))
            return super().training_step(model, inputs, num_items_in_batch)

    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none", save_strategy="no",
                                          per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=1)
    trainer = Custom(model=tiny_bert(), args=args, train_dataset=classification_dataset(n=8),
                     lightning_kwargs={"accelerator": "cpu", "logger": False})
    trainer.train()
    assert seen == [(False, 1, 0, True, "NO", 2, "no", True, 2, 1.0, "cpu"),
                    (True, 1, 0, True, "NO", 2, "no", True, 2, 1.0, "cpu")]
    assert transformers.Trainer(model=tiny_bert(), args=transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), use_cpu=True, report_to="none")).accelerator.distributed_type == "NO"
    with pytest.raises(AttributeError, match="'register_for_checkpointing'.*Supported: autocast, backward"):
        trainer.accelerator.register_for_checkpointing  # noqa: B018
    assert set(SUPPORTED) <= set(dir(type(trainer.accelerator)))
