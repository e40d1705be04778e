"""`auto_micro_batch`: an update that runs out of memory is retried with micro-batches half as large and twice as
many, so the run is the one started at the smaller micro-batch with the same global batch.

A real tiny GPT-2 with dropout (tests/scripts/auto_micro_batch.py `OutOfMemoryModel`) raises `torch.OutOfMemoryError`
for more than 2 rows, in its forward or in its backward (after the last block's gradients are accumulated): a run at
8 x 1 ends at 2 x 4, with the losses, gradient norms, evaluation losses and weights of a run started at 2 x 4 (the
same samples, the same token-normalised loss, the dropout drawn from the same RNG state, no optimizer step in
between). A resumed run starts at the size found; the arguments that cannot work with it are refused at
construction. The 2-process version is tests/test_auto_micro_batch_ddp.py; HF's `auto_find_batch_size` keeps its
own tests (tests/test_run_options.py).
"""

from __future__ import annotations

import pytest
import torch
from helpers import load_script

import hf_lightning
from hf_lightning.run_options.micro_batch import split_for_size, split_micro_batch

script = load_script("auto_micro_batch")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    trainer, model = script.train(str(tmp_path_factory.mktemp("ref")), per_device=2, accumulation=4, auto=False)
    return script.log_of(trainer), script.weights_of(trainer)


def _assert_same_run(trainer, reference) -> None:
    log, weights = reference
    got = script.log_of(trainer)
    assert [e["step"] for e in got] == [e["step"] for e in log] and len(log) == 6  # 4 updates, 2 evaluations
    for a, b in zip(got, log):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (b["step"], key)
    mine = script.weights_of(trainer)
    for name in weights:
        torch.testing.assert_close(mine[name], weights[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_out_of_memory_ends_at_two_by_four_as_a_run_started_there(tmp_path, reference, where, caplog):
    with caplog.at_level("WARNING", logger="hf_lightning.module.micro_batching"):
        trainer, model = script.train(str(tmp_path), per_device=8, accumulation=1, limit=2, where=where)
    _assert_same_run(trainer, reference)
    # training in pieces of 2; evaluation too when its forward fails (it has no backward)
    evaluation = 4 if where == "forward" else 1
    assert script.split_of(trainer) == (4, evaluation)
    # 8 and 4 rows failed once each in training (and in the first evaluation); never again
    assert model.raised == (4 if where == "forward" else 2)
    lines = [r.getMessage() for r in caplog.records if "auto_micro_batch" in r.getMessage()]
    assert len(lines) == (2 if where == "forward" else 1), lines  # the size found, logged once (per kind of step)
    assert "micro-batches of 2 and 4 per update" in lines[0] and "global batch" in lines[0]
    assert trainer.args.per_device_train_batch_size == 8 and trainer.args.gradient_accumulation_steps == 1


def test_a_resume_starts_at_the_size_found(tmp_path, reference):
    first, _ = script.train(str(tmp_path), per_device=8, accumulation=1, limit=2, save_strategy="steps",
                            save_steps=2, max_steps=4)
    state = torch.load(tmp_path / "checkpoint-2" / "lightning_state.pt", weights_only=False)
    assert state["callbacks"]["MicroBatchRecord"] == {
        "train_micro_batch_size": 2, "per_device_train_batch_size": 8, "eval_micro_batch_size": 2,
        "per_device_eval_batch_size": 8}
    resumed, model = script.train(str(tmp_path), per_device=8, accumulation=1, limit=2,
                                  resume=str(tmp_path / "checkpoint-2"), save_strategy="steps", save_steps=2)
    assert model.raised == 0  # no try at 8 or 4 rows: pieces of 2 from the first update
    assert script.split_of(resumed) == (4, 4)
    _assert_same_run(resumed, reference)


def test_without_the_argument_the_error_stops_training(tmp_path):
    with pytest.raises(torch.OutOfMemoryError):
        script.train(str(tmp_path), per_device=8, accumulation=1, limit=2, auto=False)


def test_out_of_memory_at_one_row_stops_with_the_sizes_named(tmp_path):
    with pytest.raises(torch.OutOfMemoryError, match="auto_micro_batch: out of memory at update 1 with micro-batches "
                                                     "of one row"):
        script.train(str(tmp_path), per_device=2, accumulation=1, limit=0, eval_strategy="no")


@pytest.mark.parametrize("other", [dict(auto_find_batch_size=True),
                                   dict(fsdp="full_shard", fsdp_config={"version": 1}),
                                   dict(deepspeed={"train_micro_batch_size_per_gpu": 2}),
                                   dict(ddp_static_graph=True)])
def test_what_cannot_work_with_it_is_refused_at_construction(tmp_path, other):
    name = next(iter(other))
    with pytest.raises(ValueError, match=f"`auto_micro_batch`=True (with|and) `{name}`"):
        hf_lightning.TrainingArguments(output_dir=str(tmp_path), auto_micro_batch=True, **other)


def test_syncing_every_micro_batch_is_refused_with_it(tmp_path):
    # accelerate's sync_each_batch all-reduces inside each backward, before any agreement could be reached
    with pytest.raises(ValueError, match=r"`auto_micro_batch`=True with .*'sync_each_batch'\]=True: not supported"):
        hf_lightning.TrainingArguments(output_dir=str(tmp_path), auto_micro_batch=True, accelerator_config={
            "gradient_accumulation_kwargs": {"sync_each_batch": True}})


def test_fsdp2_is_accepted_and_fsdp1_named_with_its_version(tmp_path):
    # FSDP2 (HF 5's default version) agrees before each of its collectives (parallel/oom_agreement.py)
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), auto_micro_batch=True, fsdp="full_shard auto_wrap")
    assert args.auto_micro_batch
    with pytest.raises(ValueError, match=r"fsdp_config\['version'\]=1: not supported"):
        hf_lightning.TrainingArguments(output_dir=str(tmp_path), auto_micro_batch=True, fsdp="full_shard",
                                       fsdp_config={"version": 1})


def test_pieces_and_resume_sizes():
    batch = {"input_ids": torch.arange(10).reshape(5, 2), "labels": torch.ones(5, 2), "ids": list("abcde"),
             "scale": torch.tensor(2.0)}
    pieces = split_micro_batch(batch, 2)
    assert [p["input_ids"].shape[0] for p in pieces] == [3, 2] and pieces[1]["ids"] == ["d", "e"]
    assert all(p["scale"] is batch["scale"] for p in pieces)  # not a per-row value: shared
    assert len(split_micro_batch(batch, 8)) == 5  # never an empty piece
    assert [split_for_size(8, s) for s in (8, 5, 4, 2, 1)] == [1, 2, 2, 4, 8]
    assert split_for_size(16, 2) == 8  # a resume with a larger per-device batch keeps pieces of 2 rows
