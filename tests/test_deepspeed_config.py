"""HF's `"auto"` values of a DeepSpeed config: ours (`args/deepspeed_config.py`) against transformers' own
`HfTrainerDeepSpeedConfig` (the oracle; it needs the `deepspeed` package, which installs without CUDA)."""

from __future__ import annotations

import copy
import json

import pytest
import transformers
from transformers import GPT2Config

from hf_lightning import TrainingArguments
from hf_lightning.args.deepspeed_config import (
    DeepSpeedFill,
    fill_finalize_stage,
    fill_process_stage,
    for_lightning,
    mismatch_error,
)

AUTO_Z3 = {
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                       "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"},
}
AUTO_Z2_NO_OPTIMIZER = {
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
}
AUTO_OPTIMIZER_ONLY = {  # DeepSpeed's optimizer, HF's scheduler (the usual ZeRO config)
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
}
AUTO_SCHEDULER_ONLY = {  # HF's optimizer, DeepSpeed's scheduler
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                  "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"},
}
FIXED_VALUES = {  # numbers instead of "auto": they must equal the Trainer's
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3, "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 7}},
    "zero_optimization": {"stage": 1},
}
SETTINGS = [
    dict(per_device_train_batch_size=4, gradient_accumulation_steps=2),
    dict(per_device_train_batch_size=3, gradient_accumulation_steps=1, learning_rate=1e-3, adam_beta2=0.95,
         weight_decay=0.1, max_grad_norm=0.5, bf16=True, warmup_steps=0.1),
    dict(per_device_train_batch_size=4, gradient_accumulation_steps=3, learning_rate=1e-3, adam_beta2=0.95,
         weight_decay=0.1, max_grad_norm=0.5, warmup_steps=7),
    dict(per_device_train_batch_size=4, gradient_accumulation_steps=3, fp16_full_eval=True, auto_find_batch_size=True),
]


@pytest.fixture
def hf_deepspeed_config():
    """transformers' class; the weak reference it registers globally is cleared after the test (as HF's tests do),
    or `from_pretrained` in later tests would believe ZeRO-3 is on."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    yield HfTrainerDeepSpeedConfig
    unset_hf_deepspeed_config()


def _hf_args(settings: dict) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(output_dir="unused", report_to="none", use_cpu=True, **settings)


def _hf_filled(oracle, config: dict, settings: dict, world_size: int, steps: int) -> tuple[dict | None, str | None]:
    hf = oracle(copy.deepcopy(config))
    args = _hf_args(settings)
    # HF reads the world size from the process layout; a 2-process run without processes: patch what it reads
    args_world = type(args).world_size
    type(args).world_size = property(lambda self: world_size)
    try:
        hf.trainer_config_process(args, auto_find_batch_size=args.auto_find_batch_size)
        model = type("M", (), {"config": GPT2Config(n_embd=48)})()
        hf.trainer_config_finalize(args, model, steps)
    except ValueError as err:
        return None, str(err)
    finally:
        type(args).world_size = args_world
    return hf.config, None


def _ours(config: dict, settings: dict, world_size: int, steps: int) -> tuple[dict | None, str | None]:
    args = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True, **settings)
    filled, mismatches = fill_process_stage(config, DeepSpeedFill.from_args(args, world_size))
    filled, more = fill_finalize_stage(filled, GPT2Config(n_embd=48), steps, args.get_warmup_steps(steps))
    if mismatches or more:
        return None, mismatch_error(mismatches + more)
    return filled, None


@pytest.mark.parametrize("config", [AUTO_Z3, AUTO_Z2_NO_OPTIMIZER, AUTO_OPTIMIZER_ONLY, AUTO_SCHEDULER_ONLY, FIXED_VALUES],
                         ids=["auto-z3", "auto-z2", "optimizer-only", "scheduler-only", "fixed"])
@pytest.mark.parametrize("settings", SETTINGS, ids=["defaults", "bf16", "matching", "full-eval-autofind"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_filled_config_and_mismatches_equal_hf(hf_deepspeed_config, config, settings, world_size):
    original = copy.deepcopy(config)
    expected = _hf_filled(hf_deepspeed_config, config, settings, world_size, steps=100)
    assert _ours(config, settings, world_size, steps=100) == expected
    assert config == original  # the user's dict is never filled in place
    if config is FIXED_VALUES:  # the oracle agrees with itself on which settings match: the test can fail
        assert (expected[1] is None) == (settings is SETTINGS[2])


def test_a_model_without_hidden_size_gets_hf_error_for_bucket_autos():
    with pytest.raises(ValueError, match="neither `hidden_size` nor `hidden_sizes`"):
        fill_finalize_stage(AUTO_Z3, object(), 10, 0)


def test_for_lightning_drops_what_lightning_sets_and_allows_hf_optimizer():
    filled = {"gradient_accumulation_steps": 2, "train_batch_size": 8, "zero_optimization": {"stage": 2}}
    out = for_lightning(filled)
    assert out == {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
    assert "zero_allow_untested_optimizer" not in for_lightning({"optimizer": {"type": "AdamW"}})
    # HF's optimizer under DeepSpeed's scheduler: HF sets the flag too (no `optimizer` section)
    assert for_lightning({"scheduler": {"type": "WarmupLR"}})["zero_allow_untested_optimizer"] is True


def test_a_json_file_is_read(tmp_path):
    from hf_lightning.args.parallel import load_json_config

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(AUTO_Z3))
    assert load_json_config(str(path), "deepspeed") == AUTO_Z3
    with pytest.raises(FileNotFoundError, match="`deepspeed`='nope.json'"):
        load_json_config("nope.json", "deepspeed")
