"""`accelerator_config={"dispatch_batches": True}` under several processes: rank 0 reads every batch and sends each
process its part (issue 31), as accelerate's `DataLoaderDispatcher`.

Oracles: accelerate's own dispatcher on 2 real processes (each process's batches, two epochs, every geometry of the
last round), and `transformers.Trainer` trained on it in the same `torchrun` launch (`scripts/dispatch_twins.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
import transformers
from helpers import lm_dataset
from safetensors.torch import load_file
from test_accelerator_config import _ours

from hf_lightning.data.dispatch import DispatchLoader, dispatch_slice, join_batches

SCRIPT = Path(__file__).parent / "scripts" / "dispatch_twins.py"
RESUMED = {"resumed": "short-completed", "resumed-drop-last": "drop-last", "stream-resumed": "stream"}
"""A resumed geometry of the script, and the uninterrupted one whose epoch it resumes after one step."""


def test_round_split_is_accelerates_rule():
    """A round's rows split evenly; rows that do not divide are completed with the epoch's first rows."""
    assert dispatch_slice(8, 2, 1) == (slice(4, 8), 0)
    assert dispatch_slice(5, 2, 0) == (slice(0, 3), 1) and dispatch_slice(5, 2, 1) == (slice(3, 6), 1)
    assert dispatch_slice(1, 3, 2) == (slice(2, 3), 2)
    joined = join_batches([{"x": torch.zeros(2, 3)}, {"x": torch.ones(1, 3)}])
    assert joined["x"].shape == (3, 3)
    with pytest.raises(RuntimeError, match="You can't use batches of different size with `dispatch_batches=True`"):
        join_batches([{"x": torch.zeros(2, 3)}, {"x": torch.ones(2, 4)}])


def test_train_loader_dispatches_and_a_stream_with_false_is_refused():
    """Under 2 processes the train loader is the dispatcher over the whole data (every row, rank 0 reads it);
    evaluation keeps its shard; `False` with a stream is refused by name (accelerate shards it another way)."""
    loader = _ours(2, 1, lm_dataset(n=13), dispatch_batches=True).get_train_dataloader()
    assert isinstance(loader, DispatchLoader) and len(loader) == 2 and loader.total_batch_size == 8
    assert len(loader.dataset) == 13 and len(loader.loader) == 4  # the whole loader: 4 batches of 4
    assert not isinstance(_ours(2, 1, lm_dataset(n=13), dispatch_batches=True).get_eval_dataloader(), DispatchLoader)
    assert not isinstance(_ours(2, 1, lm_dataset(n=13), dispatch_batches=False).get_train_dataloader(),
                          DispatchLoader)
    stream = datasets.Dataset.from_dict(lm_dataset(n=8).to_dict()).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"dispatch_batches=False with a stream \(`IterableDataset`\) under 2"):
        _ours(2, 0, stream, dispatch_batches=False).get_train_dataloader()


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dispatch")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                           str(SCRIPT), str(out)], cwd=out, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out


@pytest.mark.distributed
def test_each_process_gets_accelerates_dispatched_batches(launch):
    for rank in (0, 1):
        seen = json.loads((launch / f"rank{rank}.json").read_text())
        for name, got in seen.items():
            assert not got["len"] or got["len"][0] == got["len"][1], name
            if name in RESUMED:
                # ours continues the uninterrupted epoch after its trained step (its tail); so does accelerate's
                # `skip_first_batches` for a stream, but for map-style data it skips that many batches of the WHOLE
                # loader, so HF's resume under dispatch_batches trains rows again: not the oracle there
                assert got["ours"] == [seen[RESUMED[name]]["theirs"][0][1:]], (name, rank)
                assert (got["theirs"] == got["ours"]) is name.startswith("stream"), (name, rank)
            else:
                assert got["ours"] == got["theirs"], (name, rank)
        assert seen["split"]["total_batch_size"] == 4 and seen["full"]["total_batch_size"] == 8


def _assert_trains_as_hf(launch: Path, name: str, entries: int) -> list[dict]:
    """The run `name`'s training log entries (loss, grad norm, train loss) equal HF's, weights to 1e-5; ours' log."""
    hf, ours = (json.loads((launch / f"{side}{name}" / "log_history.json").read_text()) for side in ("hf", "ours"))
    train_hf, train_ours = ([{k: v for k, v in e.items() if not k.startswith("eval_")} for e in
                             stable_log_entries(side)] for side in (hf, ours))
    assert [sorted(e) for e in train_ours] == [sorted(e) for e in train_hf] and len(train_ours) == entries
    for a, b in zip(train_ours, train_hf):
        assert a == pytest.approx(b, rel=1e-5)
    hf_weights, our_weights = (load_file(launch / f"{side}{name}" / "final" / "model.safetensors")
                               for side in ("hf", "ours"))
    for key, tensor in hf_weights.items():
        torch.testing.assert_close(our_weights[key], tensor, rtol=0, atol=1e-5, msg=key)
    return ours


@pytest.mark.distributed
def test_training_on_dispatched_batches_is_hfs(launch):
    """Two epochs whose last round leaves one row per process, dropout on: logged losses and grad norms equal HF's
    2-process run, weights to 1e-5; the loader ours hands out is the dispatcher, 4 steps per epoch. The same rows as
    a stream (rank 0 reads it; HF's default for a stream), 6 updates: the same."""
    ours = _assert_trains_as_hf(launch, "", 11)
    _assert_trains_as_hf(launch, "-stream", 9)
    for rank in (0, 1):
        assert json.loads((launch / f"ours-loader{rank}.json").read_text()) == {
            "type": "DispatchLoader", "len": 4, "total": 8}
    # evaluation reads this process's shard as without dispatching: the last eval_loss is one process's on the final
    # weights (HF's own 2-process eval_loss divides each batch's loss by the label tokens of both processes' batches,
    # README "Differences": not its one-process value, so not the oracle)
    model = transformers.GPT2LMHeadModel.from_pretrained(launch / "ours" / "final")
    model.loss_type = "ForCausalLM"
    model.eval()
    rows = lm_dataset(16, seed=4)
    with torch.no_grad():
        losses = [model(**transformers.default_data_collator([rows[j] for j in range(i, i + 4)])).loss.item()
                  for i in range(0, 16, 4)]
    assert [e["eval_loss"] for e in ours if "eval_loss" in e][-1] == pytest.approx(sum(losses) / 4, rel=1e-6)


def stable_log_entries(history: list[dict]) -> list[dict]:
    """A log history without its timing keys."""
    return [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k} for e in history]
