"""Resuming at the edges, against the real `transformers.Trainer` resumed from the same folder (the oracle).

- At or past the end of the run (a finished run resumed with `resume_from_checkpoint=True`, a shorter
  `num_train_epochs`, `max_steps` reached): nothing is trained, `trainer.state` is the checkpoint's, the best model
  is loaded, `on_train_end` runs and `train()` returns HF's metrics; one line says there was nothing to train.
- With another epoch geometry: a checkpoint that records its sample position continues the epoch's order there
  (every row once per epoch; tests/test_resume_elastic.py across processes); one written before hf_lightning
  recorded it (or with another dataset length) follows HF's rule (`global_step // updates_per_epoch` epochs done),
  with HF's losses, epochs and steps, and a warning naming each change and the rows skipped or repeated.
"""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file
from transformers import TrainerCallback

import hf_lightning
from helpers import classification_dataset, lm_dataset, tiny_bert, tiny_gpt2

LIGHTNING = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
SPEED = ("train_runtime", "train_samples_per_second", "train_steps_per_second")


class EventRecorder(TrainerCallback):
    """Records the names of the HF events it receives."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattribute__(self, name: str):
        if name.startswith("on_"):
            events = object.__getattribute__(self, "events")
            return lambda *args, **kwargs: events.append(name)
        return object.__getattribute__(self, name)


# ----- at or past the end -----
END_ARGS = dict(per_device_train_batch_size=8, num_train_epochs=2, save_strategy="epoch", eval_strategy="epoch",
                logging_steps=1, load_best_model_at_end=True, report_to="none", disable_tqdm=True, seed=3)


def _ours_cls(output_dir, callbacks=(), seed=0, **overrides):
    args = hf_lightning.TrainingArguments(output_dir=str(output_dir), **{**END_ARGS, **overrides})
    return hf_lightning.Trainer(model=tiny_bert(seed=seed), args=args, train_dataset=classification_dataset(48),
                                eval_dataset=classification_dataset(16, seed=1), callbacks=list(callbacks),
                                lightning_kwargs=LIGHTNING)


def _hf_cls(output_dir, callbacks=(), seed=0, **overrides):
    args = transformers.TrainingArguments(output_dir=str(output_dir), use_cpu=True, **{**END_ARGS, **overrides})
    return transformers.Trainer(model=tiny_bert(seed=seed), args=args, train_dataset=classification_dataset(48),
                                eval_dataset=classification_dataset(16, seed=1), callbacks=list(callbacks))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """Our finished run: 2 epochs of 6 updates, a checkpoint per epoch, the best one loaded at the end."""
    root = tmp_path_factory.mktemp("finished")
    trainer = _ours_cls(root / "run")
    trainer.train()
    return root / "run", trainer


@pytest.mark.parametrize("overrides", [{}, {"num_train_epochs": 1}], ids=["same-run-again", "fewer-epochs"])
def test_resume_at_the_end_keeps_the_checkpoint_state_like_hf(finished_run, tmp_path, overrides, caplog,
                                                                one_thread):
    source, finished = finished_run
    folders = {}
    for name in ("ours", "hf"):
        folders[name] = tmp_path / name
        shutil.copytree(source, folders[name])
    ours_events, hf_events = EventRecorder(), EventRecorder()
    ours = _ours_cls(folders["ours"], [ours_events], seed=9, **overrides)
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        ours_out = ours.train(resume_from_checkpoint=True)
    hf = _hf_cls(folders["hf"], [hf_events], seed=9, **overrides)
    hf_out = hf.train(resume_from_checkpoint=True)

    # nothing trained: the checkpoint's step, epoch, history and best metric, then one summary entry
    assert ours_out.global_step == hf_out.global_step == 12
    assert ours.state.epoch == hf.state.epoch == 2.0
    assert ours.state.best_metric == hf.state.best_metric == finished.state.best_metric
    assert ours.state.best_model_checkpoint.endswith(hf.state.best_model_checkpoint.rpartition("/")[2])
    history = [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
               for e in ours.state.log_history]
    assert history[:-1] == [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
                            for e in finished.state.log_history[:-1]]
    assert list(ours.state.log_history[-1]) == list(hf.state.log_history[-1])
    assert ours.state.log_history[-1]["train_loss"] == hf.state.log_history[-1]["train_loss"] == 0.0
    # HF's TrainOutput: same keys (HF's PrinterCallback pops total_flos from it with disable_tqdm), same values
    assert ours_out.training_loss == hf_out.training_loss == 0.0
    assert set(ours_out.metrics) - {"total_flos"} == set(hf_out.metrics)
    for key in set(hf_out.metrics) - set(SPEED):
        assert ours_out.metrics[key] == hf_out.metrics[key], key
    assert ours_events.events == hf_events.events == ["on_init_end", "on_train_begin", "on_log", "on_train_end"]
    # the best model is loaded (the seed-9 initial weights are gone), as HF does
    best = load_file(f"{ours.state.best_model_checkpoint}/model.safetensors")
    for name, tensor in ours.model.state_dict().items():
        if name in best:
            assert torch.equal(tensor, best[name]), name
    lines = [r.getMessage() for r in caplog.records if "nothing left to train" in r.getMessage()]
    assert len(lines) == 1 and "checkpoint-12" in lines[0] and "\n" not in lines[0]


def test_resume_at_max_steps_trains_nothing_where_hf_trains_one_step_too_many(tmp_path, one_thread):
    """HF resumed at `max_steps` inside an epoch skips the trained batches, then trains one more update before it
    checks `max_steps` (global_step ends at max_steps + 1). Ours stops where the run ended (README "Differences")."""
    def ours(output_dir, seed):
        return _ours_cls(output_dir, seed=seed, max_steps=4, save_strategy="steps", save_steps=2,
                         eval_strategy="steps", eval_steps=2)

    ours(tmp_path / "run", 0).train()
    shutil.copytree(tmp_path / "run", tmp_path / "hf")
    resumed = ours(tmp_path / "run", 9)
    output = resumed.train(resume_from_checkpoint=True)
    assert output.global_step == resumed.state.global_step == 4 and output.training_loss == 0.0
    assert resumed.state.log_history[-1]["step"] == 4 and "train_runtime" in resumed.state.log_history[-1]
    hf = _hf_cls(tmp_path / "hf", seed=9, max_steps=4, save_strategy="steps", save_steps=2, eval_strategy="steps",
                 eval_steps=2)
    assert hf.train(resume_from_checkpoint=True).global_step == 5  # HF's extra update past max_steps


# ----- another epoch geometry -----
GEOMETRY_ARGS = dict(per_device_train_batch_size=2, num_train_epochs=2, learning_rate=1e-2, warmup_steps=2,
                     logging_steps=1, save_strategy="steps", save_steps=1, seed=7, report_to="none",
                     disable_tqdm=True, optim="adamw_torch")


def _lm_model(seed: int):
    gpt2 = tiny_gpt2(dropout=0.1, seed=seed)
    gpt2.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    return gpt2


@pytest.fixture(scope="module")
def geometry_checkpoint(tmp_path_factory):
    """Our checkpoint after 9 updates of batch 2 over 24 samples (12 updates per epoch): inside epoch 0."""
    root = tmp_path_factory.mktemp("geometry")
    args = hf_lightning.TrainingArguments(output_dir=str(root / "run"), max_steps=9, **{
        k: v for k, v in GEOMETRY_ARGS.items() if k != "num_train_epochs"})
    hf_lightning.Trainer(model=_lm_model(0), args=args, train_dataset=lm_dataset(n=24),
                         lightning_kwargs=LIGHTNING).train()
    return root / "run" / "checkpoint-9"


@pytest.mark.parametrize(("change", "named", "rows"), [
    ({"per_device_train_batch_size": 4}, "per_device_train_batch_size: 2 in the checkpoint -> 4 now",
     "18 row(s) of the order (samples 18..35, counted over epochs) are never trained"),
    ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps: 1 in the checkpoint -> 2 now",
     "18 row(s) of the order (samples 18..35, counted over epochs) are never trained"),
    ({"samples": 16}, "training samples (len(train_dataset)): 24 in the checkpoint -> 16 now",
     "the dataset's length changed (24 -> 16 rows)"),
], ids=["batch-size", "accumulation", "dataset-length"])
def test_resume_with_another_epoch_geometry_follows_hf(geometry_checkpoint, tmp_path, change, named, rows, caplog,
                                                       one_thread):
    change = dict(change)
    samples = change.pop("samples", 24)
    runs = {}
    for name in ("ours", "hf"):
        source = tmp_path / name / "checkpoint-9"
        shutil.copytree(geometry_checkpoint, source)
        as_written_before_sample_positions(source)
        settings = {**GEOMETRY_ARGS, **change}
        if name == "ours":
            trainer = hf_lightning.Trainer(
                model=_lm_model(99), args=hf_lightning.TrainingArguments(output_dir=str(tmp_path / name), **settings),
                train_dataset=lm_dataset(n=samples), lightning_kwargs=LIGHTNING)
            with caplog.at_level(logging.WARNING, logger="hf_lightning"):
                trainer.train(resume_from_checkpoint=str(source))
        else:
            trainer = transformers.Trainer(
                model=_lm_model(99), args=transformers.TrainingArguments(output_dir=str(tmp_path / name),
                                                                         use_cpu=True, **settings),
                train_dataset=lm_dataset(n=samples))
            trainer.train(resume_from_checkpoint=str(source))
        runs[name] = trainer
    ours, hf = runs["ours"], runs["hf"]
    got = [(e["step"], e["epoch"], e["loss"], e["learning_rate"]) for e in ours.state.log_history if "loss" in e]
    want = [(e["step"], e["epoch"], e["loss"], e["learning_rate"]) for e in hf.state.log_history if "loss" in e]
    assert [g[:2] for g in got] == [w[:2] for w in want] and got[-1][1] == 2.0  # the run ends at epoch 2, as HF
    assert [x for g in got for x in g[2:]] == pytest.approx([x for w in want for x in w[2:]], rel=1e-5)
    assert ours.state.global_step == hf.state.global_step
    warnings = [r.getMessage() for r in caplog.records if "the epoch is not the checkpoint's" in r.getMessage()]
    assert len(warnings) == 1 and named in warnings[0] and rows in warnings[0]


def as_written_before_sample_positions(folder):
    """`folder`'s `lightning_state.pt` as hf_lightning wrote it before it recorded the sample position (format 2),
    with its manifest recorded again for the edited file, as that version wrote one (a folder of ours without its
    manifest is refused as damaged)."""
    from hf_lightning.checkpoint.manifest import write_manifest

    state = torch.load(folder / "lightning_state.pt", weights_only=False)
    state.pop("sample_position")
    state["format"] = 2
    torch.save(state, folder / "lightning_state.pt")
    write_manifest(folder, int(state["global_step"]))


def test_resume_with_another_batch_size_continues_at_the_sample_position(geometry_checkpoint, tmp_path, caplog,
                                                                       one_thread):
    """Batch 2 -> 4 after 9 updates (18 of 24 rows of epoch 0): the last 6 rows of epoch 0 in 2 updates (4 + 2),
    then epoch 1 in 6: every row once per epoch. transformers.Trainer counts 9 updates as 1 epoch of 6 plus 3
    batches of 4 to skip: the 6 rows of epoch 0 and 12 of epoch 1 are never trained (transformers#40245)."""
    seen: list[int] = []

    class Rows(hf_lightning.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            seen.extend(int(i) for i in inputs["input_ids"][:, 0])
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    trainer = Rows(model=_lm_model(99), args=hf_lightning.TrainingArguments(
        output_dir=str(tmp_path / "ours"), **{**GEOMETRY_ARGS, "per_device_train_batch_size": 4}),
        train_dataset=lm_dataset(n=24), lightning_kwargs=LIGHTNING)
    with caplog.at_level(logging.WARNING, logger="hf_lightning"):
        trainer.train(resume_from_checkpoint=str(geometry_checkpoint))
    first_tokens = [row[0] for row in lm_dataset(n=24)["input_ids"]]
    trained_before = [first_tokens[i] for i in _order_of_epoch_0()[:18]]
    assert sorted(trained_before + seen[:6]) == sorted(first_tokens)  # epoch 0: every row once
    assert sorted(seen[6:]) == sorted(first_tokens)  # epoch 1: every row once
    assert trainer.state.global_step == 17 and trainer.state.epoch == 2.0
    line = [r.getMessage() for r in caplog.records if "another geometry" in r.getMessage()]
    assert len(line) == 1 and ("world size 1 -> 1, per-device batch 2 -> 4, accumulation 1 -> 1, global batch 2 -> 4"
                               ". By its sample position epoch 0 continues its order after sample 18 of 24 (the 6 "
                               "rows left, in 2 update(s))") in line[0]


def _order_of_epoch_0() -> list[int]:
    from hf_lightning.data.sampling import epoch_order

    return epoch_order(24, GEOMETRY_ARGS["seed"], 0, True)


# ----- the CSV log of a resumed run -----
def _csv_run(output_dir, run_name=None):
    args = hf_lightning.TrainingArguments(output_dir=str(output_dir), per_device_train_batch_size=8, max_steps=6,
                                          save_steps=3, logging_steps=1, report_to="csv", disable_tqdm=True,
                                          run_name=run_name, save_total_limit=None)
    return hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(48),
                                lightning_kwargs={"accelerator": "cpu", "enable_progress_bar": False})


@pytest.mark.parametrize("run_name", [None, "named"])
def test_a_resumed_run_continues_its_csv_log_without_repeating_steps(tmp_path, run_name):
    """Lightning started `csv/version_1` (or, with a `run_name` folder, deleted its `metrics.csv`), so the steps after
    the checkpoint were logged twice across two folders (or the history was lost). Now the resumed run keeps the
    rows up to its checkpoint and logs the rest once, in the same folder."""
    import csv

    _csv_run(tmp_path, run_name).train()
    folder = tmp_path / "csv" / (run_name or "version_0")
    assert [r["step"] for r in csv.DictReader(open(folder / "metrics.csv")) if r.get("train/loss")] == list("123456")
    shutil.rmtree(tmp_path / "checkpoint-6")  # the run was stopped after step 6 was logged, before its save
    _csv_run(tmp_path, run_name).train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert sorted(p.name for p in (tmp_path / "csv").iterdir()) == [run_name or "version_0"]
    rows = list(csv.DictReader(open(folder / "metrics.csv")))
    assert [r["step"] for r in rows if r.get("train/loss")] == list("123456")
    assert [r["step"] for r in rows if r.get("train/train_loss")] == ["6"]  # the resumed run's summary, once


def test_kept_rows_and_the_summary_of_a_resumed_fit():
    from hf_lightning.checkpoint.csv_logs import kept_rows
    from hf_lightning.cli.summary import fit_summary

    rows = [{"step": "2", "loss": "0.5", "eval/loss": ""}, {"step": "4", "loss": "0.25"}, {"step": "", "x": "1"}]
    assert kept_rows(rows, 3) == [{"step": 2, "loss": 0.5}]
    state = transformers.TrainerState(global_step=8, epoch=2.0)
    text = fit_summary(state, hf_lightning.TrainingArguments(output_dir="o"), resumed_from=("o/checkpoint-6", 6))
    assert "Resumed from " in text and "checkpoint-6 (step 6): updates from step 7 trained now" in text
    assert "Resumed" not in fit_summary(state, hf_lightning.TrainingArguments(output_dir="o"))


def test_a_deepspeed_checkpoint_under_another_strategy_is_refused_before_loading(geometry_checkpoint, tmp_path,
                                                                                  one_thread):
    """A checkpoint whose optimizer state is only DeepSpeed's engine checkpoint (`global_step<N>/`, `latest`),
    resumed without DeepSpeed: one error before anything is loaded, naming DeepSpeed's universal-checkpoint
    conversion (before: the run trained on with a fresh optimizer, silently)."""
    from hf_lightning.checkpoint.manifest import write_manifest

    source = tmp_path / "checkpoint-9"
    shutil.copytree(geometry_checkpoint, source)
    (source / "optimizer.pt").unlink()
    (source / "global_step9").mkdir()
    (source / "global_step9" / "mp_rank_00_model_states.pt").write_bytes(b"engine state")
    (source / "latest").write_text("global_step9")
    write_manifest(source, 9)  # as a DeepSpeed run of ours records it
    trainer = hf_lightning.Trainer(
        model=_lm_model(99), args=hf_lightning.TrainingArguments(output_dir=str(tmp_path / "out"), **GEOMETRY_ARGS),
        train_dataset=lm_dataset(n=24), lightning_kwargs=LIGHTNING)
    with pytest.raises(ValueError, match=r"its optimizer state is DeepSpeed's partitioned engine checkpoint .*"
                                         r"python -m deepspeed\.checkpoint\.ds_to_universal --input_folder "
                                         r".*checkpoint-9/global_step9 "):
        trainer.train(resume_from_checkpoint=str(source))
    assert trainer.state.global_step == 0
    assert not [p for p in (tmp_path / "out").glob("checkpoint-*")]
