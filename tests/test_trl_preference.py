"""TRL's `DPOTrainer` (reference log-probabilities precomputed), `KTOTrainer` and `RewardTrainer`, run unchanged on
hf_lightning (`hf_lightning.use_as_transformers_trainer()` before `import trl`), equal the same TRL trainers on the
real `transformers.Trainer`: every logged value (losses, grad norms, learning rates, TRL's own metrics: DPO / KTO
rewards, margins, accuracies, log-probabilities, KL; the reward model's accuracy, margin and reward range), the
evaluation metrics (TRL's `prediction_step` / `evaluate` overrides), the checkpoint folders, TRL's model card and the
checkpoint weights, and `predict`'s metrics. Also with `load_best_model_at_end` by DPO's `rewards/margins`, and KTO
resumed from its mid-run checkpoint (equal to HF's resumed run, and ending with the uninterrupted run's weights).

The swap is process-wide, so each base runs in its own process (tests/scripts/trl_preference.py), both started
together, every kind in one process per base. trl 1.16.0, transformers 5.24. (Plain DPO, with resume, is in
tests/test_trl_parity.py.)

The 2-process variant (slow tier, distributed): DPO, KTO and the reward trainer in one torchrun launch (2 gloo
processes) per base, compared the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import child_result
from test_trl_parity import assert_same_log, assert_same_weights

SCRIPT = Path(__file__).parent / "scripts" / "trl_preference.py"
KINDS = ["dpo", "dpo_best", "kto", "kto_resumed", "reward"]
METRICS = {
    "dpo_best": ("rewards/margins", "rewards/accuracies"),
    "kto_resumed": ("rewards/margins", "kl"),
    "dpo": ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen"),
    "kto": ("rewards/chosen", "rewards/rejected", "rewards/margins", "kl", "logps/chosen"),
    "reward": ("accuracy", "margin", "mean_reward", "min_reward", "max_reward"),
}
"""Each trainer's own metrics, which must be in both the training and the evaluation log."""


def _start(base: str, root: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    spec = {"base": base, "root": str(root / base), "kinds": KINDS}
    return subprocess.Popen([sys.executable, str(SCRIPT), json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _result(process: subprocess.Popen, timeout: float = 900) -> dict:
    return child_result(process, timeout, "the TRL run")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every kind on both bases, the two processes side by side."""
    root = tmp_path_factory.mktemp("trl_preference")
    hf, ours = _start("hf", root), _start("ours", root)
    return root, _result(hf), _result(ours)


@pytest.mark.parametrize("kind", KINDS)
def test_trl_preference_trainer_on_hf_lightning_equals_it_on_transformers(runs, kind):
    root, hf, ours = runs
    assert "error" not in hf[kind], hf[kind]["error"]
    assert "error" not in ours[kind], ours[kind]["error"]
    want, got = hf[kind], ours[kind]
    assert_same_log(got["log"], want["log"])
    for name in METRICS[kind]:  # the trainer's own metrics were logged, in training and in evaluation
        assert any(name in entry for entry in got["log"]), name
        assert any(f"eval_{name}" in entry for entry in got["log"]), name
    assert [e["step"] for e in got["log"] if "loss" in e] == [1, 2, 3, 4]  # a resumed log starts with the checkpoint's
    assert [e["step"] for e in got["log"] if "eval_loss" in e] == [2, 4]
    checkpoints = {"dpo_best": ["checkpoint-2"], "kto_resumed": ["checkpoint-4"]}
    assert got["checkpoints"] == want["checkpoints"] == checkpoints.get(kind, ["checkpoint-2", "checkpoint-4"])
    assert got["card"] and want["card"]  # TRL's `_save_checkpoint` override wrote its model card
    for name in want["checkpoints"]:
        assert_same_weights(root / "ours" / kind / name, root / "hf" / kind / name)
    if kind == "kto_resumed":  # updates 3-4 and the weights are the uninterrupted run's (TRL's `num_tokens` counter
        # starts again at 0 on both bases: TRL does not checkpoint it)
        def after(log: list[dict]) -> list[dict]:
            return [{k: v for k, v in e.items() if "num_tokens" not in k} for e in log
                    if e["step"] > 2 and "train_loss" not in e]

        assert_same_log(after(got["log"]), after(ours["kto"]["log"]))
        assert_same_weights(root / "ours" / kind / "checkpoint-4", root / "ours" / "kto" / "checkpoint-4")
    assert_same_log([got["predict"]], [want["predict"]])


TWO_PROCESS_KINDS = ["dpo", "kto", "reward"]


def _start_two_processes(base: str, root: Path) -> subprocess.Popen:
    """One torchrun launch (2 gloo processes) running every kind of `TWO_PROCESS_KINDS` in turn."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    spec = {"base": base, "root": str(root / base), "kinds": TWO_PROCESS_KINDS}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return subprocess.Popen([*launcher, str(SCRIPT), json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_trl_preference_trainers_on_two_processes_equal_them_on_transformers_two_processes(tmp_path):
    """DPO (reference log-probabilities computed at each step: TRL's precompute fails on HF's own 2-process run, see
    the script), KTO (its KL term gathered over the processes) and the reward trainer, one torchrun launch per base:
    the logs (TRL's metrics averaged over the processes), the evaluation and `predict` metrics, the checkpoint
    folders, TRL's model card and the weights equal HF's 2-process run's."""
    hf, ours = _start_two_processes("hf", tmp_path), _start_two_processes("ours", tmp_path)
    try:
        want, got = _result(hf, timeout=300), _result(ours, timeout=300)
    finally:  # a failed or stuck first launch does not leave the second running
        for launch in (hf, ours):
            if launch.poll() is None:
                launch.kill()
                launch.communicate(timeout=60)
    for kind in TWO_PROCESS_KINDS:
        assert_same_log(got[kind]["log"], want[kind]["log"])
        for name in METRICS[kind]:
            assert any(name in entry for entry in got[kind]["log"]), (kind, name)
            assert any(f"eval_{name}" in entry for entry in got[kind]["log"]), (kind, name)
        assert [e["step"] for e in got[kind]["log"] if "loss" in e] == [1, 2, 3, 4], kind
        assert [e["step"] for e in got[kind]["log"] if "eval_loss" in e] == [2, 4], kind
        assert got[kind]["checkpoints"] == want[kind]["checkpoints"] == ["checkpoint-2", "checkpoint-4"], kind
        assert got[kind]["card"] and want[kind]["card"], kind
        for name in want[kind]["checkpoints"]:
            assert_same_weights(tmp_path / "ours" / kind / name, tmp_path / "hf" / kind / name)
        assert_same_log([got[kind]["predict"]], [want[kind]["predict"]])
