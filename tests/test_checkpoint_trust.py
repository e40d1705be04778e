"""Checkpoints that verify themselves, and no checkpoint of poisoned weights (issue 21, items 3 and 5).

- Manifest: every `checkpoint-<n>` hf_lightning writes lists each file's size and checksum; a resume,
  `load_best_model_at_end` and `hf-lightning verify` refuse a folder whose files differ from it (an edited
  `trainer_state.json`, 1,000 inverted bytes inside `model.safetensors` with the size unchanged), naming the file and
  the previous good checkpoint. `trainer_state.json`'s `global_step` must be the folder's step, also in checkpoints of
  `transformers.Trainer` (no manifest), which still resume.
- Non-finite weights: one NaN regression label turns every weight into NaN; the next save stops the run with
  `NonFiniteWeightsError` (the step, the first such parameter), writes no checkpoint, and the last finite one stays
  (`save_total_limit=1` does not rotate it away). `save_nonfinite_checkpoints=True` saves them, as the real
  `transformers.Trainer` does.

(The 2-process manifests, DDP with `save_async` and FSDP2's sharded optimizer: tests/test_checkpoint_processes.py.)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CPU_QUIET, classification_dataset, lm_dataset, load_script, tiny_bert, tiny_gpt2
from safetensors.torch import load_file
from transformers import TrainerCallback

import hf_lightning
from hf_lightning.checkpoint.finite import NonFiniteWeightsError, first_nonfinite
from hf_lightning.checkpoint.integrity import DamagedCheckpointError
from hf_lightning.checkpoint.manifest import MANIFEST_NAME, file_checksum
from hf_lightning.checkpoint.verify import verify_path

SCRIPT = Path(__file__).parent / "scripts" / "fault_train.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                 os.environ.get("PYTHONPATH")]))}


def _script():
    return load_script("fault_train")


def _verify(*paths) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hf_lightning", "verify", *map(str, paths)], env=ENV,
                          capture_output=True, text=True, timeout=120)


def _invert(path: Path, start: int, count: int = 1000) -> None:
    """Invert `count` bytes of `path` from `start`: the size stays, every structural check still passes."""
    data = bytearray(path.read_bytes())
    data[start:start + count] = bytes(b ^ 0xFF for b in data[start:start + count])
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """Our run: checkpoint-2 and checkpoint-4 of a tiny GPT-2."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("ours") / "out"
    _script().make_trainer(str(out), max_steps=4, save_steps=2, save_total_limit=None).train()
    return out


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """The same run through the real `transformers.Trainer`: its checkpoints have no manifest."""
    import transformers

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("hf") / "out"
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=2, max_steps=4, learning_rate=1e-2, logging_steps=1,
        save_strategy="steps", save_steps=2, seed=5, report_to="none", disable_tqdm=True, optim="adamw_torch",
        use_cpu=True)
    transformers.Trainer(model=tiny_gpt2(dropout=0.1), args=args, train_dataset=lm_dataset(n=16)).train()
    return out


# ----- the manifest -----
def test_every_checkpoint_lists_each_file_with_its_size_and_checksum(two_checkpoints):
    for folder in (two_checkpoints / "checkpoint-2", two_checkpoints / "checkpoint-4"):
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
        assert manifest["step"] == int(folder.name.rpartition("-")[2]) and manifest["algorithm"] == "xxh3_128"
        on_disk = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST_NAME)
        assert sorted(manifest["files"]) == on_disk
        for name, entry in manifest["files"].items():
            assert entry["size"] == (folder / name).stat().st_size
            assert entry["xxh3_128"] == file_checksum(folder / name)
    verdicts = verify_path(two_checkpoints)
    assert [(v.folder.name, v.ok, v.has_manifest) for v in verdicts] == [("checkpoint-2", True, True),
                                                                          ("checkpoint-4", True, True)]


def test_an_edited_global_step_is_refused_naming_the_previous_good_checkpoint(two_checkpoints, tmp_path, one_thread):
    out = tmp_path / "out"
    shutil.copytree(two_checkpoints, out)
    state_file = out / "checkpoint-4" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["global_step"] = 30
    state_file.write_text(json.dumps(state, indent=2))
    trainer = _script().make_trainer(str(out), max_steps=6, save_steps=2, save_total_limit=None)
    with pytest.raises(DamagedCheckpointError) as info:
        trainer.train(resume_from_checkpoint=True)
    message = str(info.value)
    assert "trainer_state.json is damaged (" in message
    assert f"The previous complete checkpoint is {str(out / 'checkpoint-2')!r}" in message
    # the manifest removed too: the step rule alone refuses it
    (out / "checkpoint-4" / MANIFEST_NAME).unlink()
    with pytest.raises(DamagedCheckpointError, match=r"its global_step is 30, but the folder is checkpoint-4"):
        trainer.train(resume_from_checkpoint=True)


def test_inverted_bytes_inside_the_weights_are_refused_before_loading(two_checkpoints, tmp_path, one_thread):
    out = tmp_path / "out"
    shutil.copytree(two_checkpoints, out)
    weights = out / "checkpoint-4" / "model.safetensors"
    size = weights.stat().st_size
    _invert(weights, size // 2)
    assert weights.stat().st_size == size
    trainer = _script().make_trainer(str(out), max_steps=6, save_steps=2, save_total_limit=None)
    with pytest.raises(DamagedCheckpointError, match=r"model.safetensors is damaged \(its checksum differs .*"
                                                     r"The previous complete checkpoint is .*checkpoint-2"):
        trainer.train(resume_from_checkpoint=True)
    # following the advice works
    shutil.move(out / "checkpoint-4", tmp_path / "bad-checkpoint-4")
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6
    assert all(v.ok and v.has_manifest for v in verify_path(out))  # the resumed run's checkpoints too


def test_the_verify_command_reports_one_line_per_checkpoint_and_fails_on_a_bad_one(two_checkpoints, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(two_checkpoints, out)
    good = _verify(out)
    assert good.returncode == 0, good.stderr
    lines = good.stdout.splitlines()
    assert lines[1:] == ["OK      checkpoint-2: 9 files match the manifest",
                         "OK      checkpoint-4: 9 files match the manifest"]
    _invert(out / "checkpoint-4" / "optimizer.pt", 5000)
    bad = _verify(out)
    assert bad.returncode == 1
    assert bad.stdout.splitlines()[2] == (
        "FAILED  checkpoint-4: optimizer.pt: its checksum differs from the one recorded at the save (altered or "
        "corrupted since) (previous good checkpoint: checkpoint-2)")
    one = _verify(out / "checkpoint-2")  # a single folder
    assert one.returncode == 0 and one.stdout == "OK      checkpoint-2: 9 files match the manifest\n"
    (tmp_path / "empty").mkdir()
    nothing = _verify(tmp_path / "empty")
    assert nothing.returncode == 2 and "neither a checkpoint folder" in nothing.stderr


def test_verify_of_a_path_that_does_not_exist_says_so_in_one_line(tmp_path):
    """Before: "... is neither a checkpoint folder nor a folder holding checkpoint-<n> folders" (a typo in the path
    read as a folder without checkpoints)."""
    missing = tmp_path / "outptu_dir"
    result = _verify(missing)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"hf-lightning verify: {str(missing)!r} does not exist\n"


def test_checkpoints_of_transformers_trainer_have_no_manifest_and_still_resume(hf_checkpoints, tmp_path, one_thread):
    out = tmp_path / "out"
    shutil.copytree(hf_checkpoints, out)
    assert not (out / "checkpoint-4" / MANIFEST_NAME).exists()
    report = _verify(out)
    assert report.returncode == 0, report.stdout
    assert report.stdout.splitlines()[1:] == [
        "OK      checkpoint-2: no manifest (not written by hf_lightning): files whole, step matches",
        "OK      checkpoint-4: no manifest (not written by hf_lightning): files whole, step matches"]
    trainer = _script().make_trainer(str(tmp_path / "resumed"), max_steps=6, save_steps=2, save_total_limit=None)
    trainer.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert trainer.state.global_step == 6
    # an HF checkpoint with another step's trainer_state.json is refused by the step rule
    shutil.copy(out / "checkpoint-2" / "trainer_state.json", out / "checkpoint-4" / "trainer_state.json")
    with pytest.raises(DamagedCheckpointError, match=r"its global_step is 2, but the folder is checkpoint-4.*"
                                                     r"previous complete checkpoint is .*checkpoint-2"):
        _script().make_trainer(str(tmp_path / "again"), max_steps=6).train(
            resume_from_checkpoint=str(out / "checkpoint-4"))


def test_save_async_checkpoints_carry_a_manifest(tmp_path, one_thread):
    out = tmp_path / "out"
    _script().make_trainer(str(out), max_steps=4, save_steps=1, save_total_limit=None, save_async=True).train()
    verdicts = verify_path(out)
    assert [v.folder.name for v in verdicts] == [f"checkpoint-{n}" for n in (1, 2, 3, 4)]
    assert all(v.ok and v.has_manifest and v.files == 9 for v in verdicts)


class _CorruptBestAtLastSave(TrainerCallback):
    """After the last save, 1,000 bytes inside the best checkpoint's weights are inverted."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.max_steps:
            weights = Path(state.best_model_checkpoint) / "model.safetensors"
            _invert(weights, weights.stat().st_size // 2)


def test_load_best_model_at_end_refuses_an_altered_best_checkpoint(tmp_path, one_thread):
    out = tmp_path / "out"
    trainer = hf_lightning.Trainer(
        model=tiny_gpt2(), train_dataset=lm_dataset(n=16), eval_dataset=lm_dataset(n=4, seed=1),
        args=hf_lightning.TrainingArguments(
            output_dir=str(out), per_device_train_batch_size=2, max_steps=4, eval_strategy="steps", eval_steps=2,
            save_steps=2, load_best_model_at_end=True, report_to="none", disable_tqdm=True),
        callbacks=[_CorruptBestAtLastSave(4)], lightning_kwargs=CPU_QUIET)
    with pytest.raises(DamagedCheckpointError, match=r"load_best_model_at_end=.*model.safetensors is damaged "
                                                     r"\(its checksum differs"):
        trainer.train()


# ----- non-finite weights -----
class _PoisonWeights(TrainerCallback):
    """At the end of update `step`, the word embeddings become NaN, as a diverging run's would: the next update's loss
    is NaN and its step spreads NaN to every weight. (A NaN label, the issue's first reproduction, is now refused
    before training: tests/test_bad_rows.py.) Works on both trainers: HF's callback kwargs carry the model."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.bert.embeddings.word_embeddings.weight.fill_(float("nan"))


def _settings(out: Path) -> dict:
    return dict(output_dir=str(out), per_device_train_batch_size=2, max_steps=8, save_steps=2, save_total_limit=1,
                logging_steps=1, report_to="none", disable_tqdm=True, train_sampling_strategy="sequential")


def _diverging_run(out: Path, **overrides) -> hf_lightning.Trainer:
    """A tiny BERT regressor whose weights turn NaN after update 5 (`_PoisonWeights`)."""
    rows = classification_dataset(n=16).map(lambda r: {"label": float(r["label"])})
    return hf_lightning.Trainer(model=tiny_bert(num_labels=1), args=hf_lightning.TrainingArguments(
        **{**_settings(out), **overrides}), train_dataset=rows, callbacks=[_PoisonWeights(5)],
        lightning_kwargs=CPU_QUIET)


def test_nan_weights_stop_the_run_at_the_save_and_keep_the_last_finite_checkpoint(tmp_path, caplog, one_thread):
    out = tmp_path / "out"
    trainer = _diverging_run(out)
    with caplog.at_level(logging.WARNING), pytest.raises(NonFiniteWeightsError) as info:
        trainer.train()
    message = str(info.value)
    # the weights turn NaN after update 5: the save at step 6 is refused, checkpoint-4 stays (save_total_limit=1 rotated
    # checkpoint-2 away before, and nothing rotates checkpoint-4 away)
    assert message.startswith("Saving at step 6: the model's weights are not finite ("
                              "'bert.embeddings.word_embeddings.weight' holds NaN), so no checkpoint-6 is written")
    assert f"The newest checkpoint, {str(out / 'checkpoint-4')!r}, is kept" in message
    assert "save_nonfinite_checkpoints=True" in message
    assert sorted(os.listdir(out)) == ["checkpoint-4"]  # no temporary folder, the lock given back
    weights = load_file(str(out / "checkpoint-4" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert any("NaN or Inf" in r.getMessage() for r in caplog.records)  # the loss window's warning is kept
    resumed = _diverging_run(out, max_steps=4)  # the finite checkpoint is what a resume picks
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4


def test_save_nonfinite_checkpoints_saves_them_as_transformers_trainer_does(tmp_path, one_thread):
    import transformers

    ours = _diverging_run(tmp_path / "ours", save_nonfinite_checkpoints=True)
    ours.train()
    rows = classification_dataset(n=16).map(lambda r: {"label": float(r["label"])})
    hf_args = transformers.TrainingArguments(**_settings(tmp_path / "hf"), use_cpu=True)
    transformers.Trainer(model=tiny_bert(num_labels=1), args=hf_args, train_dataset=rows,
                         callbacks=[_PoisonWeights(5)]).train()
    for side in ("ours", "hf"):
        assert sorted(os.listdir(tmp_path / side)) == ["checkpoint-8"], side  # the finite ones rotated away
        weights = load_file(str(tmp_path / side / "checkpoint-8" / "model.safetensors"))
        assert all(torch.isnan(t).all() for t in weights.values()), side


def test_the_finite_check_names_the_first_bad_tensor_and_not_a_huge_finite_one():
    model = tiny_gpt2()
    assert first_nonfinite(model) is None
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight[3, 4] = float("inf")
        model.transformer.h[0].attn.c_attn.bias[0] = float("nan")
    assert first_nonfinite(model) == ("transformer.h.0.attn.c_attn.bias", "NaN")
    half = torch.nn.Linear(512, 512).half()
    with torch.no_grad():
        half.weight.fill_(60000.0)  # finite in fp16, its norm overflows fp16 (not the float32 accumulation)
    assert first_nonfinite(half) is None
    huge = torch.nn.Linear(4, 4)
    with torch.no_grad():
        huge.weight.fill_(3e38)  # finite, the float32 norm overflows: confirmed per tensor
    assert first_nonfinite(huge) is None
    with torch.no_grad():
        huge.bias[1] = float("-inf")
    assert first_nonfinite(huge) == ("bias", "inf")
    masked = torch.nn.Linear(2, 2)
    masked.register_buffer("mask", torch.full((2, 2), float("-inf")))  # a mask kept as -inf on purpose: not a weight
    assert first_nonfinite(masked) is None


def test_a_checkpoint_of_ours_with_its_manifest_deleted_is_damaged_not_foreign(two_checkpoints, tmp_path):
    """Issue 29 item 5: `lightning_state.pt`, which only hf_lightning writes, is in the folder but the manifest is
    gone (deleted to hide 4,000 inverted bytes of the weights): `verify` reports FAILED and a resume refuses it,
    naming the previous good checkpoint. (Before: "OK ... no manifest (not written by hf_lightning)" and the resume
    trained on from the altered weights.)"""
    from hf_lightning.checkpoint.find import check_checkpoint

    out = tmp_path / "out"
    shutil.copytree(two_checkpoints, out)
    folder = out / "checkpoint-4"
    assert (folder / "lightning_state.pt").is_file()
    weights = folder / "model.safetensors"
    _invert(weights, weights.stat().st_size // 2, 4000)
    (folder / MANIFEST_NAME).unlink()
    report = _verify(out)
    assert report.returncode == 1, report.stdout
    assert report.stdout.splitlines()[2].startswith(
        f"FAILED  checkpoint-4: {MANIFEST_NAME}: missing, but lightning_state.pt is there, which only hf_lightning "
        "writes")
    with pytest.raises(DamagedCheckpointError, match=r"checkpoint_manifest.json is damaged \(missing.*previous "
                                                     r"complete checkpoint is .*checkpoint-2"):
        check_checkpoint(folder)
