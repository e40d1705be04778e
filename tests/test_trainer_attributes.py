"""The `Trainer` attributes HF users read, against `transformers.Trainer`'s at the same moments: inside an HF
callback's `on_step_end`, and before and after `train()`.

What is compared is what a user relies on: which object each attribute is (the one callbacks receive, the one given
to the constructor), and its values. One difference, by design (README "Subclassing the Trainer"): HF's
`trainer.optimizer` is accelerate's `AcceleratedOptimizer` around the torch optimizer; ours is the torch optimizer.
"""

from __future__ import annotations

import copy

import transformers
from transformers import TrainerCallback, TrainerControl, TrainerState

import hf_lightning
from helpers import classification_dataset, tiny_bert

COMMON = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=1, logging_steps=1,
              eval_strategy="steps", eval_steps=2, seed=3, report_to="none", save_strategy="no", disable_tqdm=True)


def torch_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)


class Probe(TrainerCallback):
    """Records, at every `on_step_end`, how the trainer's attributes relate to what the callback receives."""

    def __init__(self) -> None:
        self.trainer = None
        self.given: dict = {}
        self.seen: list[dict] = []

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None,
                    train_dataloader=None, processing_class=None, **kwargs):
        t = self.trainer
        self.seen.append({
            "model": t.model is model and t.model_wrapped is model and t.callback_handler.model is model,
            "optimizer": t.optimizer is optimizer and t.callback_handler.optimizer is optimizer,
            "optimizer_class": type(torch_optimizer(t.optimizer)).__name__,
            "lr": torch_optimizer(t.optimizer).param_groups[0]["lr"],
            "lr_scheduler": t.lr_scheduler is lr_scheduler and t.lr_scheduler.get_last_lr()[0],
            "state": t.state is state and state.global_step,
            "control": t.control is control and isinstance(control, TrainerControl),
            "callbacks": self in t.callback_handler.callbacks,
            "is_in_train": t.is_in_train,
            "args": t.args is args,
            "train_dataset": t.train_dataset is self.given["train"],
            "eval_dataset": t.eval_dataset is self.given["eval"],
            "data_collator": t.data_collator is self.given["collator"],
            "processing_class": t.processing_class is processing_class is self.given["tokenizer"],
            "train_dataloader": len(train_dataloader),
            "model_training": t.model.training,
        })


def run(trainer_cls, args, tmp_path):
    from gen_helpers import word_tokenizer

    probe = Probe()
    tokenizer = word_tokenizer()
    collator = transformers.DataCollatorWithPadding(tokenizer)
    probe.given = {"train": classification_dataset(n=20), "eval": classification_dataset(n=6, seed=1),
                   "collator": collator, "tokenizer": tokenizer}
    extra = {"lightning_kwargs": {"accelerator": "cpu", "logger": False}} if trainer_cls is hf_lightning.Trainer else {}
    trainer = trainer_cls(model=copy.deepcopy(MODEL), args=args, train_dataset=probe.given["train"],
                          eval_dataset=probe.given["eval"], data_collator=collator, processing_class=tokenizer,
                          callbacks=[probe], **extra)
    probe.trainer = trainer
    before = (trainer.optimizer, trainer.lr_scheduler, trainer.is_in_train, isinstance(trainer.state, TrainerState),
              trainer.model is trainer.model_wrapped)
    trainer.train()
    after = (trainer.is_in_train, type(torch_optimizer(trainer.optimizer)).__name__,
             trainer.lr_scheduler.get_last_lr(), trainer.state.global_step, trainer.model is trainer.model_wrapped,
             trainer.callback_handler.optimizer is trainer.optimizer, isinstance(trainer.control, TrainerControl))
    return trainer, probe, before, after


MODEL = tiny_bert()


def test_attributes_match_hf_inside_callbacks_and_after_train(tmp_path):
    hf, hf_probe, hf_before, hf_after = run(
        transformers.Trainer, transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, **COMMON),
        tmp_path)
    ours, probe, before, after = run(
        hf_lightning.Trainer, hf_lightning.TrainingArguments(output_dir=str(tmp_path / "ours"), **COMMON), tmp_path)
    assert len(probe.seen) == len(hf_probe.seen) == 3
    assert probe.seen == hf_probe.seen
    assert all(entry["model"] and entry["optimizer"] and entry["callbacks"] and entry["is_in_train"]
               for entry in probe.seen)  # the comparison is not between two sets of False
    assert before == hf_before == (None, None, False, True, True)
    assert after == hf_after
    assert after[:2] == (False, "AdamW")


def test_setting_attributes_as_hf_users_do(tmp_path):
    """`trainer.train_dataset = ...`, `trainer.eval_dataset = ...` and `trainer.model = ...` before `train()` are
    what the run uses, as in HF."""
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), **{**COMMON, "eval_strategy": "no"})
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(n=8),
                                   lightning_kwargs={"accelerator": "cpu", "logger": False})
    trainer.train_dataset = classification_dataset(n=24)
    trainer.eval_dataset = {"dev": classification_dataset(n=6, seed=2)}
    replacement = tiny_bert(seed=5)
    trainer.model = replacement
    trainer.train()
    assert trainer.state.global_step == 3  # 6 micro-batches of 4 in windows of 2
    assert trainer.model is replacement and trainer.state.log_history[0]["step"] == 1
    assert set(trainer.evaluate()) >= {"eval_dev_loss", "epoch"}
