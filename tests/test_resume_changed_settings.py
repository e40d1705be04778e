"""Resuming with changed settings (issue 21, item 4), against the real `transformers.Trainer` (the oracle).

The real `transformers.Trainer` writes a mid-epoch checkpoint (step 4 of 8). Each test resumes from it with one
setting changed, through HF and through hf_lightning, into fresh output folders:

- what each run does is HF's: a new `learning_rate` / `weight_decay` is not applied (HF's resumed run logs the
  losses and learning rates of the unchanged run); a new schedule, length or seed is applied from the resumed step
  (HF's resumed run differs from the unchanged one) and ours logs what HF's logs;
- ours names each changed setting once, in one warning, with old -> new and that effect;
- another optimizer class (`optim` adamw -> sgd / adafactor) is refused before anything is loaded or trained, with
  how to start the optimizer fresh; HF fails at the first update with a `KeyError`.
"""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

import hf_lightning
from helpers import CPU_QUIET, lm_dataset, tiny_gpt2

ARGS = dict(per_device_train_batch_size=2, max_steps=8, learning_rate=1e-2, warmup_steps=2, logging_steps=1,
            save_strategy="steps", save_steps=4, seed=7, report_to="none", disable_tqdm=True, optim="adamw_torch",
            use_cpu=True)


def _model():
    gpt2 = tiny_gpt2(dropout=0.1)
    gpt2.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    return gpt2


def run_hf(output_dir, resume=None, **changes):
    args = transformers.TrainingArguments(output_dir=str(output_dir), **{**ARGS, **changes})
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=lm_dataset(n=16))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def run_ours(output_dir, resume=None, **changes):
    trainer = hf_lightning.Trainer(model=_model(), args=hf_lightning.TrainingArguments(
        output_dir=str(output_dir), **{**ARGS, **changes}), train_dataset=lm_dataset(n=16), lightning_kwargs=CPU_QUIET)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def after_resume(trainer) -> list[tuple]:
    return [(e["step"], e["loss"], e["learning_rate"]) for e in trainer.state.log_history
            if e["step"] > 4 and "loss" in e]


def assert_same(got: list[tuple], want: list[tuple]) -> None:
    assert [g[0] for g in got] == [w[0] for w in want] and got
    for (_, loss, lr), (_, hf_loss, hf_lr) in zip(got, want):
        assert loss == pytest.approx(hf_loss, rel=1e-5) and lr == pytest.approx(hf_lr, rel=1e-9)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """HF's uninterrupted run and its step-4 checkpoint."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("changed")
    unchanged = run_hf(root / "hf")
    return str(root / "hf" / "checkpoint-4"), after_resume(unchanged)


def _setting_lines(caplog) -> list[str]:
    warnings = [r.getMessage() for r in caplog.records if "differ from the checkpoint's training_args.bin" in
                r.getMessage()]
    assert len(warnings) == 1, warnings  # one warning
    return warnings[0].splitlines()[1:]


def test_new_optimizer_hyperparameters_are_named_and_not_applied_as_in_hf(checkpoint, tmp_path, caplog, one_thread):
    path, unchanged = checkpoint
    changes = dict(learning_rate=0.1, weight_decay=0.5)
    hf_run = run_hf(tmp_path / "hf", path, **changes)
    assert_same(after_resume(hf_run), unchanged)  # HF: the checkpoint's optimizer and scheduler state win
    with caplog.at_level(logging.WARNING):
        ours = run_ours(tmp_path / "ours", path, **changes)
    assert_same(after_resume(ours), unchanged)
    lines = _setting_lines(caplog)
    assert lines == [
        "  learning_rate: 0.01 -> 0.1: not applied: the checkpoint's optimizer state keeps the old value (as "
        "transformers.Trainer does); to use the new one, start a new run from the checkpoint's weights",
        "  weight_decay: 0.0 -> 0.5: not applied: the checkpoint's optimizer state keeps the old value (as "
        "transformers.Trainer does); to use the new one, start a new run from the checkpoint's weights",
    ]


@pytest.mark.parametrize("change", [dict(lr_scheduler_type="constant"), dict(warmup_steps=6), dict(max_steps=12),
                                    dict(seed=8)], ids=lambda c: next(iter(c)))
def test_a_new_schedule_length_or_seed_is_named_and_applied_from_the_resumed_step_as_in_hf(
        checkpoint, tmp_path, caplog, change, one_thread):
    path, unchanged = checkpoint
    hf_run = run_hf(tmp_path / "hf", path, **change)
    hf_after = after_resume(hf_run)
    assert hf_after != unchanged  # HF applies it
    with caplog.at_level(logging.WARNING):
        ours = run_ours(tmp_path / "ours", path, **change)
    assert_same(after_resume(ours), hf_after)
    (name, new), = change.items()
    (line,) = _setting_lines(caplog)
    old = {"lr_scheduler_type": "linear"}.get(name, ARGS.get(name))
    assert line.startswith(f"  {name}: {old!r} -> {new!r}: applied")
    if name == "seed":
        assert "data order, also of the rest of the resumed epoch" in line
    else:
        assert "the learning rate follows the new schedule from step 4 on, not restarted" in line


@pytest.mark.parametrize(("optim", "hf_error"), [("sgd", "momentum"), ("adafactor", "beta1")])
def test_another_optimizer_class_is_refused_before_training(checkpoint, tmp_path, optim, hf_error, one_thread):
    path, _ = checkpoint
    with pytest.raises(KeyError, match=hf_error):  # HF: the AdamW state loads, the first update fails
        run_hf(tmp_path / "hf", path, optim=optim)
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = hf_lightning.Trainer(model=model, args=hf_lightning.TrainingArguments(
        output_dir=str(tmp_path / "ours"), **{**ARGS, "optim": optim}), train_dataset=lm_dataset(n=16),
        lightning_kwargs=CPU_QUIET)
    with pytest.raises(ValueError) as info:
        trainer.train(resume_from_checkpoint=path)
    message = str(info.value)
    assert f"optim changed from 'adamw_torch' (AdamW) to {optim!r}" in message
    assert "start the optimizer fresh" in message and f"from_pretrained({path!r})" in message
    assert "without resume_from_checkpoint" in message
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing loaded, nothing trained
    assert not list((tmp_path / "ours").glob("checkpoint-*"))


def test_an_unchanged_resume_names_nothing(checkpoint, tmp_path, caplog, one_thread):
    path, unchanged = checkpoint
    with caplog.at_level(logging.WARNING):
        ours = run_ours(tmp_path / "ours", path)
    assert_same(after_resume(ours), unchanged)
    assert not [r for r in caplog.records if "training_args.bin" in r.getMessage()]
