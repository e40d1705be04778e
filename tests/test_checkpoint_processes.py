"""Checkpoints across real processes: a SIGKILL in the middle of a save, and 2-process DDP / FSDP2 (CPU, gloo) saves
and exact resumes. The scenarios run tests/scripts/checkpoint_train.py as subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import load_script
from safetensors.torch import load_file

from hf_lightning.checkpoint.write import list_checkpoints
from hf_lightning.checkpoint.find import last_checkpoint

SCRIPT = Path(__file__).parent / "scripts" / "checkpoint_train.py"


def _script_module():
    return load_script("checkpoint_train")


def _run(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                        os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _losses(history: list[dict], after: int = 0) -> list[tuple]:
    return [(e["step"], e["loss"], e["grad_norm"], e["learning_rate"], e["epoch"]) for e in history
            if "loss" in e and e["step"] > after]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of the kill scenario, in this process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("reference")
    trainer = _script_module().make_trainer(str(out), {})
    trainer.train()
    torch.set_num_threads(threads)
    return out, trainer


@pytest.mark.parametrize("point", ["files", "rename"])
def test_sigkill_mid_save_leaves_no_valid_looking_folder_and_loses_nothing(tmp_path, point, reference, one_thread):
    out = tmp_path / "out"
    proc = _run("kill", str(out), point, cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    names = sorted(os.listdir(out))
    # the earlier checkpoint survives intact; the killed run's lock and unfinished folder stay behind
    assert names[:2] == [".hf_lightning.lock", "checkpoint-2"] and len(names) == 3, names
    assert names[2].startswith("tmp-checkpoint-4-"), names
    # neither resume nor rotation takes the half-written folder for a checkpoint
    assert last_checkpoint(out) == str(out / "checkpoint-2")
    assert [Path(c.path).name for c in list_checkpoints(out)] == ["checkpoint-2"]
    # resuming from what survived reproduces the uninterrupted run exactly (the stale lock is taken over, the
    # leftover removed)
    reference_dir, reference_run = reference
    resumed = _script_module().make_trainer(str(out), {})
    resumed.train(resume_from_checkpoint=True)
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert _losses(resumed.state.log_history) == _losses(reference_run.state.log_history)
    a, b = (load_file(str(d / "checkpoint-6" / "model.safetensors")) for d in (out, reference_dir))
    assert all(torch.equal(a[k], b[k]) for k in a)


STRATEGIES = {"ddp": "DDPStrategy", "hf-ddp": "DDPStrategy", "fsdp2": "HFFSDP2Strategy",
              "fsdp2-plain": "ModelParallelStrategy", "fsdp2-subclass": "ModelParallelStrategy", "ddp-async": "DDPStrategy"}


NONFINITE = ["ddp", "fsdp2"]
SCENARIOS = [f"resume:{name}" for name in STRATEGIES] + [f"nonfinite:{name}" for name in NONFINITE]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """Every 2-process scenario of this file in ONE launch (tests/scripts/checkpoint_train.py `many`): the processes'
    start-up, imports and process group are paid once, not once per scenario. Each test checks its own scenario's
    folder; a scenario that raised left its traceback there (`_scenario` fails the test with it)."""
    out = tmp_path_factory.mktemp("two_processes")
    # 8 scenarios (16 runs of 6 updates) on a loaded 2-core machine: a generous bound, still below the tests' limit
    proc = _run("many", str(out), *SCENARIOS, cwd=out, timeout=1500)
    return out, proc


def _scenario(two_processes: tuple[Path, subprocess.CompletedProcess], name: str) -> Path:
    out, proc = two_processes
    folder = out / name
    errors = sorted(folder.glob("error.*")) if folder.is_dir() else []
    assert folder.is_dir() and not errors, ([e.read_text()[-3000:] for e in errors], proc.returncode,
                                            proc.stderr[-4000:])
    return folder


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_process_save_and_exact_resume(two_processes, strategy):
    """Under DDP (ours or from HF's `ddp_*`) and FSDP2 (from HF's `fsdp`, a plain `ModelParallelStrategy` sharded by
    the default policy, or a user's own `configure_model`): HF-layout checkpoints with the gathered full weights, and
    an exact resume from a mid-epoch checkpoint."""
    tmp_path = _scenario(two_processes, f"resume-{strategy}")
    proc = two_processes[1]
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads((tmp_path / "result.json").read_text())
    sharded = strategy.startswith("fsdp2")
    assert data["world_size"] == 2 and data["sharded"] == sharded and data["strategy"] == STRATEGIES[strategy]
    full, resumed = data["full"], data["resumed"]
    assert [e[0] for e in _losses(full)] == [1, 2, 3, 4, 5, 6]
    assert _losses(resumed, after=4) == _losses(full, after=4)  # bit-identical continuation
    assert sorted(os.listdir(tmp_path / "full")) == ["checkpoint-4", "checkpoint-6"]  # rotated on rank 0
    folder = tmp_path / "full" / "checkpoint-4"
    files = set(os.listdir(folder))
    # one RNG file per rank (HF's names), shared files once, written by rank 0
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "trainer_state.json", "scheduler.pt"} <= files
    assert "rng_state.pth" not in files
    assert ("optimizer_sharded" in files) == sharded and ("optimizer.pt" in files) == (not sharded)
    # the full (gathered) weights were saved with save_pretrained, loadable in one process
    from transformers import AutoModelForCausalLM

    weights = load_file(str(tmp_path / "full" / "checkpoint-6" / "model.safetensors"))
    assert weights["transformer.wte.weight"].shape == (64, 32)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final_model")
    final = load_file(str(tmp_path / "resumed" / "checkpoint-6" / "model.safetensors"))
    for name, tensor in final.items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
        assert torch.equal(weights[name], tensor), name  # the resumed run ends where the uninterrupted one did
    assert not [p for p in os.listdir(tmp_path / "full") if p.startswith("tmp-")]
    # every checkpoint carries a manifest written by the rank that finalised it, after every rank's files existed
    # (the other rank's RNG file, the optimizer shards, with save_async too), and verifies
    from hf_lightning.checkpoint.verify import verify_path

    verdicts = verify_path(tmp_path / "full")
    assert [v.folder.name for v in verdicts] == ["checkpoint-4", "checkpoint-6"]
    assert all(v.ok and v.has_manifest for v in verdicts), [v.problems for v in verdicts]
    listed = json.loads((folder / "checkpoint_manifest.json").read_text())["files"]
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "trainer_state.json"} <= set(listed)
    assert any(name.startswith("optimizer_sharded/") for name in listed) == sharded


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("strategy", NONFINITE)
def test_a_nan_in_one_ranks_shard_stops_every_rank_before_the_save(two_processes, strategy):
    """Rank 1 alone holds a NaN (in its FSDP2 shard) at the save of update 4: one sum over the processes makes every
    rank refuse the save naming the same parameter (without it, rank 0 would enter the save's collectives alone)."""
    tmp_path = _scenario(two_processes, f"nonfinite-{strategy}")
    proc = two_processes[1]
    outcomes = [json.loads((tmp_path / f"result.json.{rank}").read_text()) for rank in (0, 1)]
    assert all(o["error"] == "NonFiniteWeightsError" for o in outcomes), (outcomes, proc.stderr[-3000:])
    assert [o["sharded"] for o in outcomes] == [strategy == "fsdp2"] * 2
    for rank, outcome in enumerate(outcomes):
        kind = "NaN" if rank == 1 else "NaN or inf"  # rank 0's own shard is finite
        assert outcome["message"].startswith(f"Saving at step 4: the model's weights are not finite "
                                             f"('transformer.h.1.mlp.c_fc.weight' holds {kind}), so no checkpoint-4")
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-2"]