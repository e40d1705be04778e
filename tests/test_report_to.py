"""`report_to`: HF's integration names become Lightning loggers that receive HF's log entries at HF's steps.

W&B runs offline (its run file is read back from disk), MLflow writes to a local file store (its metric files are
read back). `none` on a `transformers.TrainingArguments` writes nothing; `all` is HF's list of installed ones.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
from pathlib import Path

import pytest
import transformers

import hf_lightning
from hf_lightning.args.from_transformers import from_hf_training_arguments
from hf_lightning.args.report_to import resolve_report_to
from hf_lightning.args.to_lightning import lightning_trainer_kwargs
from helpers import classification_dataset, tiny_bert


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


def _train(tmp_path: Path, **kwargs) -> hf_lightning.Trainer:
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, disable_tqdm=True, max_steps=6, logging_steps=2,
        eval_strategy="steps", eval_steps=3, save_strategy="no", per_device_train_batch_size=4, learning_rate=1e-3,
        **kwargs,
    )
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(32),
                                   eval_dataset=classification_dataset(8, seed=1))
    trainer.train()
    return trainer


def _logged(trainer, key: str) -> list[tuple[int, float]]:
    return [(e["step"], e[key]) for e in trainer.state.log_history if key in e]


def _wandb_records(path: str) -> list:
    """The protobuf records of an offline W&B run file (a LevelDB-style log: 7-byte header, 32 KiB blocks, records
    of `crc32, length, type` + payload, types full=1 / first=2 / middle=3 / last=4)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    position, block, records, pending = 7, 32768, [], b""
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if length == 0 and kind == 0:
            position += left
            continue
        payload = data[position + 7:position + 7 + length]
        position += 7 + length
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is in the dev extra")
def test_wandb_offline_run_holds_hfs_entries_at_hfs_steps(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "hfl-test")
    trainer = _train(tmp_path, report_to="wandb", run_name="run-a")
    # The run file is written by W&B's service process. `finish()` returns once that process has handled the run's
    # exit record, but it closes (flushes) the file afterwards, on its own time: read right away, the file often
    # held only its header. `teardown()` shuts the service process down and waits for it to exit, which closes every
    # run file first; the file is then complete and ends with the exit record.
    wandb.finish()
    wandb.teardown()
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    records = _wandb_records(run_file)
    assert records and records[-1].WhichOneof("record_type") == "exit"  # the whole run, not a prefix of it
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "run-a" and run.project == "hfl-test"
    rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
    losses = [(row["trainer/global_step"], row["train/loss"]) for row in rows if "train/loss" in row]
    evals = [(row["trainer/global_step"], row["eval/loss"]) for row in rows if "eval/loss" in row]
    assert [s for s, _ in losses] == [2, 4, 6] and [s for s, _ in evals] == [3, 6]
    assert losses == _logged(trainer, "loss") and evals == _logged(trainer, "eval_loss")  # the same numbers


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is in the dev extra")
def test_mlflow_file_store_holds_hfs_entries_at_hfs_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 wants a database unless told otherwise
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hfl-test")
    trainer = _train(tmp_path, report_to=["mlflow"], run_name="run-b")
    trainer.evaluate()  # into the same MLflow run, at the final step (as HF's one run per Trainer)
    (run_dir,) = [Path(p).parent.parent for p in glob.glob(str(tmp_path / "mlruns" / "*" / "*" / "metrics" / "train"))]
    assert (run_dir / "tags" / "mlflow.runName").read_text() == "run-b"

    def metric(name: str) -> list[tuple[int, float]]:
        rows = [line.split() for line in (run_dir / "metrics" / name).read_text().splitlines()]
        return [(int(step), float(value)) for _, value, step in rows]  # "timestamp value step"

    assert [s for s, _ in metric("train/loss")] == [2, 4, 6] and [s for s, _ in metric("eval/loss")] == [3, 6, 6]
    assert metric("train/loss") == _logged(trainer, "loss")  # the same numbers, at the same steps
    assert metric("eval/loss") == _logged(trainer, "eval_loss")


def test_hf_none_writes_nothing_and_ours_defaults_to_tensorboard(tmp_path):
    for hf_kwargs in ({"report_to": "none"}, {}):  # explicit, and HF's default
        hf = transformers.TrainingArguments(output_dir=str(tmp_path), **hf_kwargs)
        ours = from_hf_training_arguments(hf)
        assert ours.report_to == [] and lightning_trainer_kwargs(ours, None)["logger"] is False
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="tensorboard")
    assert from_hf_training_arguments(hf).report_to == ["tensorboard"]
    assert hf_lightning.TrainingArguments().report_to == ["tensorboard"]  # our documented default
    assert hf_lightning.TrainingArguments(report_to="none").report_to == []
    trainer = hf_lightning.Trainer(model=tiny_bert(), train_dataset=classification_dataset(8), args=(
        transformers.TrainingArguments(output_dir=str(tmp_path / "hf_none"), max_steps=1, save_strategy="no",
                                       use_cpu=True, disable_tqdm=True)))
    trainer.train()
    assert not (tmp_path / "hf_none" / "runs").exists() and not (tmp_path / "hf_none" / "csv").exists()


def test_all_means_hfs_installed_integrations():
    names, problems = resolve_report_to("all")
    assert problems == []
    from transformers.integrations import get_available_reporting_integrations

    assert set(names) == set(get_available_reporting_integrations())  # tensorboard (+ wandb, mlflow in dev)
    assert hf_lightning.TrainingArguments(report_to="all").report_to == names


@pytest.mark.skipif(importlib.util.find_spec("comet_ml") is not None, reason="needs comet_ml absent")
def test_a_missing_package_is_one_error_naming_it():
    with pytest.raises(ValueError, match="`report_to` 'comet_ml' needs the `comet-ml` package: pip install comet-ml"):
        hf_lightning.TrainingArguments(report_to="comet_ml")


@pytest.mark.parametrize("name", ["clearml", "dvclive", "trackio", "neptune", "swanlab"])
def test_integrations_without_a_lightning_logger_are_refused(name):
    with pytest.raises(ValueError) as info:
        hf_lightning.TrainingArguments(report_to=["tensorboard", name])
    message = str(info.value)
    assert f"`report_to` {name!r} is not supported" in message and 'lightning_kwargs["logger"]' in message


def test_tensorboard_logging_dir_from_the_environment(tmp_path, monkeypatch):
    """HF's TensorBoardCallback honours TENSORBOARD_LOGGING_DIR; so do we."""
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    (logger,) = lightning_trainer_kwargs(hf_lightning.TrainingArguments(output_dir=str(tmp_path)), None)["logger"]
    assert os.path.normpath(logger.log_dir) == str(tmp_path / "tb")
