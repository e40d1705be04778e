"""Uneven evaluation, prediction and generation under FSDP2 on 2 CPU processes (gloo) give the single-process results;
the FSDP2 model file holds the tensors a single-process save holds.

One 2-process launch of tests/scripts/sharded_eval.py (see its docstring for what it runs) against `collect(1)` in
this process. Before lock-step padding (`module/eval_run.py`) the first evaluation whose shards differ in batch count
died with gloo's "collective mismatch"; before `alias_tied_weights` the FSDP2 file held `lm_head.weight` too.
The lock-step rule and the padding mechanics have unit tests without processes in tests/test_lockstep.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "scripts"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("sharded_eval")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_CACHE": str(tmp / "cache")}
    proc = subprocess.run([sys.executable, str(SCRIPTS / "sharded_eval.py"), str(tmp / "two"), "2"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp / "two" / f"rank{r}.json").read_text()) for r in (0, 1)]
    sys.path.insert(0, str(SCRIPTS))
    threads, cwd = torch.get_num_threads(), os.getcwd()
    try:
        import sharded_eval  # type: ignore[import-not-found]  # tests/scripts, put on the path above

        os.chdir(REPO)  # the CLI config names its data files relative to the repository
        single = sharded_eval.collect(1, str(tmp / "one"))
    finally:
        sys.path.remove(str(SCRIPTS))
        os.chdir(cwd)
        torch.set_num_threads(threads)
    return single, ranks


def _oracle_batch_size(size: int, batch_size: int, world: int = 2) -> int:
    """The single-process batch size whose batches the 2-process run has: the same, unless there are fewer batches
    than processes; then the shards are cut per row (`ContiguousShardSampler`) and rank 0 has ceil(size / world)
    (one row: any batch size gives that batch)."""
    if math.ceil(size / batch_size) >= world or size < world:
        return batch_size
    return math.ceil(size / world)


@pytest.mark.distributed
def test_uneven_eval_and_predict_under_fsdp2_match_one_process(runs: tuple[dict, list[dict]]) -> None:
    """Sizes 1, 3, 9, 101 in batches of 2 and 3 (one `evaluate()` over the four sets, then `predict()` on each):
    every metric, `eval_loss` and every prediction (bytes and order) as on one process, on both ranks."""
    single, ranks = runs
    assert ranks[0]["facade_sharded"] is True
    for two in ranks:  # every rank gathers the complete result
        for batch_size in (2, 3):
            got = two[f"facade_bs{batch_size}"]
            for n in (1, 3, 9, 101):
                want = single[f"facade_bs{_oracle_batch_size(n, batch_size)}"]
                for key in ("loss", "n", "in_order", "logit_sum"):
                    assert got[f"eval_n{n}_{key}"] == want[f"eval_n{n}_{key}"], (batch_size, n, key)
                assert got[f"eval_n{n}_n"] == n and got[f"eval_n{n}_in_order"] == 1.0
                prediction = two[f"predict_bs{batch_size}_n{n}"]
                assert prediction == single[f"predict_bs{_oracle_batch_size(n, batch_size)}_n{n}"], (batch_size, n)


@pytest.mark.distributed
def test_evaluations_inside_training_run_under_fsdp2(runs: tuple[dict, list[dict]]) -> None:
    """The evaluations `train()` runs (9 rows: 3 + 2 batches, after each of 2 updates) finish and are logged. Their
    values are not compared: 2 processes train on other micro-batches than one, so the weights differ in rounding."""
    single, ranks = runs
    assert single["fit_eval_steps"] == [1, 2]
    for two in ranks:
        assert two["fit_eval_steps"] == [1, 2]


@pytest.mark.distributed
def test_the_cli_validates_and_predicts_the_config_validation_set_under_fsdp2(runs: tuple[dict, list[dict]]) -> None:
    """`configs/causal_lm.yaml`'s validation set (42 blocks in batches of 16: 2 + 1 batches) through `--args.fsdp`
    and through a plain `ModelParallelStrategy`: the weights were shards, both ranks ran as many forwards (the
    busiest rank's 2 batches), and `eval_loss` and the prediction files are those of one process."""
    single, ranks = runs
    for how in ("args_fsdp", "model_parallel"):
        for rank in ranks:
            assert rank[f"cli_{how}_forwards"] == [{"stage": "validate", "forwards": 2, "sharded": True},
                                                   {"stage": "predict", "forwards": 2, "sharded": True}], how
        assert ranks[0][f"cli_{how}_eval"] == single["cli_single_eval"], how
        assert ranks[0][f"cli_{how}_predictions"] == single["cli_single_predictions"], how


@pytest.mark.distributed
def test_generation_under_fsdp2_runs_generate_in_lockstep(runs: tuple[dict, list[dict]]) -> None:
    """T5 and a decoder-only GPT-2 (beams 2, 5 rows in batches of 2: 2 + 1 batches), `synced_gpus` by default under
    FSDP2: both ranks call `generate` equally often (evaluate and predict: 2 each), and the predictions, text
    metrics and `eval_loss` are the single-process ones (the shards are cut at batch boundaries: same batches)."""
    single, ranks = runs
    for name in ("t5", "gpt2"):
        assert [r[f"gen_{name}_calls"] for r in ranks] == [4, 4], name
        assert all(r[f"gen_{name}_synced"] is True for r in ranks), name
        assert ranks[0][f"gen_{name}_predictions"] == single[f"gen_{name}_predictions"], name
        assert ranks[0][f"gen_{name}_labels"] == single[f"gen_{name}_labels"], name
        assert ranks[0][f"gen_{name}_eval"] == single[f"gen_{name}_eval"], name


@pytest.mark.distributed
def test_fsdp2_saves_the_tied_lm_head_once_as_one_process_does(runs: tuple[dict, list[dict]]) -> None:
    """The FSDP2 `save_model()` file has exactly the single-process tensors (28 for this GPT-2: `lm_head.weight` is
    tied to `transformer.wte.weight` and dropped, as HF's `save_pretrained` drops it), and loads to the same logits."""
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    single, ranks = runs
    sharded = load_file(str(Path(ranks[0]["saved_model"]) / "model.safetensors"))
    plain = load_file(str(Path(single["saved_model"]) / "model.safetensors"))
    assert "lm_head.weight" not in sharded
    assert sharded.keys() == plain.keys()
    for key, tensor in plain.items():
        assert torch.equal(sharded[key], tensor), key
    ids = torch.tensor([[5, 9, 13, 40, 2]])
    logits = [GPT2LMHeadModel.from_pretrained(path).eval()(ids).logits
              for path in (ranks[0]["saved_model"], single["saved_model"])]
    assert torch.equal(logits[0], logits[1])
