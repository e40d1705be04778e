"""TRL's `GRPOTrainer` (generation by `model.generate`, no vLLM), run unchanged on hf_lightning
(`hf_lightning.use_as_transformers_trainer()` before `import trl`), equals the same trainer on the real
`transformers.Trainer`, and resumes exactly after a pre-emption.

- Parity (num_iterations 1 and 2, gradient_accumulation_steps 2, a checkpoint at every update; and `RLOOTrainer`
  with num_iterations 2): every logged value
  (losses, KL, entropy, clip ratios, rewards, reward std, completion lengths, token counts, grad norms, learning rates),
  the completions, per-function rewards and advantages of every generation, the checkpoint folders and weights.
- Resume from checkpoint-1: with num_iterations 1 (every update generates) both bases continue as the uninterrupted
  run. With num_iterations 2, checkpoint-1 lies inside a buffer (its second iteration is still to run): TRL on
  transformers.Trainer generates again from the updated policy (its buffer and `_step` are not checkpointed) and
  trains on other completions, with other losses; hf_lightning restores the buffer and position
  (`trainer/rollout_state.py`) and continues as the uninterrupted run.
- 2 gloo processes (torchrun, one launch per base running both num_iterations settings; slow tier): equal to TRL on
  transformers.Trainer's 2 processes.
- Pre-emption (`enable_jit_checkpoint=True`): SIGTERM at 10 instants drawn at random (seed 2026) among: during
  generation (in the reward function), between two slices of a buffer (between micro-batches), in the update (before
  the optimizer step), between iterations over a buffer (after an update): each stops after the update it hit, with
  its checkpoint, and the run resumed from it (in the same process) equals the uninterrupted run. Then SIGKILL at a
  random instant of a run saving every update: the last complete checkpoint resumes to the uninterrupted run.

Each base runs in its own process (the swap is process-wide; tests/scripts/trl_grpo.py). trl 1.16.0, transformers
5.24.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import child_result
from safetensors.torch import load_file

SCRIPT = Path(__file__).parent / "scripts" / "trl_grpo.py"
KINDS = ["ni1", "ni2", "rloo"]
VOLATILE = ("step_time", "runtime", "per_second")
"""Log keys that differ between equal runs (timings)."""
PHASES = ("generate", "substep", "pre_optimizer_step", "step_end")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1"}


def _start(spec: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())


def _result(process: subprocess.Popen, timeout: float = 900) -> dict:
    return child_result(process, timeout, "the GRPO run")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both kinds on both bases, each also resumed from checkpoint-1; the two processes side by side."""
    root = tmp_path_factory.mktemp("grpo")
    hf = _start({"base": "hf", "mode": "parity", "root": str(root / "hf"), "kinds": KINDS, "resume": True})
    ours = _start({"base": "ours", "mode": "parity", "root": str(root / "ours"), "kinds": KINDS, "resume": True})
    return root, _result(hf), _result(ours)


def stable(log: list[dict], after: int = 0) -> list[dict]:
    """The log without timings (and without the run summary's `train_loss` when `after`: a resumed run's covers its
    own updates only), from update `after + 1` on."""
    return [{k: v for k, v in e.items() if not any(w in k for w in VOLATILE) and not (after and k == "train_loss")}
            for e in log if e["step"] > after]


def assert_same_log(got: list[dict], want: list[dict]) -> None:
    assert [sorted(e) for e in got] == [sorted(e) for e in want] and got
    for ours, hf in zip(got, want):
        assert ours == pytest.approx(hf, rel=1e-6, abs=1e-9), hf["step"]


def assert_same_records(got: list[dict], want: list[dict]) -> None:
    """The generations updates trained on: completions exactly, rewards and advantages to float precision."""
    assert [r["step"] for r in got] == [r["step"] for r in want] and got
    for ours, hf in zip(got, want):
        assert ours["completions"] == hf["completions"] and ours["completions"], hf["step"]
        assert sorted(ours["rewards"]) == sorted(hf["rewards"]), hf["step"]
        for name, values in hf["rewards"].items():
            assert ours["rewards"][name] == pytest.approx(values, rel=1e-6), (hf["step"], name)
        assert ours["advantages"] == pytest.approx(hf["advantages"], rel=1e-6, abs=1e-9), hf["step"]


def assert_same_weights(got: Path, want: Path) -> None:
    ours, hf = load_file(str(got / "model.safetensors")), load_file(str(want / "model.safetensors"))
    assert sorted(ours) == sorted(hf)
    for name, tensor in hf.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=1e-6, msg=name)


def _ok(result: dict, kind: str) -> dict:
    assert "error" not in result[kind], result[kind].get("error")
    return result[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_grpo_on_hf_lightning_equals_it_on_transformers(runs, kind):
    root, hf, ours = runs
    want, got = _ok(hf, kind), _ok(ours, kind)
    assert_same_log(stable(got["log"]), stable(want["log"]))
    assert any("kl" in e and "reward" in e and "loss" in e for e in got["log"])
    assert_same_records(got["records"], want["records"])
    assert got["checkpoints"] == want["checkpoints"] == [f"checkpoint-{i}" for i in range(1, 5)]
    for name in want["checkpoints"]:
        assert_same_weights(root / "ours" / kind / name, root / "hf" / kind / name)


@pytest.mark.parametrize("kind", KINDS)
def test_grpo_resumed_inside_a_buffer_continues_exactly_where_trl_on_transformers_generates_again(runs, kind):
    root, hf, ours = runs
    whole, resumed = _ok(ours, kind), _ok(ours, kind + "-resumed")
    assert_same_log(stable(resumed["log"], after=1), stable(whole["log"], after=1))
    assert_same_records(resumed["records"], [r for r in whole["records"] if r["step"] > 1])
    assert_same_weights(root / "ours" / f"{kind}-resumed" / "checkpoint-4", root / "ours" / kind / "checkpoint-4")
    hf_whole, hf_resumed = _ok(hf, kind), _ok(hf, kind + "-resumed")
    if kind == "ni1":  # checkpoint-1 is at a generation boundary: TRL's regeneration is the next generation anyway
        assert_same_log(stable(resumed["log"], after=1), stable(hf_resumed["log"], after=1))
        return
    # the difference TRL's design makes on transformers.Trainer (GRPO and RLOO): update 2 trains on completions
    # generated again
    assert hf_resumed["records"][0]["completions"] != hf_whole["records"][1]["completions"]
    hf_losses = [e["loss"] for e in stable(hf_resumed["log"], after=1) if "loss" in e]
    whole_losses = [e["loss"] for e in stable(hf_whole["log"], after=1) if "loss" in e]
    assert hf_losses != pytest.approx(whole_losses, rel=1e-6)


@pytest.mark.distributed
def test_grpo_on_two_processes_equals_trl_on_transformers_two_processes(tmp_path):
    """One torchrun launch per base running both num_iterations settings on 2 gloo processes: the same logs
    (rewards and KL gathered over both processes), completions tables, checkpoints and weights."""
    from gen_helpers import tiny_llama, word_tokenizer

    policy = tmp_path / "policy"
    tiny_llama(seed=0).save_pretrained(policy)
    word_tokenizer().save_pretrained(policy)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    oracle = [*launcher, str(Path(__file__).parent / "scripts" / "oracle_clean_exit.py")]  # see its docstring
    results = {}
    for base, command in (("hf", oracle), ("ours", launcher)):
        spec = {"base": base, "mode": "parity", "root": str(tmp_path / base), "kinds": ["ni1", "ni2"],
                "policy": str(policy)}
        process = subprocess.Popen([*command, str(SCRIPT), json.dumps(spec)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=_env())
        results[base] = _result(process)
    for kind in ("ni1", "ni2"):
        want, got = _ok(results["hf"], kind), _ok(results["ours"], kind)
        assert_same_log(stable(got["log"]), stable(want["log"]))
        assert_same_records(got["records"], want["records"])
        assert got["checkpoints"] == want["checkpoints"] == [f"checkpoint-{i}" for i in range(1, 5)]
        for name in want["checkpoints"]:
            assert_same_weights(tmp_path / "ours" / kind / name, tmp_path / "hf" / kind / name)


def _instants() -> list[dict]:
    """The (phase, update) instants of the num_iterations-2 run (4 updates; it generates in updates 1 and 3; a stop
    in the last update would leave nothing to resume): 11."""
    return [{"phase": phase, "step": step} for phase in PHASES for step in range(1, 4)
            if not (phase == "generate" and step == 2)]


def test_grpo_preempted_at_random_instants_resumes_exactly(tmp_path):
    rng = random.Random(2026)
    instants = rng.sample(_instants(), 10)
    kill = rng.choice([i for i in _instants() if i["step"] >= 2])  # a checkpoint exists before it
    spec = {"base": "ours", "mode": "preempt", "root": str(tmp_path), "kind": "ni2", "instants": instants,
            "kill": kill, "result": str(tmp_path / "preempt.json")}
    proc = subprocess.run([sys.executable, str(SCRIPT), json.dumps(spec)], env=_env(), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == -9, proc.stderr[-6000:]  # the SIGKILL instant was reached
    result = json.loads((tmp_path / "preempt.json").read_text())
    reference = result["reference"]
    for stop in result["stops"]:
        where = stop["instant"]
        assert "error" not in stop, (where, stop)
        step = int(stop["checkpoint"].split("-")[1])
        assert step == where["step"], (where, stop["checkpoint"])  # the update it hit finished, then it stopped
        assert f"after update {step}" in stop["stopped"], stop["stopped"]
        resumed = stop["resumed"]
        assert_same_log(stable(resumed["log"], after=step), stable(reference["log"], after=step))
        assert_same_records(resumed["records"], [r for r in reference["records"] if r["step"] > step])
    last = {"base": "ours", "mode": "resume_last", "root": str(tmp_path), "kind": "ni2",
            "folder": str(tmp_path / "killed"), "result": str(tmp_path / "last.json")}
    proc = subprocess.run([sys.executable, str(SCRIPT), json.dumps(last)], env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    after_kill = json.loads((tmp_path / "last.json").read_text())
    step = int(after_kill["checkpoint"].split("-")[1])
    assert step in (kill["step"] - 1, kill["step"]), (kill, after_kill["checkpoint"])
    resumed = after_kill["resumed"]
    assert_same_log(stable(resumed["log"], after=step), stable(reference["log"], after=step))
    assert_same_records(resumed["records"], [r for r in reference["records"] if r["step"] > step])


def _recording(base: type) -> type:
    class Recording(base):
        """HF's `_load_optimizer_and_scheduler` override pattern (TRL's GRPO / RLOO): the built-in, then its own."""

        calls: list = []

        def _load_optimizer_and_scheduler(self, checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)
            state = self.optimizer.state_dict()["state"]
            self.calls.append((None if checkpoint is None else Path(checkpoint).name,
                               int(state[0]["step"]) if state else 0, self.lr_scheduler.last_epoch))

    return Recording


def test_load_optimizer_and_scheduler_override_is_called_as_hfs(tmp_path, one_thread):
    """Before: overriding `_load_optimizer_and_scheduler` was refused at construction (TRL's GRPOTrainer overrides it).
    Now it is called as HF calls it: once per resumed `train()` (not on a fresh run), with the folder, the
    optimizer and scheduler already holding the checkpoint's state after `super()`."""
    import transformers
    from helpers import lm_dataset, tiny_gpt2

    import hf_lightning

    seen = {}
    for name, trainer_cls, args_cls, extra in (
            ("hf", transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True}),
            ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments, {})):
        cls = _recording(trainer_cls)
        cls.calls = []
        for resume in (None, str(tmp_path / name / "checkpoint-2")):
            args = args_cls(output_dir=str(tmp_path / name), max_steps=3, save_steps=2, per_device_train_batch_size=4,
                            report_to="none", disable_tqdm=True, **extra)
            cls(model=tiny_gpt2(), args=args, train_dataset=lm_dataset(n=16)).train(resume_from_checkpoint=resume)
        seen[name] = cls.calls
    assert seen["ours"] == seen["hf"] == [("checkpoint-2", 2, 2)]
