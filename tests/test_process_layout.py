"""The process-layout properties HF scripts call (`process_index`, `should_log`, `main_process_first`...).

Single process: equal to HF's own `TrainingArguments`. Launchers: read from their environment (pure function).
Real 2-process runs: under `torchrun` `main_process_first` is a barrier (rank 1 starts its block only after rank 0
finished its own); with Lightning's own launcher rank 1 is started inside `train()` and runs its block at once.
Ordering is proven by marker files, never by timing.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

import hf_lightning
from hf_lightning.args.process import ProcessLayout, current_layout, layout_from_env
from hf_lightning.args.support import OURS

SCRIPT = Path(__file__).parent / "scripts" / "main_process_first.py"
LAUNCH_ENV = ("TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "SLURM_NTASKS", "SLURM_PROCID",
              "SLURM_LOCALID", "SLURM_JOB_NAME")


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, ProcessLayout(0, 0, 1, "single")),
        ({"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"},
         ProcessLayout(3, 1, 4, "torchrun")),
        ({"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_JOB_NAME": "train"},
         ProcessLayout(5, 1, 8, "slurm")),
        ({"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_JOB_NAME": "bash"},
         ProcessLayout(0, 0, 1, "single")),  # an interactive SLURM shell: Lightning does not use SLURM either
        ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1234"},
         ProcessLayout(1, 1, 2, "lightning")),  # what Lightning's launcher gives the process it starts
        ({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}, ProcessLayout(1, 1, 2, "torchrun")),  # by hand
    ],
)
def test_layout_from_the_launchers_environment(env, expected):
    assert layout_from_env(env) == expected


def test_single_process_answers_are_hfs(no_launcher, tmp_path):
    """Properties and methods a script calls, against HF's own arguments on this (CPU) machine."""
    kwargs = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=2,
                  log_level="info", log_level_replica="error", report_to="none", use_cpu=True)
    hf, ours = transformers.TrainingArguments(**kwargs), hf_lightning.TrainingArguments(**kwargs)
    for name in ("process_index", "local_process_index", "world_size", "should_log", "should_save", "n_gpu",
                 "device", "parallel_mode", "train_batch_size", "eval_batch_size"):
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.get_process_log_level() == hf.get_process_log_level() == logging.INFO
    with ours.main_process_first(desc="work"):  # no other process: runs at once
        pass
    assert ours.parallel_mode.value == "not_parallel"


def test_serialisation_is_hfs(no_launcher, tmp_path):
    kwargs = dict(output_dir=str(tmp_path), report_to="none", learning_rate=3e-4, include_for_metrics=["loss"])
    hf, ours = transformers.TrainingArguments(**kwargs), hf_lightning.TrainingArguments(**kwargs)
    hf_dict, our_dict = hf.to_dict(), ours.to_dict()
    # our own fields (support.OURS: save_async, include_throughput, ...) are serialised beside HF's
    assert set(our_dict) == set(hf_dict) | set(OURS)
    our_dict = {k: v for k, v in our_dict.items() if k not in OURS}
    same = {k for k in hf_dict if hf_dict[k] == our_dict[k]}
    # the rest: our scheduler dict (accelerate's config is held as HF holds it); `debug` is
    # HF's list since `debug="underflow_overflow"` is supported
    assert set(hf_dict) - same == {"lr_scheduler_kwargs"}
    assert {k: v for k, v in json.loads(ours.to_json_string()).items() if k not in OURS} == our_dict
    sanitized = ours.to_sanitized_dict()
    assert set(sanitized) == set(hf.to_sanitized_dict()) | set(OURS)
    assert all(type(v) in (bool, int, float, str) for v in sanitized.values())
    secret = hf_lightning.TrainingArguments.__new__(hf_lightning.TrainingArguments)
    secret.__dict__.update(ours.__dict__, hub_token="hf_secret")  # `hub_token` cannot be set (hub not supported)
    assert "hf_secret" not in str(secret) and "<HUB_TOKEN>" in str(secret)
    assert secret.to_dict()["hub_token"] == "<HUB_TOKEN>"


def test_replica_answers_under_a_launcher(monkeypatch):
    """Rank 1 of 2 (torchrun's environment): HF's rules for logging, saving and the log level."""
    for name, value in {"TORCHELASTIC_RUN_ID": "t", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    args = hf_lightning.TrainingArguments(report_to="none", log_level="info", log_level_replica="error")
    assert (args.process_index, args.local_process_index, args.world_size) == (1, 1, 2)
    assert not args.should_log and not args.should_save
    assert args.get_process_log_level() == logging.ERROR
    assert args.parallel_mode.value == "distributed"
    assert current_layout().source == "torchrun"
    monkeypatch.setenv("LOCAL_RANK", "0")  # rank 1 is the first process of a second node
    assert args.should_log and not args.should_save  # log_on_each_node=True (HF's default)
    assert not hf_lightning.TrainingArguments(report_to="none", log_on_each_node=False).should_log


def _results(out: Path) -> dict[int, dict]:
    return {rank: json.loads((out / f"result-{rank}.json").read_text()) for rank in (0, 1)}


@pytest.mark.distributed
def test_main_process_first_is_a_barrier_under_torchrun(tmp_path):
    """Both ranks start together: rank 1 enters each block only after rank 0 left it; the process group it
    initialised is then the one Lightning's DDP strategy trains with."""
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                    str(SCRIPT), str(tmp_path)], check=True, cwd=tmp_path, capture_output=True, timeout=600)
    results = _results(tmp_path)
    for block in ("local", "global"):
        assert results[1][block]["first_finished_before"], block  # rank 0's block was complete when 1 began
        assert not results[0][block]["other_started_meanwhile"], block  # and rank 1 never overlapped it
    assert results[0]["before"] == {"process_index": 0, "local_process_index": 0, "world_size": 2,
                                    "should_log": True, "should_save": True, "parallel_mode": "distributed"}
    assert results[1]["before"]["process_index"] == 1 and not results[1]["before"]["should_save"]
    assert results[0]["after"] == results[0]["before"] and results[1]["after"] == results[1]["before"]
    assert results[0]["global_step"] == results[1]["global_step"] == 2


@pytest.mark.distributed
def test_main_process_first_with_lightnings_own_launcher(tmp_path):
    """`python script.py` with `devices=2`: rank 0 preprocesses alone (world size 1), Lightning starts rank 1 inside
    `train()`, and rank 1's blocks run at once (no partner to wait for) after rank 0's had finished."""
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, cwd=tmp_path, capture_output=True,
                   timeout=600)
    results = _results(tmp_path)
    assert results[0]["pid"] != results[1]["pid"]
    assert results[0]["before"]["world_size"] == 1 and results[0]["before"]["parallel_mode"] == "not_parallel"
    assert results[0]["after"]["world_size"] == 2 and results[0]["after"]["parallel_mode"] == "distributed"
    assert results[1]["before"] == results[1]["after"] == {
        "process_index": 1, "local_process_index": 1, "world_size": 2, "should_log": False, "should_save": False,
        "parallel_mode": "distributed"}
    for block in ("local", "global"):
        assert results[1][block]["first_finished_before"], block
    assert results[0]["global_step"] == results[1]["global_step"] == 2


def test_a_strategy_needing_another_backend_is_refused():
    """After `main_process_first` initialised a gloo group, a strategy asking for NCCL cannot silently get gloo."""
    import torch.distributed as dist

    from hf_lightning.args import process
    from hf_lightning.args.to_lightning import lightning_trainer_kwargs

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        process._initialised_backend = "gloo"
        from lightning.pytorch.strategies import DDPStrategy

        args = hf_lightning.TrainingArguments(report_to="none")
        with pytest.raises(ValueError, match="'gloo' backend .* wants 'nccl'"):
            lightning_trainer_kwargs(args, {"strategy": DDPStrategy(process_group_backend="nccl")})
        lightning_trainer_kwargs(args, {"strategy": DDPStrategy(process_group_backend="gloo")})  # the same: fine
    finally:
        process._initialised_backend = None
        dist.destroy_process_group()


def test_launcher_processes_join_one_ddp_run_unless_lightning_kwargs_say_otherwise():
    from hf_lightning.args.process import launcher_trainer_kwargs

    torchrun = {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    assert launcher_trainer_kwargs(torchrun, {}) == {"devices": 2, "num_nodes": 2, "strategy": "ddp"}
    assert launcher_trainer_kwargs(torchrun, {"strategy": "fsdp", "devices": 2}) == {"num_nodes": 2}
    slurm = {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_NAME": "train",
             "SLURM_NTASKS_PER_NODE": "2"}
    assert launcher_trainer_kwargs(slurm, {}) == {"devices": 2, "num_nodes": 1, "strategy": "ddp"}
    assert launcher_trainer_kwargs({}, {}) == {}  # one process
    lightning_child = {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}  # started by Lightning's launcher
    assert launcher_trainer_kwargs(lightning_child, {}) == {}
