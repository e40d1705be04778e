"""sentence-transformers' `SentenceTransformerTrainer` on hf_lightning equals the same trainer on `transformers.Trainer`.

Each run is a subprocess (`scripts/st_train.py`: the swap of `transformers.Trainer` is process-wide): a tiny BERT
built from a config with a local tokenizer, `MultipleNegativesRankingLoss`, an `EmbeddingSimilarityEvaluator` every 2
updates, a checkpoint every 2 updates, 4 updates. sentence-transformers overrides HF-private hooks hf_lightning now
honours: `_save` (its own folder layout: `modules.json`, `1_Pooling/`, ...), `_load_from_checkpoint` (resume),
`_load_best_model`, `evaluation_loop` (the evaluator), `_push_from_checkpoint` (never called without the Hub), and sets
`can_return_loss`, `accelerator.even_batches` and `accelerator_config={"use_configured_state": True}`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SCRIPT = Path(__file__).parent / "scripts" / "st_train.py"
TIMEOUT_S = 300
TIMING = ("runtime", "per_second")
ST_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_bert_config.json", "1_Pooling/config.json",
            "model.safetensors", "tokenizer.json", "training_args.bin")
"""A sentence-transformers model folder (its `_save`), in every checkpoint."""


def run(base: str, out: Path, mode: str = "train", resume: Path | None = None, processes: int = 1) -> dict:
    """One `st_train.py` run (under `torchrun` for several processes); its result.json."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(SCRIPT), base, str(out), mode, *([str(resume)] if resume else [])]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                   "--standalone", *command[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "result.json").read_text())


def stable(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if not any(word in k for word in TIMING)} for entry in history]


def assert_same_log(got: list[dict], want: list[dict], rel: float = 0.0, atol: float = 0.0) -> None:
    got, want = stable(got), stable(want)
    assert [sorted(e) for e in got] == [sorted(e) for e in want]
    for our_entry, hf_entry in zip(got, want):
        for key, value in hf_entry.items():
            assert our_entry[key] == pytest.approx(value, rel=rel, abs=atol), (hf_entry, key)


def assert_same_weights(got: dict, want: dict, atol: float = 0.0) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(torch.tensor(got[name]), torch.tensor(value), rtol=0, atol=atol, msg=name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The same run on HF's Trainer and on hf_lightning's (each in its own process)."""
    root = tmp_path_factory.mktemp("st")
    return {base: (root / base, run(base, root / base)) for base in ("hf", "ours")}


def test_trainer_is_hf_lightnings_and_the_run_equals_hfs(runs, one_thread):
    (_, hf), (_, ours) = runs["hf"], runs["ours"]
    assert "hf_lightning.trainer.facade" in ours["trainer_class"]
    assert "transformers.trainer" in hf["trainer_class"]
    assert_same_log(ours["log_history"], hf["log_history"])  # losses, grad norms, learning rates, evaluator metrics
    assert [e["step"] for e in ours["log_history"] if "eval_dev_spearman_cosine" in e] == [2, 4]
    assert ours["global_step"] == hf["global_step"] == 4
    assert_same_weights(ours["weights"], hf["weights"])


def test_checkpoints_hold_sentence_transformers_folders_equal_to_hfs(runs, one_thread):
    (hf_dir, _), (our_dir, _) = runs["hf"], runs["ours"]
    for step in (2, 4):
        hf_folder, our_folder = hf_dir / "run" / f"checkpoint-{step}", our_dir / "run" / f"checkpoint-{step}"
        for name in ST_FILES:  # written by sentence-transformers' `_save`, inside our atomic checkpoint
            assert (our_folder / name).is_file(), name
        assert (our_folder / "checkpoint_manifest.json").is_file()  # hf_lightning's, written around it
        hf_weights, our_weights = load_file(hf_folder / "model.safetensors"), load_file(our_folder / "model.safetensors")
        assert our_weights.keys() == hf_weights.keys()
        for name, tensor in hf_weights.items():
            assert torch.equal(our_weights[name], tensor), (step, name)
    assert not [p for p in (our_dir / "run").iterdir() if p.name.startswith("tmp-")]


def test_resume_from_the_mid_run_checkpoint_is_exact(runs, tmp_path, one_thread):
    """`_load_from_checkpoint` (sentence-transformers' own) restores the weights; the run continues as if never
    stopped: the steps after the checkpoint log what the uninterrupted run logged, and end with its weights."""
    our_dir, ours = runs["ours"]
    (tmp_path / "base").symlink_to(our_dir / "base")
    resumed = run("ours", tmp_path, "resume", resume=our_dir / "run" / "checkpoint-2")
    tail = [e for e in stable(ours["log_history"]) if e["step"] > 2 and "train_loss" not in e]
    assert_same_log([e for e in resumed["log_history"] if e["step"] > 2 and "train_loss" not in e], tail)
    assert stable(resumed["log_history"])[:3] == stable(ours["log_history"])[:3]  # the checkpoint's history
    assert_same_weights(resumed["weights"], ours["weights"])


def test_load_best_model_at_end_loads_the_best_checkpoint_as_hf(tmp_path, one_thread):
    """`_load_best_model` (sentence-transformers': through its `_load_from_checkpoint`): checkpoint-2 is the best
    (lowest spearman), so the final weights are its weights, as on HF's Trainer."""
    hf = run("hf", tmp_path / "hf", "best")
    ours = run("ours", tmp_path / "ours", "best")
    assert Path(ours["best_model_checkpoint"]).name == Path(hf["best_model_checkpoint"]).name == "checkpoint-2"
    assert_same_weights(ours["weights"], hf["weights"])
    saved = load_file(tmp_path / "ours" / "run" / "checkpoint-2" / "model.safetensors")
    for name, tensor in saved.items():
        assert torch.equal(torch.tensor(ours["weights"][f"0.model.{name}"]), tensor), name


@pytest.mark.distributed
def test_two_processes_do_the_math_of_one(tmp_path, one_thread):
    """2 processes (gloo) of 4 pairs per update equal 1 process of 8, with a loss that is a mean over pairs
    (`CosineSimilarityLoss`) and no dropout: each process trains on its shard of the batches (the loader goes through
    `accelerator.prepare` with `even_batches=False`, as sentence-transformers sets it), gradients are averaged, the
    evaluator runs on the main process and its metrics are broadcast.

    The oracle is hf_lightning's single-process run, not HF's 2-process one: on CPU processes HF's Trainer (transformers
    5.24, accelerate 1.x) leaves sentence-transformers' loader unsharded (every process trains on all 8 batches per
    epoch) and logs no evaluator metrics.
    """
    one = run("ours", tmp_path / "one", "pairs")
    two = run("ours", tmp_path / "two", "pairs", processes=2)
    # float sums in another order (two half-batch gradients averaged): a near-zero pearson moves by ~1e-6
    assert_same_log(two["log_history"], one["log_history"], rel=1e-5, atol=1e-5)
    assert_same_weights(two["weights"], one["weights"], atol=1e-5)
