"""A `transformers.Trainer` subclass and a `hf_lightning.Trainer` subclass with the same override body give the same
per-update losses, evaluations, final weights and call counts (the real `transformers.Trainer` is the oracle).

Each body is written once and pasted into both classes (`pair`), as a user ports a subclass by changing its base. Some
bodies are HF's own code: `transformers.Trainer.training_step` / `compute_loss` / `prediction_step` called with our
trainer as `self`, which shows that what those bodies read (`self.accelerator.backward`, `self._prepare_inputs`,
`self.compute_loss_context_manager()`, `self.args.n_gpu`, `self.model_accepts_loss_kwargs`,
`self.current_gradient_accumulation_steps`, ...) exists with HF's meaning.

The model is a tiny GPT-2 with dropout on and `loss_type="ForCausalLM"` (HF then counts `num_items_in_batch`
correctly, see test_train_parity.py), GA=2 with a short last window, evaluations every 2 updates.
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from helpers import RecordingDataset, classification_dataset, lm_dataset, tiny_bert, tiny_gpt2
from torch.utils.data import DataLoader, SequentialSampler
from transformers import get_constant_schedule

import hf_lightning

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False}
COMMON = dict(
    per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=1, learning_rate=1e-3,
    logging_steps=1, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4, seed=7, save_strategy="no",
    report_to="none", disable_tqdm=True,
)
TIMING = ("runtime", "per_second", "total_flos", "train_loss")


def gpt2():
    model = tiny_gpt2(dropout=0.1)
    model.loss_type = "ForCausalLM"
    return model


def bert():
    """A BERT classifier made right for HF: its forward takes `**kwargs` but ignores `num_items_in_batch`, so HF's
    losses and gradients come out `gradient_accumulation_steps` times too large (README "Differences"); with
    `accepts_loss_kwargs = False` HF averages the micro-batch means, which equals the token-weighted mean here
    (every micro-batch has 2 labels)."""
    model = tiny_bert(dropout=0.1)
    model.accepts_loss_kwargs = False
    return model


class Counting:
    """Mixed into both trainers: `self.calls` counts every overridden method's calls."""

    calls: Counter

    def count(self, name: str) -> None:
        self.calls[name] += 1


def pair(body: dict[str, Any], model_fn=gpt2, train=None, eval_dataset="default", run=True, hf_args=None,
         our_args=None, **kwargs):
    """The same `body` as a subclass of `transformers.Trainer` and of `hf_lightning.Trainer`, trained (if `run`).

    `train` is a dataset, or a function making one (a new one for each trainer, e.g. a `RecordingDataset`).
    """
    train = train if train is not None else lm_dataset(n=22)  # 11 micro-batches: windows of 2, 2, 2, 2, 2, 1
    make_train = train if callable(train) else (lambda: copy.copy(train))
    eval_dataset = lm_dataset(n=10, seed=1) if eval_dataset == "default" else eval_dataset
    model = model_fn()
    settings = {**COMMON, **(hf_args or {})}
    hf_cls = type("HFSub", (Counting, transformers.Trainer), dict(body))
    ours_cls = type("OurSub", (Counting, hf_lightning.Trainer), dict(body))
    tmp = kwargs.pop("tmp_path")
    # each trainer seeds the RNG when it is built (as HF): build and train one, then the other
    hf = hf_cls(model=copy.deepcopy(model), train_dataset=make_train(), eval_dataset=eval_dataset,
                args=transformers.TrainingArguments(output_dir=str(tmp / "hf"), use_cpu=True, **settings), **kwargs)
    hf.calls = Counter()
    if run:
        hf.train()
    our_settings = {**settings, **(our_args or {})}
    ours = ours_cls(model=copy.deepcopy(model), train_dataset=make_train(), eval_dataset=eval_dataset,
                    args=hf_lightning.TrainingArguments(output_dir=str(tmp / "ours"), **our_settings),
                    lightning_kwargs=dict(LIGHTNING_KWARGS), **kwargs)
    ours.calls = Counter()
    if run:
        ours.train()
    return hf, ours


def stable(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if not any(word in k for word in TIMING)} for entry in history]


def assert_same_run(hf, ours, weights_atol: float = 1e-6) -> None:
    """Same log history (losses, eval metrics, learning rates, epochs, extra keys), call counts and final weights."""
    hf_log, our_log = stable(hf.state.log_history), stable(ours.state.log_history)
    assert [sorted(e) for e in our_log] == [sorted(e) for e in hf_log]
    for hf_entry, our_entry in zip(hf_log, our_log):
        for key, value in hf_entry.items():
            assert our_entry[key] == pytest.approx(value, rel=1e-5, abs=1e-9), (hf_entry["step"], key)
    assert ours.calls == hf.calls
    assert ours.state.global_step == hf.state.global_step
    hf_state, our_state = hf.model.state_dict(), ours.model.state_dict()
    for name, tensor in hf_state.items():
        torch.testing.assert_close(our_state[name], tensor, rtol=0, atol=weights_atol, msg=name)


def losses(trainer) -> list[float]:
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


# ----- the loss -----
def double_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
    self.count("compute_loss")
    loss, outputs = super(self._base, self).compute_loss(model, inputs, return_outputs=True,
                                                         num_items_in_batch=num_items_in_batch)
    return (2 * loss, outputs) if return_outputs else 2 * loss


def with_base(body: dict[str, Any]) -> dict[str, Any]:
    """`super(self._base, self)` in a body reaches the trainer class the body was pasted into."""
    return {**body, "_base": property(lambda self: type(self).__mro__[1])}


def test_compute_loss_returning_twice_the_loss_logs_twice_the_loss(tmp_path, one_thread):
    hf, ours = pair(with_base({"compute_loss": double_loss}), tmp_path=tmp_path)
    assert_same_run(hf, ours)
    plain = hf_lightning.Trainer(model=gpt2(), train_dataset=lm_dataset(n=22), eval_dataset=lm_dataset(n=10, seed=1),
                                 args=hf_lightning.TrainingArguments(output_dir=str(tmp_path / "p"), **COMMON),
                                 lightning_kwargs=dict(LIGHTNING_KWARGS))
    plain.train()
    assert losses(ours)[0] == pytest.approx(2 * losses(plain)[0], rel=1e-5)  # the first update's loss, doubled
    assert ours.calls["compute_loss"] == 11 + 3 * 3  # 11 micro-batches; 3 evaluations of 3 batches


def test_hf_compute_loss_itself_pasted_as_the_override(tmp_path, one_thread):
    """HF 5.23's own `compute_loss` (passes `num_items_in_batch` into the model) with our trainer as `self`."""
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.count("compute_loss")
        return transformers.Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    hf, ours = pair({"compute_loss": compute_loss}, tmp_path=tmp_path)
    assert_same_run(hf, ours)


def test_compute_loss_func_argument(tmp_path, one_thread):
    def loss_func(outputs, labels, num_items_in_batch=None):
        logits = outputs.logits[..., :-1, :].float()
        targets = labels[..., 1:]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100, reduction="sum")
        return loss / num_items_in_batch + 0.01 * logits.pow(2).mean()

    hf, ours = pair({}, compute_loss_func=loss_func, tmp_path=tmp_path)
    assert_same_run(hf, ours)


# ----- training_step with gradient accumulation -----
def test_hf_training_step_itself_pasted_as_the_override(tmp_path, one_thread):
    """HF 5.23's `training_step` body (it calls `_prepare_context_parallel_inputs`, `_prepare_inputs`,
    `compute_loss_context_manager`, `compute_loss`, reads `args.n_gpu`, `loss_is_scaled_for_ga`,
    `model_accepts_loss_kwargs`, `current_gradient_accumulation_steps`, `accelerator.distributed_type` and calls
    `accelerator.backward`), run by our trainer."""
    def training_step(self, model, inputs, num_items_in_batch=None):
        self.count("training_step")
        return transformers.Trainer.training_step(self, model, inputs, num_items_in_batch)

    hf, ours = pair({"training_step": training_step}, tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert ours.calls["training_step"] == 11


def custom_training_step(self, model, inputs, num_items_in_batch=None):
    """A typical user override: its own scaling and an extra L2 term, backward through the accelerator."""
    self.count("training_step")
    model.train()
    inputs = self._prepare_inputs(inputs)
    with self.compute_loss_context_manager():
        loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
    if self.args.n_gpu > 1:
        loss = loss.mean()
    if not (self.model_accepts_loss_kwargs and num_items_in_batch is not None):
        loss = loss / self.args.gradient_accumulation_steps
    penalty = sum(p.pow(2).sum() for p in model.lm_head.parameters()) * 1e-4
    loss = loss + penalty / self.current_gradient_accumulation_steps
    self.accelerator.backward(loss)
    return loss.detach()


def test_custom_training_step_with_gradient_accumulation(tmp_path, one_thread):
    hf, ours = pair({"training_step": custom_training_step}, tmp_path=tmp_path)
    assert_same_run(hf, ours)


def test_custom_training_step_on_bert_follows_hfs_scaling(tmp_path, one_thread):
    """On a model without loss kwargs HF's rule divides the override's loss by the window, as in HF; on a BERT that
    takes `**kwargs` but ignores `num_items_in_batch`, HF's loss is twice too large (GA=2) and ours is not."""
    def step(self, model, inputs, num_items_in_batch=None):
        self.count("training_step")
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if not (self.model_accepts_loss_kwargs and num_items_in_batch is not None):
            loss = loss / self.current_gradient_accumulation_steps
        self.accelerator.backward(loss)
        return loss.detach()

    data = dict(train=classification_dataset(n=22), eval_dataset=classification_dataset(n=10, seed=1))
    hf, ours = pair({"training_step": step}, model_fn=bert, tmp_path=tmp_path, **data)
    assert_same_run(hf, ours)
    hf_wrong, ours_right = pair({"training_step": step}, model_fn=lambda: tiny_bert(dropout=0.1),
                                tmp_path=tmp_path / "kwargs", **data)
    assert losses(hf_wrong)[0] == pytest.approx(2 * losses(ours_right)[0], rel=1e-5)
    assert losses(ours_right)[0] == pytest.approx(losses(ours)[0], rel=1e-5)


# ----- prediction_step -----
def accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def flipped_prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
    self.count("prediction_step")
    loss, logits, labels = super(self._base, self).prediction_step(model, inputs, prediction_loss_only, ignore_keys)
    return loss, None if logits is None else -logits, labels


def test_prediction_step_altering_logits(tmp_path, one_thread):
    hf, ours = pair(with_base({"prediction_step": flipped_prediction_step}), model_fn=bert,
                    train=classification_dataset(n=22), eval_dataset=classification_dataset(n=10, seed=1),
                    compute_metrics=accuracy, tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert [e["eval_accuracy"] for e in ours.state.log_history if "eval_accuracy" in e]
    assert ours.calls["prediction_step"] == 3 * 3
    test_set = classification_dataset(n=10, seed=1)
    predicted, hf_predicted = ours.predict(test_set), hf.predict(test_set)
    assert ours.calls == hf.calls and ours.calls["prediction_step"] == 3 * 3 + 3
    np.testing.assert_allclose(predicted.predictions, hf_predicted.predictions, rtol=1e-5, atol=1e-6)
    ours.model.eval()
    with torch.no_grad():
        logits = ours.model(input_ids=torch.tensor(test_set["input_ids"]),
                            attention_mask=torch.tensor(test_set["attention_mask"])).logits
    np.testing.assert_allclose(predicted.predictions, -logits.numpy(), rtol=1e-5, atol=1e-6)  # the override's flip


def test_hf_prediction_step_itself_pasted_as_the_override(tmp_path, one_thread):
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        self.count("prediction_step")
        return transformers.Trainer.prediction_step(self, model, inputs, prediction_loss_only, ignore_keys)

    hf, ours = pair({"prediction_step": prediction_step}, tmp_path=tmp_path)
    assert_same_run(hf, ours)


# ----- optimizer and scheduler -----
def sgd_optimizer(self, model=None):
    self.count("create_optimizer")
    if self.optimizer is None:
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.args.learning_rate * 50, momentum=0.9)
    return self.optimizer


def constant_scheduler(self, num_training_steps, optimizer=None):
    self.count("create_scheduler")
    if self.lr_scheduler is None:
        self.lr_scheduler = get_constant_schedule(self.optimizer if optimizer is None else optimizer)
    return self.lr_scheduler


def test_create_optimizer_with_sgd(tmp_path, one_thread):
    hf, ours = pair({"create_optimizer": sgd_optimizer}, tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert isinstance(ours.optimizer, torch.optim.SGD) and ours.calls["create_optimizer"] == 1


def test_create_scheduler_constant(tmp_path, one_thread):
    hf, ours = pair({"create_scheduler": constant_scheduler}, tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert {e["learning_rate"] for e in ours.state.log_history if "learning_rate" in e} == {COMMON["learning_rate"]}


def test_optimizer_cls_and_kwargs_argument(tmp_path, one_thread):
    hf, ours = pair({}, optimizer_cls_and_kwargs=(torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}), tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert isinstance(ours.optimizer, torch.optim.SGD)
    assert [g["weight_decay"] for g in ours.optimizer.param_groups] == [0.0, 0.0]  # HF's two groups


def test_get_decay_parameter_names(tmp_path, one_thread):
    def get_decay_parameter_names(self, model):
        self.count("get_decay_parameter_names")
        return [name for name, _ in model.named_parameters() if "wte" in name]  # decay the embeddings only

    hf, ours = pair({"get_decay_parameter_names": get_decay_parameter_names}, hf_args={"weight_decay": 0.5},
                    tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert len(ours.optimizer.param_groups[0]["params"]) == 1


def test_create_optimizer_and_scheduler_is_called_unlike_hf(tmp_path, one_thread):
    """HF 5's `train()` calls `create_optimizer` and `create_scheduler` directly, so an override of
    `create_optimizer_and_scheduler` is silently ignored by HF; hf_lightning calls it (README)."""
    def create_optimizer_and_scheduler(self, num_training_steps):
        self.count("create_optimizer_and_scheduler")
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.lr_scheduler = get_constant_schedule(self.optimizer)

    hf, ours = pair({"create_optimizer_and_scheduler": create_optimizer_and_scheduler}, tmp_path=tmp_path)
    assert hf.calls["create_optimizer_and_scheduler"] == 0 and isinstance(hf.optimizer.optimizer, torch.optim.AdamW)
    assert ours.calls["create_optimizer_and_scheduler"] == 1 and isinstance(ours.optimizer, torch.optim.SGD)


# ----- contexts and inputs -----
def test_compute_loss_context_manager(tmp_path, one_thread):
    """bf16 autocast around every `compute_loss`: the numbers change, as in HF."""
    def compute_loss_context_manager(self):
        self.count("compute_loss_context_manager")
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        return stack

    hf, ours = pair({"compute_loss_context_manager": compute_loss_context_manager}, tmp_path=tmp_path)
    assert_same_run(hf, ours, weights_atol=1e-5)
    assert ours.calls["compute_loss_context_manager"] == 11 + 9


def test_prepare_inputs(tmp_path, one_thread):
    """An override that masks the first label token of every batch (train and eval)."""
    def _prepare_inputs(self, inputs):
        self.count("_prepare_inputs")
        inputs = super(self._base, self)._prepare_inputs(inputs)
        labels = inputs["labels"].clone()
        labels[:, :2] = -100
        return {**inputs, "labels": labels}

    hf, ours = pair(with_base({"_prepare_inputs": _prepare_inputs}), tmp_path=tmp_path)
    assert_same_run(hf, ours)


# ----- data -----
def sequential_train_dataloader(self):
    self.count("get_train_dataloader")
    return DataLoader(self.train_dataset, batch_size=self._train_batch_size, collate_fn=self.data_collator,
                      sampler=SequentialSampler(self.train_dataset))


def test_get_train_dataloader_with_a_sequential_sampler(tmp_path, one_thread):
    train = lambda: RecordingDataset(lm_dataset(n=22))  # noqa: E731
    hf, ours = pair({"get_train_dataloader": sequential_train_dataloader}, train=train, tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert ours.train_dataset.seen == hf.train_dataset.seen == list(range(22))  # the sampler drove training
    assert ours.calls["get_train_dataloader"] == 1


def test_get_train_sampler_override(tmp_path, one_thread):
    def _get_train_sampler(self, train_dataset=None):
        self.count("_get_train_sampler")
        return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

    train = lambda: RecordingDataset(lm_dataset(n=22))  # noqa: E731
    hf, ours = pair({"_get_train_sampler": _get_train_sampler}, train=train, hf_args={"num_train_epochs": 2},
                    tmp_path=tmp_path)
    assert_same_run(hf, ours, weights_atol=5e-6)  # 12 updates: float rounding of the token shares adds up
    assert ours.train_dataset.seen == hf.train_dataset.seen == list(range(22)) * 2


def test_get_eval_and_test_dataloader(tmp_path, one_thread):
    def get_eval_dataloader(self, eval_dataset=None):
        self.count("get_eval_dataloader")
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        return DataLoader(dataset, batch_size=3, collate_fn=self.data_collator)  # another eval batch size

    def get_test_dataloader(self, test_dataset):
        self.count("get_test_dataloader")
        return DataLoader(test_dataset, batch_size=3, collate_fn=self.data_collator)

    # HF repeats each batch loss `per_device_eval_batch_size` (4) times and truncates only the batches of its own
    # loaders, so with a loader of 3 per batch its eval_loss is the mean of batch means: right only when every batch
    # is full. The eval and test sets here are 9 = 3 x 3 samples (ours weights by the real batch sizes always).
    body = {"get_eval_dataloader": get_eval_dataloader, "get_test_dataloader": get_test_dataloader}
    hf, ours = pair(body, eval_dataset=lm_dataset(n=9, seed=1), tmp_path=tmp_path)
    assert_same_run(hf, ours)
    assert ours.calls["get_eval_dataloader"] == 3
    hf_out, our_out = hf.predict(lm_dataset(n=9, seed=2)), ours.predict(lm_dataset(n=9, seed=2))
    assert ours.calls == hf.calls and ours.calls["get_test_dataloader"] == 1
    assert our_out.metrics["test_loss"] == pytest.approx(hf_out.metrics["test_loss"], rel=1e-5)


# ----- checkpoints -----
def model_card_then_save(self, model, trial):
    """TRL's `_save_checkpoint` pattern: write a file into `output_dir` (its model card), then `super()`."""
    import os

    self.count("_save_checkpoint")
    folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
    with open(os.path.join(self.args.output_dir, "README.md"), "w") as f:
        f.write(f"card at step {self.state.global_step}\n")
    before = os.path.isdir(folder)
    super(self._base, self)._save_checkpoint(model, trial)
    written = {name for name in ("trainer_state.json", "model.safetensors", "optimizer.pt", "scheduler.pt")
               if os.path.isfile(os.path.join(folder, name))}
    self.__dict__.setdefault("saves", []).append(
        (self.state.global_step, before, sorted(written), model is self.model, trial, self.state.total_flos > 0))


def test_save_checkpoint_override_runs_at_hfs_points_around_the_built_in_save(tmp_path, one_thread):
    hf, ours = pair(with_base({"_save_checkpoint": model_card_then_save}), tmp_path=tmp_path,
                    hf_args={"save_strategy": "steps", "save_steps": 2})
    assert_same_run(hf, ours)
    full = ["model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"]
    assert hf.saves == [(2, False, full, True, None, True), (4, False, full, True, None, True),
                        (6, False, full, True, None, True)]
    assert ours.saves == hf.saves
    assert (tmp_path / "ours" / "README.md").read_text() == "card at step 6\n"
    assert ours.calls["_save_checkpoint"] == 3
