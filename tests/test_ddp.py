"""2-process DDP on CPU (gloo) gives the single-process results: same updates, exact evaluation and prediction.

Sharding follows accelerate (rank r takes batches r, r+2, ...), so 2 x batch 4 sees the samples of 1 x batch 8 in
every update; the loss is normalised by the label count of both processes. Evaluation shards are contiguous and
unpadded, so 21 eval samples are counted once each.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"


def _run(tmp_path: Path, devices: int, batch: int, mode: str = "ddp") -> dict:
    out = tmp_path / f"out{devices}-{mode}.json"
    subprocess.run([sys.executable, str(SCRIPT), str(out), str(devices), str(batch), mode], check=True, cwd=tmp_path,
                   capture_output=True, timeout=600)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict:
    return _run(tmp_path_factory.mktemp("single"), devices=1, batch=8)


def _assert_same_run(single: dict, ddp: dict) -> None:
    strip = {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "train_runtime",
             "train_samples_per_second", "train_steps_per_second"}
    assert len(single["log_history"]) == len(ddp["log_history"])
    for a, b in zip(single["log_history"], ddp["log_history"]):
        assert [k for k in a if k not in strip] == [k for k in b if k not in strip]
        for key in a:
            if key not in strip:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    evals = [e for e in ddp["log_history"] if "eval_n" in e]
    assert evals and all(e["eval_n"] == 21 for e in evals)
    np.testing.assert_allclose(np.array(ddp["predictions"]), np.array(single["predictions"]), rtol=1e-5, atol=1e-6)


@pytest.mark.distributed
def test_ddp_matches_single_process(single: dict, ddp_train_runs: dict[str, dict]) -> None:
    _assert_same_run(single, ddp_train_runs["ddp"])


@pytest.mark.distributed
def test_hf_ddp_arguments_reach_the_ddp_strategy_lightning_chooses(single: dict, ddp_train_runs: dict[str, dict]
                                                                   ) -> None:
    """No strategy given, 2 devices: Lightning's own DDPStrategy, with HF's `ddp_*` options (and the same run)."""
    ddp = ddp_train_runs["hf-ddp"]
    assert ddp["strategy"] == "DDPStrategy"
    assert ddp["ddp_kwargs"] == {"find_unused_parameters": False, "bucket_cap_mb": 1, "broadcast_buffers": False,
                                 "static_graph": True}
    assert ddp["timeout_s"] == 600
    _assert_same_run(single, ddp)


@pytest.mark.distributed
def test_hf_fsdp_argument_shards_per_layer_with_fsdp2_and_matches_single_process(
        single: dict, ddp_train_runs: dict[str, dict]) -> None:
    """`fsdp="full_shard auto_wrap"`: FSDP2 through ModelParallelStrategy, every BertLayer and the root sharded by
    the default policy (no `configure_model` of the user's); the updates and metrics are the single process's."""
    fsdp = ddp_train_runs["hf-fsdp2"]
    assert fsdp["strategy"] == "HFFSDP2Strategy"
    assert fsdp["sharded"] == ["FSDPBertForSequenceClassification", "FSDPBertLayer"]
    _assert_same_run(single, fsdp)


@pytest.mark.distributed
def test_split_batches_on_two_processes_match_single_process(single: dict, ddp_train_runs: dict[str, dict]) -> None:
    """`accelerator_config` `split_batches` (with `even_batches=False` and `sync_each_batch`): per-device batches of
    8 split over 2 processes (each reads 4, the loaders report 8) train and evaluate as one process with batch 8."""
    split = ddp_train_runs["split"]
    assert split["batch_sizes"] == [4, 8]
    _assert_same_run(single, split)
