"""Under DDP with `average_tokens_across_devices` (the default), what each trainer computes for a model whose
`forward` takes `**kwargs` but ignores `num_items_in_batch` (a BERT classifier): one `torchrun --nproc_per_node 2`
launch per trainer (gloo), against `transformers.Trainer` on ONE process with the same global batch (8 = 2 x 4).

Which side is right: the gradient of the mean loss over the global batch is what the single-process run computes.
HF 5.24's `compute_loss` multiplies the loss by the number of processes whenever the model accepts loss kwargs and
`num_items_in_batch` is counted (transformers/trainer.py `compute_loss`): correct for a model that divides its
summed loss by the global `num_items_in_batch`, but BERT returns its own per-process mean, so DDP's average of the
gradients is 2x the true one on 2 processes: HF's logged `loss` and `grad_norm` are 2x, and its weights drift from
the single-process run. The oracle is therefore HF's single-process run (HF's own 2-process run is checked only to
pin down the factor); README "Differences from the HF Trainer", "DDP losses are means".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import load_script
from safetensors.torch import load_file

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCRIPT = SCRIPTS / "ddp_loss_scale.py"
LAUNCH = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def _launch(side: str, out: Path) -> None:
    # HF leaves its process group to the interpreter's exit: oracle_clean_exit.py destroys it (see its docstring)
    target = [str(SCRIPTS / "oracle_clean_exit.py"), str(SCRIPT)] if side == "hf" else [str(SCRIPT)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([*LAUNCH, *target, side, str(out), "4"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def _single_process_hf(out: Path) -> None:
    load_script("ddp_loss_scale").train("hf", str(out), 8)


def _steps(out: Path) -> list[dict]:
    return [e for e in json.loads((out / "log_history.json").read_text()) if "loss" in e or "train_loss" in e]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "final" / "model.safetensors"))


def test_two_process_losses_and_weights_are_those_of_one_process_with_the_global_batch(tmp_path, one_thread):
    _launch("ours", tmp_path / "ours2")
    _launch("hf", tmp_path / "hf2")
    _single_process_hf(tmp_path / "hf1")
    oracle, ours, hf2 = _steps(tmp_path / "hf1"), _steps(tmp_path / "ours2"), _steps(tmp_path / "hf2")
    assert len(ours) == len(oracle) == 5  # 4 updates logged, then the summary
    for a, b in zip(oracle, ours):
        for key in ("loss", "grad_norm", "learning_rate", "train_loss", "step"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5), (a["step"], key)
    expected, got = _weights(tmp_path / "hf1"), _weights(tmp_path / "ours2")
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)
    # HF on 2 processes: the first update starts from the same weights, so its loss and gradient norm are exactly the
    # oracle's times the number of processes; its weights then differ (a twice too large SGD step)
    assert hf2[0]["loss"] == pytest.approx(2 * oracle[0]["loss"], rel=1e-5)
    assert hf2[0]["grad_norm"] == pytest.approx(2 * oracle[0]["grad_norm"], rel=1e-5)
    drift = max((w - expected[n]).abs().max().item() for n, w in _weights(tmp_path / "hf2").items())
    assert drift > 1e-3
