"""Exact evaluation and prediction under DDP: 2 CPU processes (gloo) give the single-process results, bit for bit.

One 2-process subprocess run (tests/scripts/ddp_eval.py) covers a function `compute_metrics` on two named eval sets,
a streaming torchmetrics collection, an LM's sample- and token-weighted `eval_loss` and `predict` on both ranks; the
single-process reference runs in this process. 101 samples with a per-device batch of 4 do not divide over 2
processes: Lightning's `DistributedSampler` would evaluate 102 (one duplicate).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ddp_eval")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "ddp_eval.py"), str(tmp_path / "out"), "2"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"out.rank{r}.json").read_text()) for r in (0, 1)]
    sys.path.insert(0, str(SCRIPTS))
    try:
        import ddp_eval
    finally:
        sys.path.remove(str(SCRIPTS))
    threads = __import__("torch").get_num_threads()
    try:
        single = ddp_eval.collect(1, str(tmp_path / "single"))
    finally:
        __import__("torch").set_num_threads(threads)
    return single, ranks


@pytest.mark.distributed
def test_function_metrics_see_every_sample_once_in_order(runs):
    single, ranks = runs
    for ddp in ranks:  # every rank computes the same, complete result
        assert ddp["function"] == single["function"]
        assert ddp["function"]["eval_main_n"] == 101 and ddp["function"]["eval_small_n"] == 7
        assert ddp["function"]["eval_main_in_order"] == 1.0 and ddp["function"]["eval_small_in_order"] == 1.0
    assert ranks[0]["log_entries"] == single["log_entries"] == 2  # one per eval set; predict() adds none


@pytest.mark.distributed
def test_predict_returns_every_prediction_in_order_on_every_rank(runs):
    single, ranks = runs
    assert len(single["predictions"]) == 101
    for ddp in ranks:
        assert ddp["predictions"] == single["predictions"]
        assert ddp["label_ids"] == single["label_ids"]
        assert ddp["predict_metrics"] == single["predict_metrics"]


@pytest.mark.distributed
def test_streaming_metrics_are_synced(runs):
    single, ranks = runs
    for ddp in ranks:
        assert ddp["streaming"] == single["streaming"]
    assert set(single["streaming"]) == {"eval_loss", "eval_accuracy", "eval_f1", "epoch"}
    assert single["streaming"]["eval_accuracy"] == pytest.approx(single["function"]["eval_main_accuracy"], abs=1e-7)


@pytest.mark.distributed
def test_lm_losses_and_padded_predictions(runs):
    single, ranks = runs
    for ddp in ranks:
        for key in ("lm_predictions_shape", "lm_predictions_sha", "lm_label_ids"):
            assert ddp[key] == single[key], key
        for key in ("lm_samples", "lm_tokens"):
            assert ddp[key]["eval_loss"] == single[key]["eval_loss"]  # bit for bit, in both weightings
            # torchmetrics' Perplexity keeps a float32 sum per process and adds the two sums: same tokens, other
            # summation order, so equal to float32 rounding only
            assert ddp[key]["eval_perplexity"] == pytest.approx(single[key]["eval_perplexity"], rel=2e-6)
    # the token-weighted loss is the log of the perplexity over the same tokens; the HF loss weights batches by rows
    import math

    assert single["lm_tokens"]["eval_loss"] == pytest.approx(math.log(single["lm_tokens"]["eval_perplexity"]), rel=1e-5)
    assert single["lm_tokens"]["eval_loss"] != single["lm_samples"]["eval_loss"]
