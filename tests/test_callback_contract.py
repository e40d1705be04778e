"""The contract of every exported Lightning callback: distinct state keys, picklable, `state_dict` round trip, and
each instance's state kept apart in a real Lightning checkpoint."""

from __future__ import annotations

import pickle

import lightning.pytorch as pl
import pytest
import torch
from helpers import classification_dataset, tiny_bert

import hf_lightning
from hf_lightning import HFEarlyStopping, HFTrainerFlow, TransformerDataModule, TransformerModule


def _args(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path), max_steps=4, eval_strategy="steps", eval_steps=1, save_strategy="no",
                    metric_for_best_model="loss", per_device_train_batch_size=4, report_to="none", disable_tqdm=True,
                    use_cpu=True)
    settings.update(overrides)
    return hf_lightning.TrainingArguments(**settings)


def _fit(tmp_path, callbacks):
    """A real 4-update fit with an evaluation after each update; returns the Lightning trainer."""
    args = _args(tmp_path)
    flow = next((cb for cb in callbacks if isinstance(cb, HFTrainerFlow)), None) or HFTrainerFlow(args)
    trainer = pl.Trainer(callbacks=[flow, *[cb for cb in callbacks if cb is not flow]], accelerator="cpu",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         use_distributed_sampler=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    data = TransformerDataModule(train_dataset=classification_dataset(16), eval_dataset=classification_dataset(4),
                                 args=args)
    trainer.fit(TransformerModule(tiny_bert(), args), datamodule=data)
    return trainer


# Two differently configured instances of each stateful callback; the first is the one fitted.
PAIRS = {
    "HFEarlyStopping": lambda tmp_path: (HFEarlyStopping(50), HFEarlyStopping(3, 0.5)),
    "HFTrainerFlow": lambda tmp_path: (HFTrainerFlow(_args(tmp_path)), HFTrainerFlow(_args(tmp_path, max_steps=9))),
}


def test_every_exported_callback_is_covered():
    exported = {name for name in hf_lightning.__all__ if isinstance(getattr(hf_lightning, name), type)
                and issubclass(getattr(hf_lightning, name), pl.Callback)}
    assert exported == set(PAIRS)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_pickle_and_state_dict_round_trip_after_a_real_fit(name, tmp_path, one_thread):
    first, second = PAIRS[name](tmp_path)
    _fit(tmp_path, [first])
    state = first.state_dict()
    assert state, "a stateful callback has something to save after a fit"
    restored = pickle.loads(pickle.dumps(first))
    assert restored.state_dict() == state
    second.load_state_dict(state)
    if name == "HFEarlyStopping":  # the counter comes back; the settings of the instance stay its own
        assert second.patience_counter == first.patience_counter and second.early_stopping_patience == 3
    else:
        assert second.state_dict() == state


def test_two_early_stopping_instances_keep_their_own_state_in_a_lightning_checkpoint(tmp_path, one_thread):
    patient, impatient = PAIRS["HFEarlyStopping"](tmp_path)
    assert patient.state_key != impatient.state_key
    trainer = _fit(tmp_path, [patient, impatient])
    assert trainer.global_step == 4
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)["callbacks"]
    assert saved[patient.state_key] == patient.state_dict()
    assert saved[impatient.state_key] == impatient.state_dict()


def test_a_run_has_one_flow(tmp_path):
    """The flow drives the loop: one per run, so its key is fixed and Lightning refuses a second one when the
    trainer is built (as it refuses two early-stopping callbacks with the same settings)."""
    first, second = PAIRS["HFTrainerFlow"](tmp_path)
    assert first.state_key == second.state_key == "HFTrainerFlow"
    with pytest.raises(RuntimeError, match="more than one stateful callback of type `HFTrainerFlow`"):
        _fit(tmp_path, [first, second])
    with pytest.raises(RuntimeError, match="more than one stateful callback of type `HFEarlyStopping`"):
        _fit(tmp_path, [HFEarlyStopping(2), HFEarlyStopping(2)])
