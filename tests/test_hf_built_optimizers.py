"""`optim` names whose optimizer HF's own handler builds (bitsandbytes, torchao, torchdistx, GaLore, ...): accepted
with HF's meaning, HF's error for a missing package when the `Trainer` is built, and the names that need HF's loop
(LOMO, schedule-free, layer-wise) refused at construction with the reason. The oracle is `transformers.Trainer`."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import transformers
from test_hf_trainer_on_our_args import _model as _gpt2
from test_hf_trainer_on_our_args import _Rows

import hf_lightning


def _model() -> transformers.PreTrainedModel:
    model = _gpt2()
    # HF's oracle made right: GPT2LMHeadModel's loss_type is None, so HF counts the never-predicted label position 0
    # in `num_items_in_batch` (tests/test_train_parity.py `gpt2_hf_counts_correctly`); the attribute fixes HF's count
    model.loss_type = "ForCausalLM"
    return model


class _AnyPrecisionAdamW(torch.optim.AdamW):
    """A stand-in for torchdistx's optimizer (torchdistx has no torch 2 build): AdamW that records the keywords only
    torchdistx's takes, as HF's handler passes them."""

    received: list[dict] = []

    def __init__(self, params, *, use_kahan_summation, momentum_dtype, variance_dtype, compensation_buffer_dtype,
                 **adamw) -> None:
        _AnyPrecisionAdamW.received.append(dict(use_kahan_summation=use_kahan_summation,
                                                momentum_dtype=momentum_dtype, variance_dtype=variance_dtype,
                                                compensation_buffer_dtype=compensation_buffer_dtype, **adamw))
        super().__init__(params, **adamw)


@pytest.fixture
def torchdistx(monkeypatch):
    package, optimizers = types.ModuleType("torchdistx"), types.ModuleType("torchdistx.optimizers")
    optimizers.AnyPrecisionAdamW = _AnyPrecisionAdamW
    package.optimizers = optimizers
    monkeypatch.setitem(sys.modules, "torchdistx", package)
    monkeypatch.setitem(sys.modules, "torchdistx.optimizers", optimizers)
    _AnyPrecisionAdamW.received.clear()
    return _AnyPrecisionAdamW.received


def test_an_optimizer_hfs_handler_builds_trains_as_hf(tmp_path, torchdistx):
    settings = dict(max_steps=3, per_device_train_batch_size=2, report_to="none", use_cpu=True, logging_steps=1,
                    save_strategy="no", optim="adamw_anyprecision", learning_rate=1e-2, weight_decay=0.1,
                    optim_args="use_kahan_summation=True,momentum_dtype=float64", disable_tqdm=True)
    runs = {}
    for name, args_cls, trainer_cls in (("hf", transformers.TrainingArguments, transformers.Trainer),
                                        ("ours", hf_lightning.TrainingArguments, hf_lightning.Trainer)):
        trainer = trainer_cls(model=_model(), args=args_cls(output_dir=str(tmp_path / name), **settings),
                              train_dataset=_Rows())
        trainer.train()
        runs[name] = (trainer.optimizer, [e["loss"] for e in trainer.state.log_history if "loss" in e],
                      {k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    (hf_optimizer, hf_losses, hf_weights), (optimizer, losses, weights) = runs["hf"], runs["ours"]
    hf_optimizer = hf_optimizer.optimizer  # accelerate's wrapper
    assert type(optimizer) is type(hf_optimizer) is _AnyPrecisionAdamW
    assert len(torchdistx) == 2 and torchdistx[0] == torchdistx[1] and torchdistx[0]["use_kahan_summation"] == 1
    assert torchdistx[0]["momentum_dtype"] is torch.float64 and torchdistx[0]["lr"] == 1e-2
    assert [g["weight_decay"] for g in optimizer.param_groups] == [g["weight_decay"] for g in hf_optimizer.param_groups]
    assert len(losses) == 3 and losses == pytest.approx(hf_losses, rel=1e-6)
    for key, value in hf_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-6)


def test_a_missing_package_is_hfs_error_when_the_trainer_is_built(tmp_path):
    # bitsandbytes is not installed here: HF raises when it creates the optimizer, ours before training
    name = "paged_adamw_8bit"
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), optim=name, report_to="none", use_cpu=True)
    assert args.optim == name and f"{args.optim}" == "OptimizerNames.PAGED_ADAMW_8BIT"
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), optim=name, report_to="none", use_cpu=True)
    with pytest.raises(ImportError) as theirs:
        transformers.Trainer.get_optimizer_cls_and_kwargs(hf)
    with pytest.raises(ImportError) as ours:
        hf_lightning.Trainer(model=_model(), args=args, train_dataset=_Rows())
    assert str(ours.value) == str(theirs.value) and "bitsandbytes" in str(ours.value)
    # a user's own optimizer makes the name irrelevant, as in HF
    model = _model()
    hf_lightning.Trainer(model=model, args=args, train_dataset=_Rows(),
                         optimizers=(torch.optim.SGD(model.parameters(), lr=0.1), None))


@pytest.mark.parametrize("name", ["lomo", "schedule_free_adamw", "galore_adamw_layerwise"])
def test_optimizers_that_need_hfs_loop_are_refused_with_the_reason(tmp_path, name):
    with pytest.raises(ValueError, match=rf"`optim`='{name}' is not supported by hf_lightning: .* pass your optimizer "
                                         r"in `optimizers=\(optimizer, None\)`"):
        hf_lightning.TrainingArguments(output_dir=str(tmp_path), optim=name)
