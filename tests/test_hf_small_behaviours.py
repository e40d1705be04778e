"""Small `transformers.Trainer` behaviours (issue 22), each against the real `transformers.Trainer` in this process.

A model with its own input names, `optim="adafactor"`, HF's optimizer accessors, `TrainingArguments.to_json_string`
with a dtype, HF's error for a missing checkpoint, the cached eval loader under persistent workers, train mode at
every step, a model's own `load_state_dict` on resume, and the `callback_handler` surface.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import transformers
from datasets import Dataset
from helpers import classification_dataset, lm_dataset, tiny_bert, tiny_gpt2
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

import hf_lightning

CPU = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
QUIET = dict(report_to="none", disable_tqdm=True, seed=7)


def hf_trainer(tmp_path, model, name="hf", trainer_cls=transformers.Trainer, **kwargs):
    args = transformers.TrainingArguments(output_dir=str(tmp_path / name), use_cpu=True,
                                          **{**QUIET, **kwargs.pop("args", {})})
    return trainer_cls(model=model, args=args, **kwargs)


def our_trainer(tmp_path, model, name="ours", trainer_cls=hf_lightning.Trainer, **kwargs):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / name), **{**QUIET, **kwargs.pop("args", {})})
    return trainer_cls(model=model, args=args, lightning_kwargs=dict(CPU), **kwargs)


def losses(trainer) -> list[float]:
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


# ----- 1. a model whose inputs are not `main_input_name` -----
class PointConfig(PretrainedConfig):
    model_type = "hf_lightning_point"

    def __init__(self, a: float = 0.5, b: float = -0.25, **kwargs):
        super().__init__(**kwargs)
        self.a, self.b = a, b


class PointModel(PreTrainedModel):
    """`y = a * input_x + b` with an MSE loss: a `PreTrainedModel` (so `main_input_name` is HF's default
    `input_ids`) whose forward takes `input_x` instead."""

    config_class = PointConfig
    base_model_prefix = "point"

    def __init__(self, config: PointConfig) -> None:
        super().__init__(config)
        self.a = nn.Parameter(torch.tensor(float(config.a)))
        self.b = nn.Parameter(torch.tensor(float(config.b)))

    def forward(self, input_x, labels=None, **kwargs):
        y = input_x * self.a + self.b
        if labels is None:
            return (y,)
        return (nn.functional.mse_loss(y, labels), y)


def point_rows(n: int = 24, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n).astype(np.float32)
    return Dataset.from_dict({"input_x": x.tolist(), "labels": (2.0 * x + 3.0).tolist()})


def test_model_without_its_main_input_in_the_batch_evaluates_predicts_and_trains_as_hf(tmp_path):
    model = PointModel(PointConfig())
    assert model.main_input_name == "input_ids"
    train, dev = point_rows(), point_rows(10, seed=1)
    settings = dict(args=dict(per_device_train_batch_size=4, per_device_eval_batch_size=4, max_steps=6,
                              logging_steps=1, learning_rate=0.1, save_strategy="no"),
                    train_dataset=train, eval_dataset=dev, compute_metrics=lambda p: {"n": float(len(p.predictions))})
    hf = hf_trainer(tmp_path, copy.deepcopy(model), **copy.deepcopy(settings))
    ours = our_trainer(tmp_path, copy.deepcopy(model), **copy.deepcopy(settings))
    for trainer in (hf, ours):
        trainer.train()
    assert losses(ours) == pytest.approx(losses(hf), rel=1e-6) and len(losses(hf)) == 6
    assert ours.state.total_flos == hf.state.total_flos
    want, got = hf.evaluate(), ours.evaluate()
    assert got["eval_loss"] == pytest.approx(want["eval_loss"], rel=1e-6) and got["eval_n"] == want["eval_n"] == 10
    want, got = hf.predict(dev), ours.predict(dev)
    np.testing.assert_allclose(got.predictions, want.predictions, rtol=1e-6)
    np.testing.assert_array_equal(got.label_ids, want.label_ids)


def test_a_model_failing_without_its_main_input_gets_a_note_naming_the_column(tmp_path):
    rows = classification_dataset(n=8).rename_column("input_ids", "tokens")
    trainer = our_trainer(tmp_path, tiny_bert(), args=dict(remove_unused_columns=False))
    with pytest.raises(Exception) as caught:
        trainer.evaluate(rows)
    assert any("no column 'input_ids'" in note and "'tokens'" in note for note in caught.value.__notes__)


# ----- 2. optim="adafactor" (transformers' Adafactor calls the closure under `no_grad`) -----
def test_adafactor_trains_with_hf_losses(tmp_path):
    model = tiny_gpt2()
    model.loss_type = "ForCausalLM"  # HF's count of label tokens is then right (test_train_parity.py)
    settings = dict(args=dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=4,
                              logging_steps=1, learning_rate=1e-2, optim="adafactor", save_strategy="no"),
                    train_dataset=lm_dataset(n=32, padded=False))
    hf = hf_trainer(tmp_path, copy.deepcopy(model), **settings)
    ours = our_trainer(tmp_path, copy.deepcopy(model), **settings)
    hf.train()
    ours.train()
    assert type(ours.optimizer).__name__ == "Adafactor"
    assert len(losses(hf)) == 4 and losses(ours) == pytest.approx(losses(hf), rel=1e-5)
    for name, tensor in hf.model.state_dict().items():
        torch.testing.assert_close(ours.model.state_dict()[name], tensor, rtol=0, atol=1e-6, msg=name)


# ----- 4. get_learning_rates, get_optimizer_group, get_num_trainable_parameters -----
def test_optimizer_accessors_as_hf(tmp_path):
    model = tiny_bert()
    model.bert.embeddings.requires_grad_(False)
    settings = dict(args=dict(per_device_train_batch_size=4, max_steps=2, weight_decay=0.1, learning_rate=1e-3,
                              warmup_steps=1, save_strategy="no"),
                    train_dataset=classification_dataset(n=16))
    hf = hf_trainer(tmp_path, copy.deepcopy(model), **settings)
    ours = our_trainer(tmp_path, copy.deepcopy(model), **settings)
    for trainer in (hf, ours):
        with pytest.raises(ValueError, match="Trainer optimizer is None, please make sure you have setup the "
                                             "optimizer before."):
            trainer.get_learning_rates()
        with pytest.raises(ValueError, match="Trainer optimizer is None"):
            trainer.get_optimizer_group()
    assert ours.get_num_trainable_parameters() == hf.get_num_trainable_parameters() < model.num_parameters()
    hf.train()
    ours.train()
    assert ours.get_learning_rates() == pytest.approx(hf.get_learning_rates()) and len(hf.get_learning_rates()) == 2
    want, got = hf.get_optimizer_group(), ours.get_optimizer_group()
    assert [len(g) for g in got] == [len(g) for g in want] and len(want) == 2
    bias = ours.model.classifier.bias
    group = ours.get_optimizer_group(bias)
    assert any(p is bias for p in group["params"])
    # HF's `param in group["params"]` compares tensors elementwise and raises for most parameters: the oracle made
    # right looks the parameter up by identity
    hf_bias = hf.model.classifier.bias
    hf_group = next(g for g in hf.optimizer.param_groups if any(p is hf_bias for p in g["params"]))
    assert group["weight_decay"] == hf_group["weight_decay"] == 0.0
    weight = ours.model.classifier.weight
    assert ours.get_optimizer_group(weight)["weight_decay"] == 0.1


# ----- 5. to_dict / to_json_string with a torch.dtype -----
def test_to_json_string_with_a_dtype_as_hf(tmp_path):
    @dataclasses.dataclass
    class HFArgs(transformers.TrainingArguments):
        dtype: torch.dtype | None = torch.bfloat16

    @dataclasses.dataclass
    class OurArgs(hf_lightning.TrainingArguments):
        dtype: torch.dtype | None = torch.bfloat16

    kwargs = dict(output_dir=str(tmp_path), lr_scheduler_kwargs={"dtype": torch.float16, "inner": {"dtype":
                                                                                                  torch.float32}})
    hf, ours = HFArgs(**copy.deepcopy(kwargs)), OurArgs(**copy.deepcopy(kwargs))
    want, got = json.loads(hf.to_json_string()), json.loads(ours.to_json_string())
    assert got["dtype"] == want["dtype"] == "bfloat16"
    assert got["lr_scheduler_kwargs"] == want["lr_scheduler_kwargs"] == {"dtype": "float16",
                                                                         "inner": {"dtype": "float32"}}
    assert ours.to_sanitized_dict()["dtype"] == hf.to_sanitized_dict()["dtype"]
    assert ours.lr_scheduler_kwargs["dtype"] is torch.float16  # HF rewrites the argument's own dict; ours is left


# ----- 8. the eval loader is reused under dataloader_persistent_workers -----
@pytest.mark.parametrize("persistent", [True, False])
def test_eval_dataloader_is_cached_per_name_with_persistent_workers_as_hf(tmp_path, persistent):
    dev, other = classification_dataset(n=8), classification_dataset(n=8, seed=1)
    settings = dict(args=dict(dataloader_num_workers=1, dataloader_persistent_workers=persistent))
    for trainer in (hf_trainer(tmp_path, tiny_bert(), eval_dataset=dev, **settings),
                    our_trainer(tmp_path, tiny_bert(), eval_dataset=dev, **settings)):
        assert (trainer.get_eval_dataloader() is trainer.get_eval_dataloader()) is persistent
    for trainer in (hf_trainer(tmp_path, tiny_bert(), eval_dataset={"a": dev, "b": other}, **settings),
                    our_trainer(tmp_path, tiny_bert(), eval_dataset={"a": dev, "b": other}, **settings)):
        a, b = trainer.get_eval_dataloader("a"), trainer.get_eval_dataloader("b")
        assert a is not b and a.dataset.num_rows == b.dataset.num_rows == 8
        assert (trainer.get_eval_dataloader("a") is a) is persistent
        assert (trainer.get_eval_dataloader("b") is b) is persistent
    ours = our_trainer(tmp_path, tiny_bert(), eval_dataset=dev, **settings)
    first = ours.get_eval_dataloader()
    # HF would hand back the cached loader of `dev` for another dataset passed in: the oracle made right
    assert ours.get_eval_dataloader(other) is not first
    if persistent:  # the reused loader (its worker kept) evaluates as HF's, again and again
        hf = hf_trainer(tmp_path, tiny_bert(), eval_dataset=dev, **settings)
        want = [hf.evaluate()["eval_loss"] for _ in range(2)]
        loader = ours.get_eval_dataloader()
        got = [ours.evaluate()["eval_loss"] for _ in range(2)]
        assert got == pytest.approx(want, rel=1e-6) and ours.get_eval_dataloader() is loader


# ----- 9. a missing checkpoint folder -----
def test_missing_checkpoint_folder_raises_hf_value_error(tmp_path):
    missing = str(tmp_path / "checkpoint-9")
    settings = dict(args=dict(max_steps=1, save_strategy="no"), train_dataset=classification_dataset(n=8))
    for trainer in (hf_trainer(tmp_path, tiny_bert(), **settings), our_trainer(tmp_path, tiny_bert(), **settings)):
        with pytest.raises(ValueError, match=f"^Can't find a valid checkpoint at {missing}"):
            trainer.train(resume_from_checkpoint=missing)
    (tmp_path / "checkpoint-9").mkdir()  # a folder without weights: the same error in both
    for trainer in (hf_trainer(tmp_path, tiny_bert(), **settings), our_trainer(tmp_path, tiny_bert(), **settings)):
        with pytest.raises(ValueError, match=f"^Can't find a valid checkpoint at {missing}"):
            trainer.train(resume_from_checkpoint=missing)


# ----- issue 24: the model is put in train mode at every step, as HF's `training_step` does -----
class EvalModeAt(transformers.TrainerCallback):
    """Switches the model to eval mode at the end of each update and after each save."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        model.eval()

    def on_save(self, args, state, control, model=None, **kwargs):
        model.eval()


def test_a_callback_switching_to_eval_mode_does_not_change_the_run(tmp_path):
    model = tiny_bert(dropout=0.1)  # dropout on: eval mode would change every later loss
    settings = dict(args=dict(per_device_train_batch_size=4, max_steps=6, logging_steps=1, learning_rate=1e-3,
                              save_strategy="steps", save_steps=2),
                    train_dataset=classification_dataset(n=32))
    # each trainer seeds the RNG when it is built (as HF): build and train one, then the other
    hf = hf_trainer(tmp_path, copy.deepcopy(model), callbacks=[EvalModeAt()], **settings)
    hf.train()
    ours = our_trainer(tmp_path, copy.deepcopy(model), callbacks=[EvalModeAt()], **settings)
    ours.train()
    assert len(losses(hf)) == 6 and losses(ours) == pytest.approx(losses(hf), rel=1e-5)


# ----- 6. resume honours the model's own `load_state_dict` -----
class LegacyRegressor(nn.Module):
    """The layout a checkpoint was written with: a `legacy` layer and a flat `scale` buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.legacy = nn.Linear(3, 1)
        self.register_buffer("scale", torch.arange(1.0, 7.0))

    def predict(self, layer: nn.Linear, input_x: torch.Tensor) -> torch.Tensor:
        return layer(input_x).squeeze(-1) * self.scale.sum() / 21.0

    def forward(self, input_x, labels=None):
        y = self.predict(self.legacy, input_x)
        return (nn.functional.mse_loss(y, labels), y) if labels is not None else (y,)


class RenamedRegressor(LegacyRegressor):
    """Today's layout: the layer is `linear`, `scale` is 2x3; its `load_state_dict` maps the old layout onto it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = self.legacy
        del self.legacy
        self.scale = self.scale.reshape(2, 3)

    def forward(self, input_x, labels=None):
        y = self.predict(self.linear, input_x)
        return (nn.functional.mse_loss(y, labels), y) if labels is not None else (y,)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        state = {k.replace("legacy.", "linear."): v for k, v in state_dict.items()}
        state["scale"] = state["scale"].reshape(2, 3)
        return super().load_state_dict(state, strict, assign)


def vector_rows(n: int = 32) -> Dataset:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return Dataset.from_dict({"input_x": x.tolist(), "labels": (x @ np.array([1.0, -2.0, 0.5]) + 1.0).tolist()})


def test_resume_loads_through_the_models_own_load_state_dict_as_hf(tmp_path):
    settings = dict(per_device_train_batch_size=4, max_steps=6, logging_steps=1, learning_rate=0.05,
                    save_strategy="steps", save_steps=2)
    legacy = hf_trainer(tmp_path, LegacyRegressor(), name="legacy", args=dict(settings, max_steps=2),
                        train_dataset=vector_rows())
    legacy.train()
    checkpoint = str(tmp_path / "legacy" / "checkpoint-2")
    hf = hf_trainer(tmp_path, RenamedRegressor(), args=settings, train_dataset=vector_rows())
    hf.train(resume_from_checkpoint=checkpoint)
    ours = our_trainer(tmp_path, RenamedRegressor(), args=settings, train_dataset=vector_rows())
    ours.train(resume_from_checkpoint=checkpoint)
    # the log history starts with the checkpoint's 2 updates
    assert len(losses(hf)) == 6 and losses(ours) == pytest.approx(losses(hf), rel=1e-6)
    for name, tensor in hf.model.state_dict().items():
        torch.testing.assert_close(ours.model.state_dict()[name], tensor, rtol=0, atol=1e-7, msg=name)


def test_resuming_with_other_intervals_warns_in_hfs_words(tmp_path):
    """Found running HF's test_trainer.py against hf_lightning: the warning about intervals that differ from the
    checkpoint's is HF's text on transformers' logger (a caller capturing transformers' log sees it)."""
    import logging

    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as hf_logging

    first = hf_trainer(tmp_path, tiny_bert(), name="first", train_dataset=classification_dataset(n=16),
                       args=dict(per_device_train_batch_size=4, max_steps=2, save_steps=2, logging_steps=1))
    first.train()
    resumed = dict(per_device_train_batch_size=2, max_steps=3, save_steps=3, logging_steps=1)
    texts = []
    for make in (hf_trainer, our_trainer):
        trainer = make(tmp_path, tiny_bert(), train_dataset=classification_dataset(n=16), args=resumed)
        logging.Logger.warning_once.cache_clear()  # HF logs it once per process: each run gets its own first time
        with CaptureLogger(hf_logging.get_logger()) as captured:
            trainer.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-2"))
        texts.append([line for line in captured.out.splitlines() if "from args" in line or "do not match" in line])
    assert texts[1] == texts[0] and len(texts[0]) == 3
    assert "\tper_device_train_batch_size: 2 (from args) != 4 (from trainer_state.json)" in texts[0]


# ----- 7. the callback handler: DefaultFlowCallback, duplicates, stateful callbacks left out, on_push_begin -----
def callback_classes(trainer) -> list[type]:
    return [type(cb) for cb in trainer.callback_handler.callbacks]


def test_callback_handler_starts_with_default_flow_callback_as_hf(tmp_path):
    hf, ours = hf_trainer(tmp_path, tiny_bert()), our_trainer(tmp_path, tiny_bert())
    assert callback_classes(ours) == callback_classes(hf)
    assert callback_classes(hf) == [transformers.DefaultFlowCallback, transformers.PrinterCallback]
    flow = ours.callback_handler.callbacks[0]
    assert ours.pop_callback(transformers.DefaultFlowCallback) is flow
    assert callback_classes(ours) == [transformers.PrinterCallback]


def test_without_default_flow_callback_nothing_is_logged_evaluated_or_saved_as_hf(tmp_path):
    settings = dict(args=dict(per_device_train_batch_size=4, max_steps=4, logging_steps=1, eval_strategy="steps",
                              eval_steps=2, save_strategy="steps", save_steps=2),
                    train_dataset=classification_dataset(n=16), eval_dataset=classification_dataset(n=8, seed=1))
    runs = []
    for make, name in ((hf_trainer, "hf"), (our_trainer, "ours")):
        trainer = make(tmp_path, tiny_bert(), **settings)
        trainer.remove_callback(transformers.DefaultFlowCallback)
        trainer.train()
        runs.append(trainer)
        assert not [p.name for p in (tmp_path / name).glob("checkpoint-*")]
    hf, ours = runs
    assert ours.state.global_step == hf.state.global_step == 4
    assert [sorted(e) for e in ours.state.log_history] == [sorted(e) for e in hf.state.log_history]
    assert len(hf.state.log_history) == 1 and "train_runtime" in hf.state.log_history[0]


def test_removing_or_popping_a_callback_not_held_as_hf(tmp_path):
    """Issue 22 item 7: a class not held is removed silently and popped as None; an instance not held is popped as
    None, and `remove_callback` of it raises HF's `list.remove` error (ours for a Lightning callback too)."""
    outcomes = []
    for make in (hf_trainer, our_trainer):
        trainer = make(tmp_path, tiny_bert())
        before = callback_classes(trainer)
        trainer.remove_callback(transformers.EarlyStoppingCallback)
        popped = (trainer.pop_callback(transformers.EarlyStoppingCallback),
                  trainer.pop_callback(transformers.PrinterCallback()))
        with pytest.raises(ValueError) as raised:
            trainer.remove_callback(transformers.PrinterCallback())
        outcomes.append((callback_classes(trainer) == before, popped, str(raised.value)))
    assert outcomes[1] == outcomes[0] == (True, (None, None), "list.remove(x): x not in list")
    with pytest.raises(ValueError, match=r"^list\.remove\(x\): x not in list$"):
        trainer.remove_callback(_LightningCounter())


class _LightningCounter(pl.Callback):
    """A Lightning callback the trainer does not hold."""


def test_a_duplicated_callback_class_warns_as_hf(tmp_path, caplog):
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as hf_logging

    texts = []
    for make in (hf_trainer, our_trainer):
        trainer = make(tmp_path, tiny_bert())
        with CaptureLogger(hf_logging.get_logger("transformers.trainer_callback")) as captured:
            trainer.add_callback(transformers.PrinterCallback)
        texts.append(captured.out)
        assert callback_classes(trainer).count(transformers.PrinterCallback) == 2
    assert texts[1] == texts[0] and "You are adding a <class 'transformers.trainer_callback.PrinterCallback'>" \
        in texts[0]


class CountingState(transformers.TrainerCallback, transformers.trainer_callback.ExportableState):
    """A stateful callback: counts updates, and its count is saved in `trainer_state.json`."""

    def __init__(self, count: int = 0) -> None:
        self.count = count

    def on_step_end(self, args, state, control, **kwargs):
        self.count += 1

    def state(self) -> dict:
        return {"args": {"count": self.count}, "attributes": {}}


def test_stateful_callbacks_restored_or_reported_missing_as_hf(tmp_path):
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging as hf_logging

    settings = dict(per_device_train_batch_size=4, max_steps=4, save_strategy="steps", save_steps=2,
                    restore_callback_states_from_checkpoint=True)
    first = hf_trainer(tmp_path, tiny_bert(), name="first", args=dict(settings, max_steps=2),
                       train_dataset=classification_dataset(n=16), callbacks=[CountingState()])
    first.train()
    checkpoint = str(tmp_path / "first" / "checkpoint-2")
    counts, warnings = [], []
    for make, name in ((hf_trainer, "hf"), (our_trainer, "ours")):
        trainer = make(tmp_path, tiny_bert(), name=name, args=settings, train_dataset=classification_dataset(n=16),
                       callbacks=[CountingState()])
        trainer.train(resume_from_checkpoint=checkpoint)
        counts.append(next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, CountingState)).count)
        trainer = make(tmp_path, tiny_bert(), name=name + "_without", args=settings,
                       train_dataset=classification_dataset(n=16))
        with CaptureLogger(hf_logging.get_logger("transformers.trainer")) as captured:
            trainer.train(resume_from_checkpoint=checkpoint)
        warnings.append([line for line in captured.out.splitlines() if "Checkpoint included" in line])
    assert counts == [4, 4]
    assert warnings[1] == warnings[0] == ["Checkpoint included callbacks not included in current configuration. "
                                          "Ignoring. (CountingState)"]


def test_on_push_begin_reaches_the_callbacks(tmp_path):
    class Pushed(transformers.TrainerCallback):
        calls = 0

        def on_push_begin(self, args, state, control, **kwargs):
            Pushed.calls += 1

    for make in (hf_trainer, our_trainer):
        trainer = make(tmp_path, tiny_bert(), callbacks=[Pushed()])
        trainer.callback_handler.on_push_begin(trainer.args, trainer.state, trainer.control)
    assert Pushed.calls == 2
