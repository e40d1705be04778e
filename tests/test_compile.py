"""`torch_compile*` and models the user compiled, against `transformers.Trainer` (the oracle).

Most runs use the `aot_eager` backend (dynamo + AOT autograd, no C compiler, seconds); the default `inductor`
backend is run once, in the slow tier (it compiles C++ kernels: a minute or two on a small CPU). With compiling, the
losses are HF's compiled run's and our eager run's (to float rounding); `trainer.model` stays the plain model, so
checkpoints have no `_orig_mod.` keys; a resumed compiled run is bit-identical to the uninterrupted one.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file

import hf_lightning
from helpers import assert_logs_close, lm_dataset, stable_log, tiny_gpt2

ARGS = dict(
    per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=1e-2,
    logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, seed=7,
    report_to="none", disable_tqdm=True, optim="adamw_torch",
)
LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


def gpt2(seed: int = 0, dropout: float = 0.1):
    model = tiny_gpt2(dropout=dropout, seed=seed)
    model.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    return model


def train_data():
    # an extra text column: `remove_unused_columns` must drop it and keep the model's inputs
    data = lm_dataset(n=20)
    return data.add_column("text", [f"row {i}" for i in range(len(data))])


def run_ours(output_dir, model=None, resume=None, **overrides):
    trainer = hf_lightning.Trainer(
        model=model if model is not None else gpt2(),
        args=hf_lightning.TrainingArguments(output_dir=str(output_dir), **{**ARGS, **overrides}),
        train_dataset=train_data(), eval_dataset=lm_dataset(n=6, seed=1), lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("compile")
    compiled = run_ours(root / "compiled", torch_compile=True, torch_compile_backend="aot_eager")
    eager = run_ours(root / "eager")
    return root, compiled, eager


def test_compiled_training_matches_eager_and_hfs_compiled_run(runs, tmp_path, one_thread):
    root, compiled, eager = runs
    assert_logs_close(stable_log(compiled), stable_log(eager))
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, torch_compile=True,
                                             torch_compile_backend="aot_eager", remove_unused_columns=True, **ARGS)
    hf = transformers.Trainer(model=gpt2(), args=hf_args, train_dataset=train_data(),
                              eval_dataset=lm_dataset(n=6, seed=1))
    hf.train()
    assert_logs_close(stable_log(compiled), stable_log(hf))


def test_the_model_stays_plain_and_checkpoints_have_its_keys(runs):
    root, compiled, _ = runs
    assert isinstance(compiled.model, transformers.GPT2LMHeadModel)  # HF's `Trainer.model`: the user's model
    assert compiled.module.model_wrapped is not compiled.model  # the steps called the compiled wrapper
    keys = set(load_file(str(root / "compiled" / "checkpoint-4" / "model.safetensors")))
    assert keys == set(load_file(str(root / "eager" / "checkpoint-4" / "model.safetensors")))
    assert not any("_orig_mod" in key for key in keys)


def test_resuming_a_compiled_run_is_exact(runs, tmp_path, one_thread):
    root, compiled, _ = runs
    source = tmp_path / "checkpoint-2"
    shutil.copytree(root / "compiled" / "checkpoint-2", source)
    resumed = run_ours(tmp_path / "resumed", model=gpt2(seed=99), resume=str(source), torch_compile=True,
                       torch_compile_backend="aot_eager")
    assert stable_log(resumed, 2) == stable_log(compiled, 2)
    for (name, p), (_, q) in zip(resumed.model.named_parameters(), compiled.model.named_parameters()):
        assert torch.equal(p, q), name


def test_a_model_the_user_compiled_trains_saves_resumes_and_evaluates(runs, tmp_path, one_thread):
    """HF inspects the compiled wrapper's `forward(*args, **kwargs)` and drops every input column ("No columns in the
    dataset match"): HF is wrong there; we inspect the model inside (README "Compiling the model")."""
    root, _, eager = runs
    hf = transformers.Trainer(model=torch.compile(gpt2(), backend="aot_eager"),
                              args=transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True,
                                                                  **ARGS),
                              train_dataset=train_data(), eval_dataset=lm_dataset(n=6, seed=1))
    with pytest.raises(ValueError, match="No columns in the dataset match"):
        hf.train()

    user_compiled = torch.compile(gpt2(), backend="aot_eager")
    ours = run_ours(tmp_path / "ours", model=user_compiled)
    assert ours.module.model_wrapped is user_compiled and ours.module.model is user_compiled._orig_mod
    assert_logs_close(stable_log(ours), stable_log(eager))
    keys = set(load_file(str(tmp_path / "ours" / "checkpoint-4" / "model.safetensors")))
    assert keys and not any("_orig_mod" in key for key in keys)
    ours.save_model(str(tmp_path / "final"))
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "final"))
    for (name, p), (_, q) in zip(reloaded.named_parameters(), user_compiled._orig_mod.named_parameters()):
        assert torch.equal(p, q), name

    source = tmp_path / "source" / "checkpoint-2"
    shutil.copytree(tmp_path / "ours" / "checkpoint-2", source)
    resumed = run_ours(tmp_path / "resumed", model=torch.compile(gpt2(seed=99), backend="aot_eager"),
                       resume=str(source))
    assert stable_log(resumed, 2) == stable_log(ours, 2)
    assert ours.evaluate()["eval_loss"] == pytest.approx(eager.evaluate()["eval_loss"], rel=1e-5)


def test_compile_arguments_follow_hfs_rules(tmp_path):
    from hf_lightning.run_options.torch_compile import compile_kwargs

    args = hf_lightning.TrainingArguments(torch_compile_mode="max-autotune")
    assert args.torch_compile and args.torch_compile_backend == "inductor"  # as HF (TA:1620-1629)
    assert compile_kwargs(args) == {"backend": "inductor", "mode": "max-autotune"}
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), torch_compile=True)
    converted = hf_lightning.Trainer(model=gpt2(), args=hf).args
    assert converted.torch_compile and converted.torch_compile_backend == "inductor"
    assert compile_kwargs(hf_lightning.TrainingArguments(torch_compile=True)) == {"backend": "inductor"}
    with pytest.raises(ValueError, match="`torch_compile_backend`='nope' cannot compile: .*Available backends: .*"
                                         "inductor"):
        hf_lightning.Trainer(model=gpt2(), args=hf_lightning.TrainingArguments(output_dir=str(tmp_path),
                                                                               torch_compile_backend="nope"))


def test_the_default_inductor_backend_trains_like_eager(tmp_path, one_thread):
    """Slow tier: inductor compiles C++ kernels with the system compiler (gcc). Without dropout: inductor draws
    its own random numbers for dropout (not eager's), in HF's compiled runs too."""
    compiled = run_ours(tmp_path / "inductor", model=gpt2(dropout=0.0), torch_compile=True, max_steps=4)
    reference = run_ours(tmp_path / "eager", model=gpt2(dropout=0.0), max_steps=4)
    assert_logs_close(stable_log(compiled), stable_log(reference))
    assert compiled.module.model_wrapped is not compiled.model
