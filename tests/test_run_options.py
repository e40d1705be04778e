"""`auto_find_batch_size`, `torch_empty_cache_steps`, `full_determinism`, `bf16_full_eval` / `fp16_full_eval`
against the real `transformers.Trainer` (the oracle), each run twice from the same weights and data.

- `auto_find_batch_size`: a real tiny GPT-2 whose forward raises `torch.OutOfMemoryError` above a batch size; both
  trainers shrink the batch the same way (x0.9, accelerate's rule), end with the same size and the same log.
- `torch_empty_cache_steps`: the cache is emptied in the same updates, as often (HF's call is spied on, not replaced).
- `full_determinism`: the process is deterministic after the trainer is built, as after HF's.
- `bf16_full_eval` / `fp16_full_eval`: `evaluate()` casts the model, HF's way, giving HF's metrics; evaluations during
  training do not (HF's `is_in_train` rule).
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
import transformers
from helpers import classification_dataset, lm_dataset, tiny_bert, tiny_gpt2
from transformers import GPT2LMHeadModel

import hf_lightning
from hf_lightning.run_options.batch_search import reduced_batch_size, should_reduce_batch_size

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


def _hf(model, tmp_path, train=None, eval_dataset=None, **kwargs) -> transformers.Trainer:
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, disable_tqdm=True,
                                          save_strategy="no", report_to="none", **kwargs)
    return transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=eval_dataset)


def _ours(model, tmp_path, train=None, eval_dataset=None, **kwargs) -> hf_lightning.Trainer:
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "ours"), save_strategy="no", report_to="none",
                                          **kwargs)
    return hf_lightning.Trainer(model=model, args=args, train_dataset=train, eval_dataset=eval_dataset,
                                lightning_kwargs=dict(LIGHTNING_KWARGS))


def _gpt2(**kwargs) -> GPT2LMHeadModel:
    """A tiny GPT-2 that HF counts label tokens for correctly (see tests/test_train_parity.gpt2_hf_counts_correctly:
    the oracle made right)."""
    model = tiny_gpt2(**kwargs)
    model.loss_type = "ForCausalLM"
    return model


def _losses(trainer) -> list[tuple]:
    return [(e["step"], round(e["loss"], 5), round(e["grad_norm"], 5)) for e in trainer.state.log_history
            if "loss" in e]


# ----- auto_find_batch_size -----
class OutOfMemoryAbove(GPT2LMHeadModel):
    """A tiny GPT-2 whose forward fails like a GPU out of memory when a batch has more than `limit` rows."""

    limit = 5

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        if input_ids is not None and input_ids.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {input_ids.shape[0]} GiB.")
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)


def _oom_model(limit: int) -> OutOfMemoryAbove:
    model = OutOfMemoryAbove(tiny_gpt2().config)
    model.load_state_dict(tiny_gpt2().state_dict())
    model.limit = limit
    model.loss_type = "ForCausalLM"  # see _gpt2
    return model


AUTO_BATCH = dict(per_device_train_batch_size=8, max_steps=4, logging_steps=1, learning_rate=1e-3, seed=3,
                  optim="adamw_torch", auto_find_batch_size=True)


def test_out_of_memory_shrinks_the_batch_and_trains_to_the_end_as_hf(tmp_path):
    data = lm_dataset(n=40)
    hf = _hf(_oom_model(5), tmp_path, data, **AUTO_BATCH)
    hf.train()
    ours = _ours(_oom_model(5), tmp_path, data, **AUTO_BATCH)
    ours.train()
    # 8 -> 7 -> 6 -> 5 (accelerate multiplies by 0.9): 5 rows fit
    assert hf._train_batch_size == hf.state.train_batch_size == 5
    assert ours._train_batch_size == ours.state.train_batch_size == 5  # HF's private size after the search too
    assert ours.state.global_step == hf.state.global_step == 4
    assert ours.args.per_device_train_batch_size == 8  # the user's arguments are given back unchanged
    assert _losses(ours) == _losses(hf) and len(_losses(hf)) == 4  # the whole run, from the start, with 5 rows


def test_no_batch_size_fits_gives_hfs_error(tmp_path):
    settings = {**AUTO_BATCH, "per_device_train_batch_size": 2}
    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero."):
        _hf(_oom_model(0), tmp_path, lm_dataset(n=8), **settings).train()
    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero."):
        _ours(_oom_model(0), tmp_path, lm_dataset(n=8), **settings).train()


def test_other_errors_and_the_rule_are_accelerates():
    from accelerate.utils.memory import should_reduce_batch_size as accelerate_rule

    errors = [torch.OutOfMemoryError("CUDA out of memory. Tried"), RuntimeError("MPS backend out of memory (x)"),
              RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"), RuntimeError("shape mismatch"),
              ValueError("CUDA out of memory."), RuntimeError("CUDA out of memory.", 2)]
    assert [should_reduce_batch_size(e) for e in errors] == [accelerate_rule(e) for e in errors] \
        == [True, True, True, False, False, False]
    assert [reduced_batch_size(b) for b in (8, 7, 2, 1)] == [7, 6, 1, 0]


def test_without_the_flag_an_out_of_memory_error_stops_training(tmp_path):
    with pytest.raises(torch.OutOfMemoryError):
        _ours(_oom_model(5), tmp_path, lm_dataset(n=16), **{**AUTO_BATCH, "auto_find_batch_size": False}).train()


# ----- torch_empty_cache_steps -----
def test_the_cache_is_emptied_in_the_same_updates_as_hf(tmp_path, monkeypatch):
    import transformers.trainer as hf_module

    import hf_lightning.module.hooks as our_module  # HF's training_step (issue 11b) empties the cache

    calls: dict[str, list[int]] = {"hf": [], "ours": []}

    def spy(name, real, step):
        def wrapped(*args, **kwargs):
            calls[name].append(step())
            return real(*args, **kwargs)
        return wrapped

    settings = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=5, logging_steps=1,
                    learning_rate=1e-3, torch_empty_cache_steps=2, optim="adamw_torch")
    data = lm_dataset(n=40)
    hf = _hf(_gpt2(), tmp_path, data, **settings)
    monkeypatch.setattr(hf_module, "clear_device_cache", spy("hf", hf_module.clear_device_cache,
                                                             lambda: hf.state.global_step))
    hf.train()
    ours = _ours(_gpt2(), tmp_path, data, **settings)
    monkeypatch.setattr(our_module, "empty_device_cache", spy("ours", our_module.empty_device_cache,
                                                              lambda: ours.lightning_trainer.global_step))
    ours.train()
    # updates 0, 2 and 4 (the updates already done), on both micro-batches of each
    assert calls["ours"] == calls["hf"] == [0, 0, 2, 2, 4, 4]
    assert _losses(ours) == _losses(hf)


def test_torch_empty_cache_steps_must_be_positive():
    with pytest.raises(ValueError, match="`torch_empty_cache_steps` must be an integer bigger than 0, got 0"):
        hf_lightning.TrainingArguments(torch_empty_cache_steps=0)


# ----- full_determinism -----
@pytest.fixture
def restore_determinism():
    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic
    env = {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING",
                                          "FLASH_ATTENTION_DETERMINISTIC", "ASCEND_LAUNCH_BLOCKING",
                                          "HCCL_DETERMINISTIC")}
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic = before[1]
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _determinism_state() -> tuple:
    return (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            os.environ.get("FLASH_ATTENTION_DETERMINISTIC"))


def test_full_determinism_sets_what_hf_sets_and_trains_as_hf(tmp_path, restore_determinism):
    settings = dict(per_device_train_batch_size=4, max_steps=3, logging_steps=1, learning_rate=1e-3,
                    full_determinism=True, seed=11, optim="adamw_torch")
    data = lm_dataset(n=24)
    torch.use_deterministic_algorithms(False)
    hf = _hf(_gpt2(dropout=0.1), tmp_path, data, **settings)
    hf_state = _determinism_state()
    hf.train()  # each trainer is built and trained in turn: both seed the global RNG when built
    torch.use_deterministic_algorithms(False)
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    ours = _ours(_gpt2(dropout=0.1), tmp_path, data, **settings)
    assert _determinism_state() == hf_state == (True, True, False, ":16:8", "1")
    ours.train()
    assert _losses(ours) == _losses(hf)


# ----- bf16_full_eval / fp16_full_eval -----
@pytest.mark.parametrize(("flag", "dtype"), [("bf16_full_eval", torch.bfloat16), ("fp16_full_eval", torch.float16)])
def test_full_eval_casts_the_model_for_evaluate_as_hf(tmp_path, flag, dtype):
    from test_eval_parity import assert_same_metrics

    train, evaluation = classification_dataset(n=16), classification_dataset(n=12, seed=1)
    model = tiny_bert()
    settings = dict(per_device_train_batch_size=4, per_device_eval_batch_size=4, max_steps=2, learning_rate=1e-3,
                    eval_strategy="steps", eval_steps=2, logging_steps=1, optim="adamw_torch", **{flag: True})
    hf = _hf(copy.deepcopy(model), tmp_path, train, evaluation, **settings)
    ours = _ours(copy.deepcopy(model), tmp_path, train, evaluation, **settings)
    hf.train()
    ours.train()
    # evaluations during training keep the training dtype (HF casts only outside training)
    assert hf.model.dtype == ours.model.dtype == torch.float32
    during = [{k: v for k, v in e.items() if k.startswith("eval_")} for t in (ours, hf) for e in t.state.log_history
              if "eval_loss" in e]
    assert_same_metrics(during[0], during[1])
    hf_metrics, our_metrics = hf.evaluate(), ours.evaluate()
    assert hf.model.dtype == ours.model.dtype == dtype  # cast in place, and it stays so (as HF)
    if dtype is torch.float16:
        # HF averages the float16 losses in a float16 numpy array (`nested_numpify` widens only bfloat16), so its
        # eval_loss is the float32 mean rounded to float16: the oracle made right is ours rounded the same way
        assert np.float16(our_metrics["eval_loss"]) == np.float16(hf_metrics["eval_loss"])
        hf_metrics = {**hf_metrics, "eval_loss": our_metrics["eval_loss"]}
    assert_same_metrics(our_metrics, hf_metrics)
    fp32_loss = during[0]["eval_loss"]
    assert our_metrics["eval_loss"] != fp32_loss  # the cast changed the numbers: the test can fail
