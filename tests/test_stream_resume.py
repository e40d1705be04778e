"""Streaming resume in O(1): a run over an unsized dataset that can say where it is resumes from the saved position,
bit-identical to the uninterrupted run, without reading the examples trained before the checkpoint.

The datasets count their reads (tests/stream_helpers.py): the resumed run reads at most what the uninterrupted run
read after the checkpoint's position, where skipping by reading (HF's way, kept for datasets without a state) reads
everything from the start again.
"""

from __future__ import annotations

import datetime
import io
import shutil
from pathlib import Path

import datasets
import pytest
import torch
import transformers
from torch.utils.data import DataLoader

import hf_lightning
from hf_lightning.checkpoint.stream_position import read_stream_position, write_stream_position
from hf_lightning.data.stream_loader import stateful_loader
from hf_lightning.data.stream_shuffle import resumable_stream
from hf_lightning.data.stream_state import from_plain, to_plain
from helpers import tiny_gpt2
from stream_helpers import PlainTorchStream, StatefulTorchStream, counted_stream, reads

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
VOLATILE = ("runtime", "per_second", "train_loss", "total_flos")


@pytest.fixture(autouse=True)
def _quiet_datasets():
    datasets.logging.set_verbosity_error()


def _rows(n: int = 200) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"x": list(range(n)), "t": [[i] * 3 for i in range(n)]})


STREAMS = {
    "python rows": lambda: counted_stream(Path("/dev/null"), per_shard=50),
    "arrow": lambda: _rows().to_iterable_dataset(num_shards=4).shuffle(seed=3, buffer_size=16),
    "arrow, mapped, torch format": lambda: _rows().to_iterable_dataset(num_shards=4).shuffle(seed=5, buffer_size=33)
    .map(lambda e: {"x": e["x"] * 2}).with_format("torch"),
}


def _key(batch: dict) -> list:
    column = "x" if "x" in batch else "input_ids"
    return [v.tolist() if hasattr(v, "tolist") else v for v in batch[column]]


def _read(stream, workers: int, epoch: int = 0, stop: int | None = None, position=None, loader=stateful_loader):
    stream.set_epoch(epoch)
    dl = loader(stream, batch_size=4, num_workers=workers)
    if position is not None:
        dl.load_state_dict(position)
    batches = []
    for batch in dl:
        batches.append(_key(batch))
        if stop is not None and len(batches) == stop:
            return batches, dl.state_dict()
    return batches, None


def _through_a_file(position):
    """What a resume gets back: the plain form written with torch.save and loaded with weights_only=True."""
    buffer = io.BytesIO()
    torch.save(to_plain(position), buffer)
    buffer.seek(0)
    return from_plain(torch.load(buffer, weights_only=True))


@pytest.mark.parametrize("name", list(STREAMS))
@pytest.mark.parametrize("workers", [0, 2])
def test_resumable_stream_has_datasets_order_and_resumes_exactly_anywhere(name, workers):
    """Same order as `datasets`' own shuffle buffer (epochs 0 and 1), and a resume from any position (through a file)
    continues exactly, with the buffer's rows that `datasets` would lose."""
    for epoch in (0, 1):
        reference, _ = _read(STREAMS[name](), workers, epoch, loader=DataLoader)
        assert _read(resumable_stream(STREAMS[name]()), workers, epoch)[0] == reference
        for stop in (1, 6, len(reference) // 2, len(reference) - 1):
            first, position = _read(resumable_stream(STREAMS[name]()), workers, epoch, stop=stop)
            rest, _ = _read(resumable_stream(STREAMS[name]()), workers, epoch, position=_through_a_file(position))
            assert first + rest == reference, (epoch, stop)


def test_datasets_alone_loses_the_buffer_on_resume():
    """Why the buffer is ours: `datasets`' own state of a shuffled stream resumes with other rows."""
    reference, _ = _read(STREAMS["python rows"](), 0, loader=DataLoader)
    stream = STREAMS["python rows"]()
    first, position = _read(stream, 0, stop=6)
    rest, _ = _read(STREAMS["python rows"](), 0, position=position)
    assert first + rest != reference


def test_the_callers_dataset_is_not_changed():
    """`datasets.IterableDataset.load_state_dict` sticks to the object: ours loads into a copy only."""
    original = STREAMS["arrow"]()
    before, _ = _read(original, 0, loader=DataLoader)
    _, position = _read(resumable_stream(original), 0, stop=5)
    copy = resumable_stream(original)
    _read(copy, 0, position=position)
    copy.set_epoch(3)
    assert original.epoch == 0
    assert _read(original, 0, loader=DataLoader)[0] == before


def test_stream_position_file_applies_only_to_its_point(tmp_path):
    write_stream_position(tmp_path, {"a": [1, b"x"]}, epoch=1, windows_done=4, world_size=2, rank=1)
    assert (tmp_path / "stream_position_1.pt").is_file()
    assert read_stream_position(tmp_path, 1, 4, world_size=2, rank=1) == {"a": [1, b"x"]}
    assert read_stream_position(tmp_path, 1, 5, world_size=2, rank=1) is None  # another point
    assert read_stream_position(tmp_path, 1, 4, world_size=2, rank=0) is None  # no file for rank 0
    torch.save({"format": 1, "epoch": 1, "windows_done": 4, "world_size": 2, "position": datetime.date(2020, 1, 1)},
               tmp_path / "stream_position_0.pt")
    with pytest.raises(ValueError, match="stream_position_0.pt.*weights_only"):
        read_stream_position(tmp_path, 1, 4, world_size=2, rank=0)


# ----- whole runs -----
def _args(out: Path, **overrides) -> hf_lightning.TrainingArguments:
    settings = dict(
        output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=12,
        learning_rate=1e-2, logging_steps=1, save_steps=1, seed=7, report_to="none", disable_tqdm=True,
    )
    settings.update(overrides)
    return hf_lightning.TrainingArguments(**settings)


def _model(seed: int):
    gpt2 = tiny_gpt2(dropout=0.1, seed=seed)
    gpt2.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    return gpt2


def _train(out: Path, dataset, resume: str | None = None, model_seed: int = 0, **overrides) -> hf_lightning.Trainer:
    trainer = hf_lightning.Trainer(model=_model(model_seed), args=_args(out, **overrides),
                                   train_dataset=dataset, lightning_kwargs=dict(LIGHTNING_KWARGS))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _after(trainer, step: int) -> list[dict]:
    return [{k: v for k, v in e.items() if not any(word in k for word in VOLATILE)}
            for e in trainer.state.log_history if e["step"] > step and "train_runtime" not in e]


def _same_weights(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_datasets_stream_resumes_exactly_without_rereading(tmp_path, one_thread, workers):
    """A shuffled `datasets` stream (buffer 8), GA=2, resumed at update 8 of 12: same losses, learning rates, grad
    norms and final weights as the uninterrupted run, and the resumed run reads at most what the uninterrupted one
    read after the checkpoint (skipping by reading would read all 32 trained rows again)."""
    full_log, resumed_log = tmp_path / "full.log", tmp_path / "resumed.log"
    full = _train(tmp_path / "full", counted_stream(full_log), dataloader_num_workers=workers)
    checkpoint = tmp_path / "full" / "checkpoint-8"
    assert (checkpoint / "stream_position.pt").is_file()
    resumed = _train(tmp_path / "resumed", counted_stream(resumed_log), resume=str(checkpoint), model_seed=9,
                     dataloader_num_workers=workers)
    assert _after(resumed, 8) == _after(full, 8)
    assert _same_weights(tmp_path / "full" / "checkpoint-12", tmp_path / "resumed" / "checkpoint-12")
    trained_rows = 8 * 2 * 2
    assert reads(resumed_log) <= reads(full_log) - trained_rows


def test_a_stateful_torch_stream_resumes_from_its_state(tmp_path, one_thread):
    full_log, resumed_log = tmp_path / "full.log", tmp_path / "resumed.log"
    full = _train(tmp_path / "full", StatefulTorchStream(full_log))
    resumed = _train(tmp_path / "resumed", StatefulTorchStream(resumed_log),
                     resume=str(tmp_path / "full" / "checkpoint-5"), model_seed=9)
    assert _after(resumed, 5) == _after(full, 5)
    assert reads(resumed_log) <= reads(full_log) - 5 * 2 * 2


def test_a_stream_without_state_is_skipped_by_reading_as_hf(tmp_path, one_thread):
    """No `state_dict`: no position file, and the resumed run reads the trained rows again (and drops them)."""
    full_log, resumed_log = tmp_path / "full.log", tmp_path / "resumed.log"
    full = _train(tmp_path / "full", PlainTorchStream(full_log))
    assert not (tmp_path / "full" / "checkpoint-5" / "stream_position.pt").exists()
    resumed = _train(tmp_path / "resumed", PlainTorchStream(resumed_log),
                     resume=str(tmp_path / "full" / "checkpoint-5"), model_seed=9)
    assert _after(resumed, 5) == _after(full, 5)
    assert reads(resumed_log) >= reads(full_log)


def test_hf_resumes_our_streaming_checkpoint_and_ignore_data_skip_replays_the_pass_as_hf(tmp_path, one_thread):
    """`transformers.Trainer` resumes from our checkpoint of a shuffled stream (skipping by reading: it ignores
    `stream_position.pt`) and continues with our resumed run's losses. With `ignore_data_skip=True` both trainers
    restart the pass from its first batch (our saved position is not used) and again agree."""
    _train(tmp_path / "full", counted_stream(tmp_path / "full.log"), save_steps=6)
    checkpoint = str(tmp_path / "full" / "checkpoint-6")
    for skip in (False, True):
        ours = _train(tmp_path / f"ours{skip}", counted_stream(tmp_path / f"ours{skip}.log"), resume=checkpoint,
                      model_seed=9, save_strategy="no", ignore_data_skip=skip)
        hf_args = transformers.TrainingArguments(
            output_dir=str(tmp_path / f"hf{skip}"), per_device_train_batch_size=2, gradient_accumulation_steps=2,
            max_steps=12, learning_rate=1e-2, logging_steps=1, save_strategy="no", seed=7, report_to="none",
            disable_tqdm=True, use_cpu=True, ignore_data_skip=skip)
        hf = transformers.Trainer(model=_model(9), args=hf_args,
                                  train_dataset=counted_stream(tmp_path / f"hf{skip}.log"))
        hf.train(resume_from_checkpoint=checkpoint)
        ours_losses = [e["loss"] for e in ours.state.log_history if "loss" in e]
        hf_losses = [e["loss"] for e in hf.state.log_history if "loss" in e]
        assert ours_losses == pytest.approx(hf_losses, rel=1e-5), skip
    shutil.rmtree(tmp_path / "full")


def test_ignore_data_skip_at_epoch_0_of_a_map_style_dataset_replays_like_hf(tmp_path, one_thread):
    """The same RNG order for a sized dataset: resumed in epoch 0 with `ignore_data_skip`, HF loads the RNG states and
    then makes the loader iterator (a seed draw); Lightning made epoch 0's iterator before, so it is made again."""
    from helpers import lm_dataset

    _train(tmp_path / "full", lm_dataset(n=60), save_steps=6)
    checkpoint = str(tmp_path / "full" / "checkpoint-6")
    ours = _train(tmp_path / "ours", lm_dataset(n=60), resume=checkpoint, model_seed=9, save_strategy="no",
                  ignore_data_skip=True)
    hf_args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=2, gradient_accumulation_steps=2,
        max_steps=12, learning_rate=1e-2, logging_steps=1, save_strategy="no", seed=7, report_to="none",
        disable_tqdm=True, use_cpu=True, ignore_data_skip=True)
    hf = transformers.Trainer(model=_model(9), args=hf_args, train_dataset=lm_dataset(n=60))
    hf.train(resume_from_checkpoint=checkpoint)
    assert [e["loss"] for e in ours.state.log_history if "loss" in e] == pytest.approx(
        [e["loss"] for e in hf.state.log_history if "loss" in e], rel=1e-5)
