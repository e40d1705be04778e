"""HF's strategy arguments as Lightning strategies, without starting processes.

- `fsdp` / `fsdp_config` read as transformers reads them: our `FSDPSettings` against HF's own
  `TrainingArguments.fsdp_plugin_args` (the oracle) over HF's option strings and config keys, errors included.
- which Lightning strategy each setting builds, with which options; HF's DDP defaults (`find_unused_parameters`
  follows activation checkpointing) on the DDP strategy Lightning chooses for several devices; an explicit strategy
  wins with a warning naming the HF fields it replaces.
The 2-process runs (FSDP2, DDP, checkpoints and resume) are in tests/test_ddp.py, tests/test_checkpoint_processes.py
and tests/test_final_save.py; FSDP1 and DeepSpeed need CUDA (tests/test_gpu.py).
"""

from __future__ import annotations

import copy
import json
import warnings
from datetime import timedelta

import pytest
import transformers
from helpers import tiny_gpt2
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy

from hf_lightning import TrainingArguments
from hf_lightning.args.parallel import FSDPSettings, fsdp_settings
from hf_lightning.args.to_lightning import lightning_trainer_kwargs
from hf_lightning.trainer.lightning_trainer import build_flow, build_lightning_trainer
from hf_lightning.parallel.strategies import HFDeepSpeedStrategy, HFFSDP2Strategy, build_strategy, strategy_request

FSDP_CASES = [
    ("full_shard auto_wrap", None),
    ("shard_grad_op", {"fsdp_transformer_layer_cls_to_wrap": "GPT2Block"}),
    ("full_shard offload auto_wrap", {"activation_checkpointing": "true", "cpu_ram_efficient_loading": True}),
    (True, {"version": 2, "reshard_after_forward": "false", "auto_wrap_policy": "SIZE_BASED_WRAP",
            "min_num_params": 1000}),
    (True, {"fsdp_version": 2, "auto_wrap_policy": "NO_WRAP", "state_dict_type": "SHARDED_STATE_DICT"}),
    ("hybrid_shard auto_wrap", {"version": 1, "backward_prefetch": "backward_pre", "forward_prefetch": True,
                                "use_orig_params": "false", "limit_all_gathers": True}),
    ("no_shard", {"version": 1, "sync_module_states": False}),
    ("hybrid_shard", None),  # FSDP1-only option with FSDP2: HF refuses
    ("full_shard magic", None),  # unknown option: HF refuses
    (True, {"auto_wrap_policy": "EVERYTHING"}),  # HF refuses
]


def _hf_plugin_args(fsdp, config) -> dict | str:
    try:
        args = transformers.TrainingArguments(output_dir="unused", fsdp=fsdp, fsdp_config=copy.deepcopy(config),
                                              use_cpu=True, report_to="none")  # HF edits the dict it is given
    except ValueError as err:
        return f"error: {err}"
    return args.fsdp_plugin_args


def _as_plugin_args(settings: FSDPSettings, config: dict | None) -> dict:
    """Our settings in the shape of HF's `fsdp_plugin_args` (the keys HF sets only in some cases, in those cases)."""
    given = {k.removeprefix("fsdp_") for k in (config or {})}
    out: dict = {"fsdp_version": settings.version, "auto_wrap_policy": settings.auto_wrap_policy,
                 "cpu_ram_efficient_loading": settings.cpu_ram_efficient_loading,
                 "state_dict_type": settings.state_dict_type, "reshard_after_forward": settings.reshard_after_forward}
    if settings.cpu_offload:
        out["cpu_offload"] = True
    if settings.auto_wrap_policy == "SIZE_BASED_WRAP" and settings.min_num_params > 0:
        out["min_num_params"] = settings.min_num_params
    elif settings.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" and settings.layer_classes is not None:
        out["transformer_cls_names_to_wrap"] = ",".join(settings.layer_classes)
    if "activation_checkpointing" in given:
        out["activation_checkpointing"] = settings.activation_checkpointing
    if settings.version == 1:
        out.update(forward_prefetch=settings.forward_prefetch, backward_prefetch=settings.backward_prefetch,
                   use_orig_params=settings.use_orig_params, sync_module_states=settings.sync_module_states)
        if settings.limit_all_gathers is not None:
            out["limit_all_gathers"] = settings.limit_all_gathers
    return out


@pytest.mark.parametrize(("fsdp", "config"), FSDP_CASES)
def test_fsdp_settings_equal_hfs_plugin_arguments(fsdp, config):
    expected = _hf_plugin_args(fsdp, config)
    try:
        ours: dict | str = _as_plugin_args(fsdp_settings(fsdp, config), config)
    except ValueError as err:
        ours = f"error: {err}"
    if isinstance(expected, str):
        assert isinstance(ours, str) and "fsdp" in ours, (ours, expected)  # both refuse; ours names the argument
    else:
        assert ours == expected


def test_an_hf_training_arguments_with_fsdp_converts(tmp_path):
    """HF normalises `fsdp_config` in place (xla keys added, `fsdp_` prefixes removed): ours reads the result."""
    from hf_lightning.args.from_transformers import from_hf_training_arguments

    hf = transformers.TrainingArguments(output_dir=str(tmp_path), fsdp="full_shard auto_wrap", report_to="none",
                                        fsdp_config={"fsdp_transformer_layer_cls_to_wrap": "GPT2Block"}, use_cpu=True)
    ours = from_hf_training_arguments(hf)
    assert fsdp_settings(ours.fsdp, ours.fsdp_config) == FSDPSettings(layer_classes=("GPT2Block",))


def test_fsdp_config_from_a_json_file_and_unknown_keys(tmp_path):
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_version": 2, "reshard_after_forward": False}))
    assert fsdp_settings(True, str(path)).reshard_after_forward is False
    with pytest.raises(ValueError, match=r"unknown keys \['sharding'\]"):
        TrainingArguments(fsdp="full_shard", fsdp_config={"sharding": "full"})


def test_hfs_refusals_are_raised_at_construction():
    with pytest.raises(ValueError, match="together with --deepspeed is not possible") as info:
        TrainingArguments(fsdp="full_shard", deepspeed={"zero_optimization": {"stage": 2}}, ddp_timeout=0)
    assert "`ddp_timeout`=0" in str(info.value)  # every problem in one error
    with pytest.raises(ValueError, match="can't both be set to True"):
        TrainingArguments(fsdp="full_shard", fsdp_config={"activation_checkpointing": True},
                          activation_checkpointing=True)
    with pytest.raises(ValueError, match="isn't supported yet with DeepSpeed Zero-3"):
        strategy_request(TrainingArguments(deepspeed={"zero_optimization": {"stage": 3}}, auto_find_batch_size=True),
                         None)


def test_deepspeed_values_known_at_construction_are_checked_then():
    args = TrainingArguments(deepspeed={"train_micro_batch_size_per_gpu": 2, "gradient_clipping": "auto"})
    with pytest.raises(ValueError, match="ds train_micro_batch_size_per_gpu=2 vs hf per_device_train_batch_size=8"):
        strategy_request(args, tiny_gpt2())


def test_each_setting_builds_its_lightning_strategy():
    model = tiny_gpt2()
    fsdp2 = build_strategy(strategy_request(TrainingArguments(fsdp="shard_grad_op offload", ddp_backend="gloo",
                                                              ddp_timeout=77), model))
    assert isinstance(fsdp2, HFFSDP2Strategy)
    assert fsdp2.fsdp_settings.reshard_after_forward is False and fsdp2.fsdp_settings.cpu_offload
    assert fsdp2.process_group_backend == "gloo" and fsdp2._timeout == timedelta(seconds=77)

    fsdp1 = build_strategy(strategy_request(TrainingArguments(
        fsdp="hybrid_shard auto_wrap", fsdp_config={"version": 1, "activation_checkpointing": True}), model))
    assert isinstance(fsdp1, FSDPStrategy)
    assert fsdp1.sharding_strategy.name == "HYBRID_SHARD" and fsdp1.kwargs["use_orig_params"] is True
    policy = fsdp1.kwargs["auto_wrap_policy"]  # wraps the model's layers (`_no_split_modules`: GPT2Block)
    assert policy(model.transformer.h[0], recurse=False, nonwrapped_numel=0)
    assert not policy(model.transformer.wte, recurse=False, nonwrapped_numel=0)
    assert fsdp1._activation_checkpointing_kwargs

    deepspeed = build_strategy(strategy_request(TrainingArguments(
        deepspeed={"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": "auto"}), model))
    assert isinstance(deepspeed, HFDeepSpeedStrategy)
    # Lightning refuses its own key `gradient_accumulation_steps`; HF's optimizer is allowed under ZeRO, as HF does
    assert deepspeed.config == {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}

    assert build_strategy(strategy_request(TrainingArguments(), model)) == "auto"


def _lightning_trainer(args: TrainingArguments, model, **lightning_kwargs):
    kwargs = lightning_trainer_kwargs(args, {"accelerator": "cpu", "logger": False, **lightning_kwargs}, model)
    return build_lightning_trainer(build_flow(args, [], None), [], kwargs)


@pytest.mark.parametrize(("checkpointing", "expected"), [(False, True), (True, False)])
def test_hfs_ddp_default_on_the_ddp_strategy_lightning_chooses(tmp_path, checkpointing, expected):
    """HF: `find_unused_parameters` is True for a PreTrainedModel unless activation checkpointing is on."""
    args = TrainingArguments(output_dir=str(tmp_path), activation_checkpointing=checkpointing, ddp_bucket_cap_mb=5)
    trainer = _lightning_trainer(args, tiny_gpt2(), devices=2)
    assert type(trainer.strategy) is DDPStrategy
    assert trainer.strategy._ddp_kwargs == {"find_unused_parameters": expected, "bucket_cap_mb": 5}
    assert trainer.strategy._timeout == timedelta(seconds=1800)
    single = _lightning_trainer(args, tiny_gpt2(), devices=1)  # one process: no DDP at all, as HF
    assert isinstance(single.strategy, SingleDeviceStrategy)


def test_an_explicit_strategy_wins_with_a_warning_naming_the_hf_fields(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), ddp_find_unused_parameters=False, fsdp="full_shard")
    with pytest.warns(UserWarning, match=r"'ddp' was given.*not used: fsdp, ddp_find_unused_parameters"):
        trainer = _lightning_trainer(args, tiny_gpt2(), devices=2, strategy="ddp")
    assert type(trainer.strategy) is DDPStrategy and trainer.strategy._ddp_kwargs == {}  # Lightning's own defaults
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _lightning_trainer(TrainingArguments(output_dir=str(tmp_path)), tiny_gpt2(), devices=2, strategy="ddp")
