"""The default logger: TensorBoard event files under `<output_dir>/runs` with HF's tags at HF's global steps.

HF's `TensorBoardCallback` writes every numeric value of a log entry as `train/<key>`, `eval/<key>` (for `eval_*`)
or `test/<key>`, at `state.global_step`. Lightning's own `self.log` would write at `global_step - 1`; we write through
`logger.log_metrics(..., step=global_step)`, so the steps here are exactly the HF ones.
"""

from __future__ import annotations

import glob
import os

import pytest
import torch

import hf_lightning
from helpers import classification_dataset, tiny_bert


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


def _scalars(output_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = glob.glob(os.path.join(output_dir, "runs", "*"))
    assert len(runs) == 1, runs
    accumulator = EventAccumulator(runs[0])
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def test_tensorboard_tags_at_hf_steps(tmp_path):
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, disable_tqdm=True, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, max_steps=7, logging_steps=2, eval_strategy="steps", eval_steps=3,
        save_strategy="no", learning_rate=1e-3,
    )
    assert args.report_to == ["tensorboard"]  # our default (HF 5 defaults to "none")
    trainer = hf_lightning.Trainer(
        model=tiny_bert(), args=args, train_dataset=classification_dataset(36),
        eval_dataset=classification_dataset(16, seed=1),
    )
    trainer.train()
    trainer.evaluate()  # HF's TensorBoardCallback writes this one too, at the final step
    scalars = _scalars(str(tmp_path))

    def steps(tag: str) -> list[int]:
        return [step for step, _ in scalars[tag]]

    assert steps("train/loss") == [2, 4, 6]
    assert steps("train/learning_rate") == [2, 4, 6]
    assert steps("train/grad_norm") == [2, 4, 6]
    assert steps("eval/loss") == [3, 6, 7, 7]  # the forced final evaluation at max_steps, then `evaluate()`
    assert sorted(steps("train/epoch")) == [2, 3, 4, 6, 6, 7, 7, 7]  # every entry carries `epoch`
    assert steps("train/train_loss") == [7]
    history = trainer.state.log_history
    logged = [(e["step"], e["loss"]) for e in history if "loss" in e]
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in scalars["train/loss"]] == logged
    evals = [(e["step"], e["eval_loss"]) for e in history if "eval_loss" in e]
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in scalars["eval/loss"]] == evals
    # nothing is written at Lightning's off-by-one steps
    assert not [tag for tag in scalars if not tag.startswith(("train/", "eval/"))]


def test_other_lightning_loggers_plug_in_through_logger(tmp_path):
    """A user's `logger=` (here CSV next to TensorBoard) replaces the default and gets the same entries and steps."""
    import csv

    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, disable_tqdm=True, per_device_train_batch_size=4, max_steps=6,
        logging_steps=2, save_strategy="no", learning_rate=1e-3,
    )
    loggers = [CSVLogger(str(tmp_path), name="csv", version=0),
               TensorBoardLogger(str(tmp_path), name="runs", version="mine", default_hp_metric=False)]
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(24),
                                   lightning_kwargs={"logger": loggers})
    trainer.train()
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("train/loss")]
    logged = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
    assert [(int(r["step"]), pytest.approx(float(r["train/loss"]), rel=1e-6)) for r in rows] == logged
    assert [s for s, _ in _scalars(str(tmp_path))["train/loss"]] == [2, 4, 6]
