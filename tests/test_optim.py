"""Optimizer and scheduler: HF's parameter groups, `optim` classes and hyper-parameters, every scheduler stepped
once per update (checked against `transformers.get_scheduler`), warmup rules, and a user (optimizer, scheduler)."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import hf_lightning
from hf_lightning import TrainingArguments
from hf_lightning.args import SCHEDULER_NAMES
from hf_lightning.module.optim import build_optimizer, build_scheduler, decay_parameter_names, parameter_groups
from helpers import VOCAB, classification_dataset, tiny_bert

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}

SCHEDULER_KWARGS = {
    "cosine_with_min_lr": {"min_lr_rate": 0.1},
    "cosine_warmup_with_min_lr": {"min_lr_rate": 0.1},
    "warmup_stable_decay": {"num_decay_steps": 3},
    "cosine_with_restarts": {"num_cycles": 2},
}


class TinyClassifier(nn.Module):
    """Embedding, an `nn.LayerNorm` called `norm`, a head, and a frozen buffer-like parameter."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 2)
        self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.norm(self.emb(input_ids).mean(dim=1))) * self.frozen
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def hf_trainer(model, tmp_path, **kwargs) -> transformers.Trainer:
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none", use_cpu=True, **kwargs)
    return transformers.Trainer(model=model, args=args)


def names_of(model: nn.Module, params) -> list[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for p in params]


# ----- parameter groups -----
def test_decay_names_and_groups_equal_hf_for_bert(tmp_path):
    model = tiny_bert()
    hf = hf_trainer(model, tmp_path, weight_decay=0.05, optim="adamw_torch")
    assert decay_parameter_names(model) == hf.get_decay_parameter_names(model)
    hf_groups = hf.create_optimizer().param_groups
    ours = build_optimizer(model, TrainingArguments(weight_decay=0.05, optim="adamw_torch")).param_groups
    assert len(ours) == len(hf_groups) == 2
    for our_group, hf_group in zip(ours, hf_groups):
        assert names_of(model, our_group["params"]) == names_of(model, hf_group["params"])
        assert our_group["weight_decay"] == hf_group["weight_decay"]
    decay, no_decay = (names_of(model, g["params"]) for g in ours)
    assert "bert.embeddings.word_embeddings.weight" in decay  # embeddings are decayed, as HF
    assert all(n.endswith(".bias") or "LayerNorm" in n for n in no_decay)
    assert ours[1]["weight_decay"] == 0.0


def test_groups_skip_frozen_parameters_and_norm_modules(tmp_path):
    model = TinyClassifier()
    hf = hf_trainer(model, tmp_path, weight_decay=0.1)
    assert decay_parameter_names(model) == hf.get_decay_parameter_names(model)
    decay, no_decay = parameter_groups(model, 0.1)
    assert names_of(model, decay["params"]) == ["emb.weight", "head.weight"]
    assert names_of(model, no_decay["params"]) == ["norm.weight", "norm.bias", "head.bias"]
    model.emb.weight.requires_grad_(False)
    decay, no_decay = parameter_groups(model, 0.1)
    assert names_of(model, decay["params"]) == ["head.weight"]  # frozen parameters are excluded; both groups exist
    model.head.weight.requires_grad_(False)
    assert parameter_groups(model, 0.1)[0]["params"] == []


# ----- optimizer classes and hyper-parameters -----
@pytest.mark.parametrize(
    "optim, optim_args",
    [
        ("adamw_torch", None),
        ("adamw_torch_fused", None),
        ("sgd", None),
        ("sgd", "momentum=0.9,nesterov=True,dampening=0"),
        ("adafactor", None),
        ("adagrad", None),
        ("rmsprop", "momentum=0.5,alpha=0.9"),
    ],
)
def test_optim_names_build_hfs_class_and_hyper_parameters(optim, optim_args):
    settings = dict(
        optim=optim, optim_args=optim_args, learning_rate=3e-4, adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-7,
        weight_decay=0.01,
    )
    model = TinyClassifier()
    hf_args = transformers.TrainingArguments(output_dir="unused_hf_output", report_to="none", **settings)
    hf_cls, hf_kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(hf_args, model)
    optimizer = build_optimizer(model, TrainingArguments(**settings))
    assert type(optimizer) is hf_cls
    for key, value in hf_kwargs.items():
        if key != "params":
            assert optimizer.defaults[key] == value, key
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
    if optim == "adamw_torch_fused":
        assert optimizer.defaults["fused"] is True
    if optim == "adafactor":
        assert optimizer.defaults["scale_parameter"] is False and optimizer.defaults["relative_step"] is False


def test_optim_args_false_is_false():
    args = TrainingArguments(optim="sgd", optim_args="momentum=0.9,nesterov=false")
    optimizer = build_optimizer(TinyClassifier(), args)
    assert optimizer.defaults["nesterov"] is False and optimizer.defaults["momentum"] == 0.9


# ----- schedulers: built from HF's factory, stepped once per optimizer update -----
def train_tiny(tmp_path, optimizers=(None, None), **kwargs) -> hf_lightning.Trainer:
    settings = dict(
        per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=8, learning_rate=0.1,
        logging_steps=1, save_strategy="no", optim="sgd",
    )
    settings.update(kwargs)
    eval_dataset = classification_dataset(n=4, seed=1) if settings.get("eval_strategy", "no") != "no" else None
    trainer = hf_lightning.Trainer(
        model=TinyClassifier(), args=TrainingArguments(output_dir=str(tmp_path), **settings),
        train_dataset=classification_dataset(n=12), eval_dataset=eval_dataset, optimizers=optimizers,
        lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    trainer.train()
    return trainer


def logged_lrs(trainer) -> list[float]:
    return [e["learning_rate"] for e in trainer.state.log_history if "loss" in e]


def reference_lrs(name: str, lr: float, warmup: int, total: int, kwargs: dict) -> list[float]:
    """The LR of each update under `transformers.get_scheduler`, stepped once after each update."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = transformers.get_scheduler(
        name, optimizer, num_warmup_steps=warmup, num_training_steps=total, scheduler_specific_kwargs=kwargs
    )
    lrs = []
    for _ in range(total):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("name", [n for n in SCHEDULER_NAMES if n not in ("reduce_lr_on_plateau", "greedy")])
def test_every_scheduler_steps_once_per_update(name, tmp_path):
    kwargs = SCHEDULER_KWARGS.get(name, {})
    # 12 samples / batch 2 = 6 micro-batches per epoch, GA=2: 3 updates per epoch, 8 updates over 3 epochs
    trainer = train_tiny(tmp_path, lr_scheduler_type=name, lr_scheduler_kwargs=kwargs, warmup_steps=2)
    scheduler = trainer.lightning_trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == 8 == trainer.state.global_step
    assert logged_lrs(trainer) == pytest.approx(reference_lrs(name, 0.1, 2, 8, kwargs), rel=1e-12, abs=1e-15)


def test_reduce_lr_on_plateau_steps_once_per_evaluation(tmp_path):
    trainer = train_tiny(
        tmp_path, lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="steps", eval_steps=2,
        lr_scheduler_kwargs={"patience": 0, "factor": 0.5},
    )
    scheduler = trainer.lightning_trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert [e["step"] for e in evals] == [2, 4, 6, 8]
    assert scheduler.last_epoch == 4  # one plateau step per evaluation, never per update
    # with patience 0 every non-improving evaluation halves the LR used by the following updates
    lrs = logged_lrs(trainer)
    assert lrs[:2] == [0.1, 0.1]
    assert all(b in (a, a / 2) for a, b in zip(lrs, lrs[1:]))


@pytest.mark.parametrize("warmup, expected_warmup", [(3, 3), (3.7, 3), (0.25, 2), (0.3, 3), (0, 0)])
def test_warmup_steps_int_and_fraction(warmup, expected_warmup, tmp_path):
    args = TrainingArguments(warmup_steps=warmup)
    hf_args = transformers.TrainingArguments(output_dir="unused_hf_output", warmup_steps=warmup)
    assert args.get_warmup_steps(8) == hf_args.get_warmup_steps(8) == expected_warmup
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = build_scheduler(optimizer, args, max_steps=8)
    lrs = []
    for _ in range(8):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx(reference_lrs("linear", 0.1, expected_warmup, 8, {}))
    if expected_warmup:
        assert lrs[expected_warmup] == pytest.approx(0.1) and lrs[expected_warmup - 1] < 0.1


def test_fractional_warmup_in_training_uses_max_steps(tmp_path):
    trainer = train_tiny(tmp_path, warmup_steps=0.25)  # ceil(8 * 0.25) = 2 warmup updates
    assert logged_lrs(trainer) == pytest.approx(reference_lrs("linear", 0.1, 2, 8, {}))


# ----- a user-supplied optimizer / scheduler -----
def test_user_optimizer_and_scheduler_are_used(tmp_path):
    model = TinyClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=8,
        logging_steps=1, save_strategy="no", learning_rate=1e-5, warmup_steps=3,  # both ignored by the user's pair
    )
    trainer = hf_lightning.Trainer(
        model=model, args=args, train_dataset=classification_dataset(n=12), optimizers=(optimizer, scheduler),
        lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    trainer.train()
    assert trainer.lightning_trainer.optimizers[0] is optimizer
    assert trainer.lightning_trainer.lr_scheduler_configs[0].scheduler is scheduler
    assert scheduler.last_epoch == 8  # stepped once per update
    assert logged_lrs(trainer) == pytest.approx([0.2] * 3 + [0.1] * 3 + [0.05] * 2)


def test_user_optimizer_without_scheduler_gets_hfs_scheduler(tmp_path):
    model = TinyClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=8,
        logging_steps=1, save_strategy="no", warmup_steps=2,
    )
    trainer = hf_lightning.Trainer(
        model=model, args=args, train_dataset=classification_dataset(n=12), optimizers=(optimizer, None),
        lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    trainer.train()
    assert trainer.lightning_trainer.optimizers[0] is optimizer
    assert logged_lrs(trainer) == pytest.approx(reference_lrs("linear", 0.2, 2, 8, {}))
