"""The final model save of `hf-lightning fit` under FSDP2 (2 CPU processes, gloo): the full weights are gathered
from the shards and written by rank 0, as `hf_lightning.Trainer.save_model` does (one helper for both,
`checkpoint/final_model.py`). Without the gather, rank 0 would save its shard of each parameter only. FSDP2 comes
from HF's `fsdp` argument in the config's `args:` or from a plain `ModelParallelStrategy` in `trainer.strategy`; either
way the model is sharded per layer by the default policy, with no module class of the user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "cli_fsdp2_fit.py"


STRATEGY_CONFIGS = {
    # HF's argument, as an HF user's config carries it: FSDP2 with the default per-layer sharding
    "args.fsdp": ("args: {fsdp: full_shard auto_wrap}\ntrainer: {devices: 2}\n", "HFFSDP2Strategy"),
    # a plain Lightning ModelParallelStrategy: the same default sharding, no configure_model of the user's
    "trainer.strategy": ("trainer:\n  devices: 2\n  strategy:\n"
                         "    class_path: lightning.pytorch.strategies.ModelParallelStrategy\n"
                         "    init_args: {data_parallel_size: 2, tensor_parallel_size: 1}\n", "ModelParallelStrategy"),
}


@pytest.mark.distributed
@pytest.mark.parametrize("how", list(STRATEGY_CONFIGS))
def test_cli_fit_saves_the_gathered_model_under_fsdp2(tmp_path, how):
    out = tmp_path / "out"
    strategy_yaml, strategy_class = STRATEGY_CONFIGS[how]
    overrides = tmp_path / "fsdp2.yaml"
    overrides.write_text(
        "args: {max_steps: 3, eval_strategy: 'no', save_strategy: steps, save_steps: 3, report_to: 'none'}\n"
        "data: {max_train_samples: 48}\n"
        # the callback's module is allowed by name, as a user allows their own package (the config allow-list)
        "allow_code_from: [cli_fsdp2_fit]\n"
        "trainer:\n  enable_progress_bar: false\n  callbacks: [{class_path: cli_fsdp2_fit.RecordSharding}]\n")
    strategy = tmp_path / "strategy.yaml"
    strategy.write_text(strategy_yaml)
    argv = ["fit", "--config", "configs/causal_lm.yaml", "--config", str(overrides), "--config", str(strategy),
            "--args.output_dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, str(SCRIPT), *argv], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (out / "sharded.txt").read_text() == f"True {strategy_class}"  # the run was sharded
    final = load_file(str(out / "model.safetensors"))
    checkpoint = load_file(str(out / "checkpoint-3" / "model.safetensors"))
    assert final["transformer.wte.weight"].shape == checkpoint["transformer.wte.weight"].shape
    assert final.keys() == checkpoint.keys()
    for name, tensor in checkpoint.items():  # the last update's full weights, twice
        assert torch.equal(final[name], tensor), name
    assert {"training_args.bin", "config.json", "tokenizer.json"} <= set(os.listdir(out))
