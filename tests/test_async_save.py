"""`save_async=True`: checkpoints written by a background thread, with every guarantee of a synchronous save.

A tokenizer whose `save_pretrained` waits for the training thread (`GatedTokenizer`) makes the background write
observable without any timing: if the save blocked training, the next update could never release it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

import hf_lightning
from helpers import lm_dataset, tiny_gpt2, wait_for_line

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
SCRIPT = Path(__file__).parent / "scripts" / "async_save_train.py"
FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "lightning_state.pt",
         "trainer_state.json", "config.json", "generation_config.json")


def _args(out: Path, **overrides) -> hf_lightning.TrainingArguments:
    settings = dict(output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=8,
                    learning_rate=1e-2, logging_steps=1, save_steps=1, seed=7, report_to="none", disable_tqdm=True,
                    eval_strategy="steps", eval_steps=3)
    settings.update(overrides)
    return hf_lightning.TrainingArguments(**settings)


def _train(out: Path, resume=None, model_seed=0, callbacks=(), processing_class=None, **overrides):
    trainer = hf_lightning.Trainer(model=tiny_gpt2(dropout=0.1, seed=model_seed), args=_args(out, **overrides),
                                   train_dataset=lm_dataset(n=40), eval_dataset=lm_dataset(n=6, seed=1),
                                   processing_class=processing_class, callbacks=list(callbacks),
                                   lightning_kwargs=dict(LIGHTNING_KWARGS))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _same_file(a: Path, b: Path) -> bool:
    if a.suffix == ".safetensors":
        wa, wb = load_file(str(a)), load_file(str(b))
        return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    if a.suffix in (".pt", ".pth"):
        return _equal(torch.load(a, weights_only=False), torch.load(b, weights_only=False))
    if a.name == "trainer_state.json":  # the same, but for the measured times of the evaluations
        untimed = re.compile(r'\n\s*"eval_(runtime|samples_per_second|steps_per_second)": [0-9.]+,?')
        return untimed.sub("", a.read_text()) == untimed.sub("", b.read_text())
    return a.read_bytes() == b.read_bytes()


def _equal(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y))
    if type(x).__module__ == "numpy" or hasattr(x, "shape"):
        import numpy as np

        return bool(np.array_equal(x, y))
    return x == y


def test_async_checkpoints_are_the_synchronous_ones_and_resume_exactly(tmp_path, one_thread):
    """Every file of every kept checkpoint (save every update, rotation to 3, evaluations between) is the same
    as a synchronous save's; a run resumed from an async checkpoint continues like the uninterrupted one."""
    sync = _train(tmp_path / "sync", save_total_limit=3)
    background = _train(tmp_path / "async", save_total_limit=3, save_async=True)
    kept = sorted(p.name for p in (tmp_path / "sync").iterdir() if p.name.startswith("checkpoint-"))
    assert kept == ["checkpoint-6", "checkpoint-7", "checkpoint-8"]
    assert sorted(p.name for p in (tmp_path / "async").iterdir() if p.name.startswith("checkpoint-")) == kept
    for name in kept:
        for file in FILES:
            assert _same_file(tmp_path / "sync" / name / file, tmp_path / "async" / name / file), (name, file)
    assert not [p for p in (tmp_path / "async").iterdir() if "tmp" in p.name or "deleting" in p.name]
    resumed = _train(tmp_path / "resumed", resume=str(tmp_path / "async" / "checkpoint-6"), model_seed=3,
                     save_async=True)
    after = [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
             for e in resumed.state.log_history if e["step"] > 6 and "train_loss" not in e]
    assert after == [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
                     for e in sync.state.log_history if e["step"] > 6 and "train_loss" not in e]
    assert _same_file(tmp_path / "sync" / "checkpoint-8" / "model.safetensors",
                      tmp_path / "resumed" / "checkpoint-8" / "model.safetensors")
    def stable(history):
        return [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k} for e in history]

    assert stable(background.state.log_history) == stable(sync.state.log_history)


class GatedTokenizer:
    """A processing class whose `save_pretrained` (run by the checkpoint writer) waits, at `gated_step`, until the
    training thread opens the gate; records which checkpoint folders existed meanwhile and every save's span."""

    def __init__(self, output_dir: Path, gated_step: int) -> None:
        self.output_dir, self.gated_step = output_dir, gated_step
        self.gate = threading.Event()
        self.opened_in_time = None
        self.active = 0
        self.most_active = 0
        self.saves = 0

    def save_pretrained(self, directory) -> None:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        self.saves += 1
        if str(directory).split("tmp-checkpoint-")[-1].split("-")[0] == str(self.gated_step):
            self.opened_in_time = self.gate.wait(timeout=300)  # a blocking save never sees the gate open
        self.active -= 1


class OpenGate(TrainerCallback):
    """At the end of update `gated_step + 1`, note which checkpoints exist, then open the gate."""

    def __init__(self, tokenizer: GatedTokenizer) -> None:
        self.tokenizer = tokenizer
        self.seen: list[str] = []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.tokenizer.gated_step + 1:
            self.seen = sorted(p.name for p in self.tokenizer.output_dir.iterdir() if p.name.startswith("checkpoint-"))
            self.tokenizer.gate.set()


def test_training_goes_on_while_a_checkpoint_is_written_and_rotation_waits_for_it(tmp_path, one_thread):
    """The save of update 3 is held until update 4 has run: training went on meanwhile (a synchronous save would
    wait for ever), checkpoint-3 did not exist yet and checkpoint-2 was not rotated away (limit 1); one save at a
    time; afterwards the usual folders."""
    tokenizer = GatedTokenizer(tmp_path / "out", gated_step=3)
    gate = OpenGate(tokenizer)
    trainer = _train(tmp_path / "out", callbacks=[gate], processing_class=tokenizer, save_async=True,
                     save_total_limit=1, eval_strategy="no", max_steps=6)
    assert tokenizer.opened_in_time is True
    assert gate.seen == ["checkpoint-2"]
    assert tokenizer.most_active == 1 and tokenizer.saves == 6
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if "checkpoint" in p.name) == ["checkpoint-6"]
    assert trainer.state.global_step == 6


class FailingTokenizer:
    def save_pretrained(self, directory) -> None:
        if "tmp-checkpoint-2-" in str(directory):
            raise OSError(28, "No space left on device (simulated by the test's tokenizer)")


def test_an_error_in_the_background_ends_training_with_it(tmp_path, one_thread):
    """The write of checkpoint-2 fails in the background thread: the training process raises it (at the next save),
    its unfinished folder is removed and checkpoint-1 is intact."""
    with pytest.raises(OSError, match="simulated by the test's tokenizer"):
        _train(tmp_path / "out", processing_class=FailingTokenizer(), save_async=True, eval_strategy="no")
    names = sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith("."))
    assert names == ["checkpoint-1"]


def test_the_end_of_train_waits_for_the_last_checkpoint(tmp_path, one_thread):
    class SlowTokenizer:
        def save_pretrained(self, directory) -> None:
            threading.Event().wait(0.5)  # a slow disk: the last write is still running when training ends

    trainer = _train(tmp_path / "out", processing_class=SlowTokenizer(), save_async=True, eval_strategy="no",
                     max_steps=3, load_best_model_at_end=False)
    assert (tmp_path / "out" / "checkpoint-3" / "trainer_state.json").is_file()
    assert not trainer.flow.checkpoints.saver.background.busy


def test_a_kill_during_a_background_write_leaves_no_checkpoint_and_the_run_resumes(tmp_path):
    """SIGKILL while checkpoint-3 is being written in the background: no `checkpoint-3` (only its temporary
    folder), and `resume_from_checkpoint=True` continues from checkpoint-2 to the end."""
    out = tmp_path / "out"
    # the checkout first (not whatever hf_lightning is installed), then the scripts' helpers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), str(Path(__file__).parent)])}
    process = subprocess.Popen([sys.executable, str(SCRIPT), str(out), "hang-at-3"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_line(process, "WRITING 3", timeout=300)  # the script prints it when the write of checkpoint-3 has begun
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert "checkpoint-3" not in names and "checkpoint-2" in names
    assert any(name.startswith("tmp-checkpoint-3-") for name in names)
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "resume"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RESUMED FROM 2, ENDED AT 5" in done.stdout
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4", "checkpoint-5"]


def test_save_async_is_refused_under_fsdp2_before_training(tmp_path):
    """FSDP2 gathers weights and writes optimizer shards with collectives, which cannot run beside training: the
    run stops at its start with one error saying so (2 gloo processes)."""
    import json

    result = tmp_path / "result.json"
    script = Path(__file__).parent / "scripts" / "checkpoint_train.py"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, str(script), "resume", str(tmp_path), "fsdp2-async", str(result)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "save_async=True is not supported for a sharded model (FSDP2, FSDP or DeepSpeed)" in json.loads(result.read_text())["error"]
    assert not list((tmp_path / "full").glob("checkpoint-*"))


def test_save_async_with_an_overridden_save_model_is_refused_at_construction(tmp_path):
    """An overridden `save_model` writes each checkpoint's model files from the live model while training waits, so
    it cannot run in the background: one error naming both, before anything is built; without save_async it runs."""

    class OwnSave(hf_lightning.Trainer):
        def save_model(self, output_dir=None, _internal_call=False):
            super().save_model(output_dir, _internal_call)

    def build(**overrides):
        return OwnSave(model=tiny_gpt2(), args=_args(tmp_path, **overrides), train_dataset=lm_dataset(n=8),
                       lightning_kwargs=dict(LIGHTNING_KWARGS))

    with pytest.raises(ValueError, match=r"save_async=True cannot be combined with an overridden save_model"):
        build(save_async=True, eval_strategy="no")
    build(save_async=False, eval_strategy="no")
    hf_lightning.Trainer(model=tiny_gpt2(), args=_args(tmp_path, save_async=True, eval_strategy="no"),
                         train_dataset=lm_dataset(n=8), lightning_kwargs=dict(LIGHTNING_KWARGS))
