"""`TransformerModule`: train mode during training, user `compute_loss` overrides ported verbatim from an HF
`Trainer` subclass, label smoothing, HF's error for a model without a loss, and plain `nn.Module`s."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import pytest
import torch
import transformers
from torch import nn

import hf_lightning
from hf_lightning import HFTrainerFlow, TrainingArguments, TransformerDataModule, TransformerModule
from helpers import VOCAB, classification_dataset, lm_dataset, tiny_bert, tiny_gpt2

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


def train_logs(trainer) -> list[dict]:
    return [e for e in trainer.state.log_history if "loss" in e]


def run_hf(model, dataset, tmp_path, trainer_cls=transformers.Trainer, **kwargs):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), use_cpu=True, disable_tqdm=True, report_to="none", save_strategy="no",
        **kwargs,
    )
    trainer = trainer_cls(model=model, args=args, train_dataset=dataset)
    trainer.train()
    return trainer


def run_ours(model, dataset, tmp_path, trainer_cls=hf_lightning.Trainer, **kwargs):
    args = TrainingArguments(output_dir=str(tmp_path / "ours"), save_strategy="no", **kwargs)
    trainer = trainer_cls(model=model, args=args, train_dataset=dataset, lightning_kwargs=dict(LIGHTNING_KWARGS))
    trainer.train()
    return trainer


def assert_same_losses(hf_trainer, our_trainer) -> None:
    hf_losses = [e["loss"] for e in train_logs(hf_trainer)]
    our_losses = [e["loss"] for e in train_logs(our_trainer)]
    assert len(our_losses) == len(hf_losses) > 0
    assert our_losses == pytest.approx(hf_losses, rel=1e-5)


# ----- train mode -----
class ModeRecordingModule(TransformerModule):
    """Records, at every `compute_loss`, whether Lightning is training and the modes of the model and a dropout."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        dropout = self.model.bert.embeddings.dropout
        self.modes.append((self.trainer.training, model.training, dropout.training))
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class ModeRecordingTrainer(hf_lightning.Trainer):
    module_class = ModeRecordingModule


def test_model_from_pretrained_trains_with_dropout_on(tmp_path):
    tiny_bert(dropout=0.3).save_pretrained(tmp_path / "pretrained")
    model = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "pretrained")
    assert not model.training  # from_pretrained returns eval mode
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=4, eval_strategy="steps",
        eval_steps=2, save_strategy="no",
    )
    trainer = ModeRecordingTrainer(
        model=model, args=args, train_dataset=classification_dataset(n=16),
        eval_dataset=classification_dataset(n=4, seed=1), lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    trainer.module.modes = []
    trainer.train()
    training = [m for m in trainer.module.modes if m[0]]
    evaluating = [m for m in trainer.module.modes if not m[0]]
    assert len(training) == 4 and len(evaluating) == 2  # 4 updates, evaluations at steps 2 and 4 (1 batch each)
    assert all(model_mode and dropout_mode for _, model_mode, dropout_mode in training)  # also after evaluation
    assert not any(model_mode or dropout_mode for _, model_mode, dropout_mode in evaluating)


# ----- a compute_loss override copied verbatim from an HF Trainer subclass -----
def weighted_compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
    # The HF docs' custom-loss example ("Customize the Trainer"), token-normalised version.
    labels = inputs.pop("labels")
    # forward pass
    outputs = model(**inputs)
    logits = outputs.get("logits")
    # compute custom loss for 3 labels with different weights
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss_fct = nn.CrossEntropyLoss(
        weight=torch.tensor([1.0, 2.0, 3.0], device=model.device, dtype=logits.dtype), reduction=reduction
    )
    loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
    if num_items_in_batch is not None:
        loss = loss / num_items_in_batch
    return (loss, outputs) if return_outputs else loss


def weighted_mean_compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
    # The older docs version: a plain per-batch mean that ignores `num_items_in_batch` (HF 5 passes it, so it must be
    # in the signature).
    labels = inputs.pop("labels")
    outputs = model(**inputs)
    logits = outputs.get("logits")
    loss_fct = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0], device=model.device))
    loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
    return (loss, outputs) if return_outputs else loss


def three_label_data(n: int):
    data = classification_dataset(n=n)
    return data.map(lambda row, i: {"label": i % 3}, with_indices=True)


@pytest.mark.parametrize("method", [weighted_compute_loss, weighted_mean_compute_loss], ids=["normalised", "mean"])
def test_verbatim_hf_compute_loss_override_matches_hf(method, tmp_path):
    """Same losses as the real HF Trainer subclass, GA=2 included: a user loss follows HF's scaling rule (the per-batch
    mean version is not divided by GA for a model taking **kwargs, exactly as in HF)."""

    class HFWeighted(transformers.Trainer):
        compute_loss = method

    class OurWeightedModule(TransformerModule):
        compute_loss = method

    class OurWeighted(hf_lightning.Trainer):
        module_class = OurWeightedModule

    model, data = tiny_bert(num_labels=3, dropout=0.0), three_label_data(24)
    common = dict(
        per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=4, learning_rate=1e-3,
        logging_steps=1, seed=0, optim="adamw_torch",
    )
    hf = run_hf(copy.deepcopy(model), data, tmp_path, trainer_cls=HFWeighted, **common)
    ours = run_ours(copy.deepcopy(model), data, tmp_path, trainer_cls=OurWeighted, **common)
    assert isinstance(ours.module, OurWeightedModule)
    assert_same_losses(hf, ours)
    # the weights really matter: the unweighted model loss differs
    plain = run_ours(copy.deepcopy(model), data, tmp_path, **common)
    assert train_logs(plain)[0]["loss"] != pytest.approx(train_logs(ours)[0]["loss"], rel=1e-3)


def test_override_in_a_lightning_native_fit_with_the_flow_callback(tmp_path):
    class OurWeightedModule(TransformerModule):
        compute_loss = weighted_compute_loss

    class HFWeighted(transformers.Trainer):
        compute_loss = weighted_compute_loss

    model, data = tiny_bert(num_labels=3, dropout=0.0), three_label_data(16)
    common = dict(per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3, logging_steps=1, seed=0,
                  optim="adamw_torch")
    hf = run_hf(copy.deepcopy(model), data, tmp_path, trainer_cls=HFWeighted, **common)

    args = TrainingArguments(output_dir=str(tmp_path / "native"), save_strategy="no", **common)
    transformers.set_seed(args.seed)
    flow = HFTrainerFlow(args)
    trainer = pl.Trainer(
        callbacks=[flow], use_distributed_sampler=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
        **LIGHTNING_KWARGS,
    )
    module = OurWeightedModule(copy.deepcopy(model), args)
    trainer.fit(module, datamodule=TransformerDataModule(train_dataset=data, args=args))
    assert trainer.global_step == 3
    assert [e["loss"] for e in train_logs(flow)] == pytest.approx([e["loss"] for e in train_logs(hf)], rel=1e-5)


# ----- label smoothing -----
def test_label_smoothing_matches_hf_for_bert(tmp_path):
    model, data = tiny_bert(dropout=0.0), classification_dataset(n=24)
    common = dict(
        per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=3, learning_rate=1e-3,
        logging_steps=1, seed=0, optim="adamw_torch", label_smoothing_factor=0.2,
    )
    hf = run_hf(copy.deepcopy(model), data, tmp_path, **common)
    ours = run_ours(copy.deepcopy(model), data, tmp_path, **common)
    assert ours.module.label_smoother is not None
    assert_same_losses(hf, ours)


def test_label_smoothing_matches_hf_for_gpt2_with_shifted_labels(tmp_path):
    model, data = tiny_gpt2(dropout=0.0), lm_dataset(n=16)
    # HF 5.23 counts label position 0 for GPT2LMHeadModel (its loss_type is None); this makes HF count correctly
    model.loss_type = "ForCausalLM"
    common = dict(
        per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=3, learning_rate=1e-3,
        logging_steps=1, seed=0, optim="adamw_torch", label_smoothing_factor=0.1,
    )
    hf = run_hf(copy.deepcopy(model), data, tmp_path, **common)
    ours = run_ours(copy.deepcopy(model), data, tmp_path, **common)
    assert_same_losses(hf, ours)

    # the smoothed loss is (1 - eps) * NLL + eps * mean(-log p) over the *shifted* labels
    batch = {k: torch.tensor(v) for k, v in lm_dataset(n=4)[:4].items()}
    module = TransformerModule(copy.deepcopy(model), TrainingArguments(label_smoothing_factor=0.1))
    with torch.no_grad():
        smoothed = module.compute_loss(module.model, dict(batch))
        logits = module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    targets = batch["labels"][:, 1:]
    mask = targets.ne(-100)
    nll = -log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)[mask].mean()
    uniform = -log_probs.mean(dim=-1)[mask].mean()
    assert smoothed.item() == pytest.approx((0.9 * nll + 0.1 * uniform).item(), rel=1e-5)


# ----- plain nn.Modules -----
class PlainClassifier(nn.Module):
    """No `**kwargs` in forward (so `model_accepts_loss_kwargs` is False), returns a dict."""

    def __init__(self, with_loss: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.with_loss = with_loss
        self.emb = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.emb(input_ids).mean(dim=1))
        if not self.with_loss:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_model_returning_a_dict_without_loss_raises_hfs_error(tmp_path):
    data = classification_dataset(n=8)
    with pytest.raises(ValueError) as hf_info:
        run_hf(PlainClassifier(with_loss=False), data, tmp_path, max_steps=1)
    with pytest.raises(ValueError) as info:
        run_ours(PlainClassifier(with_loss=False), data, tmp_path, max_steps=1)
    assert str(info.value) == str(hf_info.value)
    assert "The model did not return a loss from the inputs, only the following keys: logits." in str(info.value)


def test_plain_module_returning_a_loss_trains_like_hf(tmp_path):
    data = classification_dataset(n=40)
    common = dict(
        per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=4, learning_rate=0.05,
        logging_steps=1, seed=0, optim="adamw_torch",
    )
    hf = run_hf(PlainClassifier(), data, tmp_path, **common)
    ours = run_ours(PlainClassifier(), data, tmp_path, **common)
    assert not ours.module.model_accepts_loss_kwargs
    assert ours.state.global_step == hf.state.global_step == 20  # 10 micro-batches per epoch: 5 windows x 4 epochs
    assert_same_losses(hf, ours)
    losses = [e["loss"] for e in train_logs(ours)]
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns


# ----- the hook owner (contracts.HFStepHooks): chosen once, never rebuilt -----
def test_hook_owner_is_built_once_and_a_copy_owns_its_own(tmp_path):
    """A bare module's hooks are its `ModuleStepHooks` (the same object at every read, answering HF's names from
    the module); a `Trainer` is its module's owner, and its `accelerator` is built once; a deep copy of the module
    (e.g. an EMA callback's) is its own owner again."""
    from hf_lightning.module.hooks import ModuleStepHooks

    module = TransformerModule(tiny_bert(), TrainingArguments(output_dir=str(tmp_path / "bare")))
    hooks = module.hooks
    assert isinstance(hooks, ModuleStepHooks) and module.hooks is hooks
    assert hooks.loss_is_scaled_for_ga is None
    module.loss_is_scaled_for_ga = True
    assert hooks.loss_is_scaled_for_ga is True  # read from the module at each call

    trainer = hf_lightning.Trainer(model=tiny_bert(), args=TrainingArguments(output_dir=str(tmp_path / "out")))
    assert trainer.module.hooks is trainer
    assert trainer.accelerator is trainer.accelerator
    copied = copy.deepcopy(trainer.module)
    assert isinstance(copied.hooks, ModuleStepHooks) and copied.hooks is not trainer.module.hooks
    assert copied.hooks._module is copied
