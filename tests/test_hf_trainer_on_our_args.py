"""`transformers.Trainer` itself, built on `hf_lightning.TrainingArguments` (issue 31, item 1).

Libraries and tests build HF's Trainer from arguments a user made with ours; HF's `__post_init__` normalises fields
HF's Trainer reads (`accelerator_config` becomes an `AcceleratorConfig`, `mixed_precision`, `fsdp_plugin_args`...).
The oracle: the same HF Trainer run on `transformers.TrainingArguments` with the same values.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import hf_lightning


class _Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.tensor([(i + k) % 31 + 1 for k in range(6)])
        return {"input_ids": ids, "labels": ids.clone()}


def _model() -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def _run(args_cls: type, tmp_path, name: str) -> list[dict]:
    args = args_cls(output_dir=str(tmp_path / name), max_steps=3, per_device_train_batch_size=2, report_to="none",
                    use_cpu=True, logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="no",
                    per_device_eval_batch_size=3, disable_tqdm=True)
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=_Rows(), eval_dataset=_Rows())
    trainer.train()
    return [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k}
            for entry in trainer.state.log_history]


def test_transformers_trainer_trains_on_our_arguments_as_on_its_own(tmp_path):
    ours = _run(hf_lightning.TrainingArguments, tmp_path, "ours")
    theirs = _run(transformers.TrainingArguments, tmp_path, "hf")
    assert ours == theirs
    assert any("eval_loss" in entry for entry in ours)


def test_accelerator_config_is_held_as_hf_holds_it(tmp_path):
    ours = hf_lightning.TrainingArguments(output_dir=str(tmp_path))
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path))
    assert ours.accelerator_config.to_dict() == theirs.accelerator_config.to_dict()
    assert ours.to_dict()["accelerator_config"] == theirs.to_dict()["accelerator_config"]
    path = tmp_path / "accelerator.json"
    path.write_text(json.dumps({"use_configured_state": True, "split_batches": False}))
    from_file = hf_lightning.TrainingArguments(output_dir=str(tmp_path), accelerator_config=str(path))
    assert from_file.accelerator_config.to_dict() == theirs.accelerator_config.to_dict()
    # HF's own config object, and a copy of arguments that already hold one, are accepted as HF accepts them
    hf_object = transformers.trainer_pt_utils.AcceleratorConfig(use_configured_state=True)
    held = hf_lightning.TrainingArguments(output_dir=str(tmp_path), accelerator_config=hf_object)
    assert held.accelerator_config.to_dict() == theirs.accelerator_config.to_dict()
    import dataclasses

    assert dataclasses.replace(from_file).accelerator_config == from_file.accelerator_config
    path.write_text(json.dumps({"no_such_key": 1}))
    with pytest.raises(ValueError, match=r"had unknown keys \(\['no_such_key'\]\)"):
        hf_lightning.TrainingArguments(output_dir=str(tmp_path), accelerator_config=str(path))
    with pytest.raises(NotImplementedError, match="Tried passing in a callable to `accelerator_config`"):
        hf_lightning.TrainingArguments(output_dir=str(tmp_path),
                                       accelerator_config=transformers.trainer_pt_utils.AcceleratorConfig)


def test_loaders_and_accelerator_carry_accelerates_members(tmp_path):
    """HF's `test_train_and_eval_dataloaders` reads `total_batch_size` on the loaders; TRL and HF's accelerator-config
    tests read `accelerator.dispatch_batches` (accelerate's default None)."""
    seen = {}
    for name, trainer_cls, args_cls, extra in (
            ("hf", transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True}),
            ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments, {})):
        args = args_cls(output_dir=str(tmp_path / name), per_device_train_batch_size=3, per_device_eval_batch_size=5,
                        report_to="none", **extra)
        trainer = trainer_cls(model=_model(), args=args, train_dataset=_Rows(), eval_dataset=_Rows())
        train, evaluation = trainer.get_train_dataloader(), trainer.get_eval_dataloader()
        seen[name] = (train.total_batch_size, evaluation.total_batch_size, len(train), len(evaluation),
                      trainer.get_test_dataloader(_Rows()).total_batch_size, trainer.accelerator.dispatch_batches)
    assert seen["ours"] == seen["hf"] == (3, 5, 3, 2, 5, None)


def test_accelerator_config_settings_honoured_as_hf(tmp_path):
    """`gradient_accumulation_kwargs["num_steps"]` becomes `gradient_accumulation_steps` when the Trainer is built
    (HF's rule and error); `non_blocking` is accepted (Lightning's CUDA transfers are non-blocking); a misspelt
    accumulation key is refused by name."""
    def config():  # a fresh one each time: HF's Trainer sets the dict's `num_steps` to 1 in place
        return {"gradient_accumulation_kwargs": {"num_steps": 3, "sync_with_dataloader": True}, "non_blocking": True}

    steps = {}
    for name, trainer_cls, args_cls, extra in (
            ("hf", transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True}),
            ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments, {})):
        args = args_cls(output_dir=str(tmp_path / name), report_to="none", accelerator_config=config(), **extra)
        trainer = trainer_cls(model=_model(), args=args, train_dataset=_Rows())
        steps[name] = trainer.args.gradient_accumulation_steps
        args = args_cls(output_dir=str(tmp_path / name), report_to="none", accelerator_config=config(),
                        gradient_accumulation_steps=2, **extra)
        with pytest.raises(ValueError, match="The `AcceleratorConfig`'s `num_steps` is set but"):
            trainer_cls(model=_model(), args=args, train_dataset=_Rows())
    assert steps["ours"] == steps["hf"] == 3
    # a key accelerate's `GradientAccumulationPlugin` does not have (HF: a TypeError when its Trainer is built)
    with pytest.raises(ValueError,
                       match=r"`accelerator_config`=\{'gradient_accumulation_kwargs': \{'num_step': 3\}\}"):
        hf_lightning.TrainingArguments(output_dir=str(tmp_path), accelerator_config={
            "gradient_accumulation_kwargs": {"num_step": 3}})
