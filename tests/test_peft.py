"""PEFT / LoRA through the facade, against the real `transformers.Trainer` (the oracle).

A LoRA adapter (dropout on) on a tiny GPT-2 trains with HF's losses; checkpoints hold HF's PEFT file set; a run
resumed from our checkpoint or from HF's continues like the uninterrupted run (ours bit for bit); the best adapter is
loaded at the end; `save_model` and `PeftModel.from_pretrained` give the trained logits; rotation keeps the best.
The base weights are not in an adapter checkpoint, so a resumed run starts from the same base model with a
differently initialised adapter: only the checkpoint can carry the trained adapter.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file

import hf_lightning
from hf_lightning.checkpoint.layout import tmp_folder
from hf_lightning.checkpoint.integrity import DamagedCheckpointError, folder_problems
from hf_lightning.checkpoint.io import finalize_checkpoint
from hf_lightning.checkpoint.find import check_checkpoint
from helpers import (
    VOCAB, assert_logs_close, classification_dataset, lm_dataset, stable_log, tiny_bert, tiny_gpt2,
)

ARGS = dict(
    per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=1e-2,
    warmup_steps=2, logging_steps=1, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
    per_device_eval_batch_size=4, seed=7, report_to="none", disable_tqdm=True, optim="adamw_torch",
)
LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


def lora_gpt2(adapter_seed: int = 0):
    base = tiny_gpt2(dropout=0.1, seed=0)  # the base weights are never in an adapter checkpoint: always the same
    base.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    torch.manual_seed(adapter_seed)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["c_attn", "c_proj"],
                        task_type="CAUSAL_LM")
    return get_peft_model(base, config)


def run_hf(output_dir, resume=None, adapter_seed=0, **overrides):
    args = transformers.TrainingArguments(output_dir=str(output_dir), use_cpu=True, **{**ARGS, **overrides})
    trainer = transformers.Trainer(model=lora_gpt2(adapter_seed), args=args, train_dataset=lm_dataset(n=18),
                                   eval_dataset=lm_dataset(n=6, seed=1))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def run_ours(output_dir, resume=None, adapter_seed=0, **overrides):
    trainer = hf_lightning.Trainer(
        model=lora_gpt2(adapter_seed),
        args=hf_lightning.TrainingArguments(output_dir=str(output_dir), **{**ARGS, **overrides}),
        train_dataset=lm_dataset(n=18), eval_dataset=lm_dataset(n=6, seed=1),
        lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def assert_continues_like(resumed, reference, step: int, exact: bool) -> None:
    got, want = stable_log(resumed, step), stable_log(reference, step)
    if exact:
        assert got == want and got
    else:
        assert_logs_close(got, want)
    assert resumed.state.global_step == reference.state.global_step
    for (name, p), (_, q) in zip(resumed.model.named_parameters(), reference.model.named_parameters()):
        if exact:
            assert torch.equal(p, q), name
        else:
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-3, atol=1e-4)  # lr 1e-2 amplifies rounding


def adapter_state(model) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("peft")
    return root, run_hf(root / "hf"), run_ours(root / "ours")


def test_lora_trains_like_hf_and_writes_hfs_peft_files(uninterrupted):
    root, hf_run, our_run = uninterrupted
    assert_continues_like(our_run, hf_run, 0, exact=False)
    assert sorted(p.name for p in (root / "ours").iterdir()) == sorted(p.name for p in (root / "hf").iterdir())
    ours, theirs = ({p.name for p in (root / d / "checkpoint-4").iterdir()} for d in ("ours", "hf"))
    assert "adapter_model.safetensors" in theirs and "adapter_config.json" in theirs
    assert ours == theirs | {"lightning_state.pt", "checkpoint_manifest.json"}
    # only the adapter is trained and saved: the base weights are those of the untrained model
    saved = load_file(str(root / "ours" / "checkpoint-4" / "adapter_model.safetensors"))
    assert saved and all("lora_" in key for key in saved)
    base = tiny_gpt2(dropout=0.1, seed=0).state_dict()
    merged_free = our_run.model.get_base_model().state_dict()
    assert torch.equal(merged_free["transformer.wte.weight"], base["transformer.wte.weight"])


@pytest.mark.parametrize("step", [2, 6])  # mid-epoch (5 updates per epoch), mid-epoch of epoch 2
def test_resume_from_our_peft_checkpoint_is_exact(uninterrupted, tmp_path, step, one_thread):
    root, _, our_run = uninterrupted
    source = tmp_path / "source" / f"checkpoint-{step}"
    shutil.copytree(root / "ours" / f"checkpoint-{step}", source)
    resumed = run_ours(tmp_path / "resumed", resume=str(source), adapter_seed=99)
    assert_continues_like(resumed, our_run, step, exact=True)


def test_peft_checkpoints_pass_the_integrity_checks_and_a_damaged_adapter_is_named(uninterrupted, tmp_path):
    """A PEFT checkpoint holds `adapter_model.safetensors` instead of `model.safetensors`: the save renames such a
    folder (and no folder without weights), the resume check accepts it, and a truncated adapter file, at the top or
    in a named adapter's sub-folder, is named with the previous complete checkpoint (`weight_files.py`)."""
    root, _, _ = uninterrupted
    out = tmp_path / "out"
    for step in (2, 4):
        shutil.copytree(root / "ours" / f"checkpoint-{step}", out / f"checkpoint-{step}")
    assert check_checkpoint(out / "checkpoint-4").weights == out / "checkpoint-4" / "adapter_model.safetensors"

    shutil.copytree(out / "checkpoint-4", tmp_folder(out, 6, "run"))
    assert finalize_checkpoint(out, 6, "run") == out / "checkpoint-6"
    shutil.copytree(out / "checkpoint-4", tmp_folder(out, 8, "run"))
    (tmp_folder(out, 8, "run") / "adapter_model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no .*model.safetensors"):
        finalize_checkpoint(out, 8, "run")

    adapter = out / "checkpoint-4" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:-16])
    with pytest.raises(DamagedCheckpointError, match=r"adapter_model.safetensors is damaged .*checkpoint-2'"):
        check_checkpoint(out / "checkpoint-4")

    named = out / "checkpoint-2" / "mine"  # peft's folder for an adapter not named "default"
    named.mkdir()
    (named / "adapter_model.safetensors").write_bytes(adapter.read_bytes())
    assert set(folder_problems(out / "checkpoint-2")) == {"mine/adapter_model.safetensors"}
    with pytest.raises(DamagedCheckpointError, match=r"mine/adapter_model.safetensors is damaged"):
        check_checkpoint(out / "checkpoint-2")


@pytest.mark.parametrize("writer, resumer", [("ours", "hf"), ("hf", "ours")])
def test_each_trainer_resumes_from_the_others_peft_checkpoint(uninterrupted, tmp_path, writer, resumer, one_thread):
    root, hf_run, our_run = uninterrupted
    source = tmp_path / writer / "checkpoint-4"
    shutil.copytree(root / writer / "checkpoint-4", source)
    resumed = (run_hf if resumer == "hf" else run_ours)(tmp_path / "resumed", resume=str(source), adapter_seed=99)
    assert_continues_like(resumed, our_run if writer == "ours" else hf_run, 4, exact=False)


def test_best_adapter_is_loaded_at_the_end_and_rotation_keeps_it(tmp_path, one_thread):
    """`load_best_model_at_end` with a PEFT model (HF loads the best adapter; ours raised after training before).
    A metric that is best early (`greater_is_better` on the loss) makes the best checkpoint an old one."""
    trainer = run_ours(tmp_path / "out", load_best_model_at_end=True, metric_for_best_model="loss",
                       greater_is_better=True, save_total_limit=1)
    best = trainer.state.best_model_checkpoint
    assert best is not None and Path(best).name == "checkpoint-2"
    assert trainer.state.global_step == 10
    saved = load_file(str(Path(best) / "adapter_model.safetensors"))
    current = adapter_state(trainer.model)
    assert saved.keys() == current.keys() and all(torch.equal(saved[k], current[k]) for k in saved)
    hf = run_hf(tmp_path / "hf", load_best_model_at_end=True, metric_for_best_model="loss", greater_is_better=True,
                save_total_limit=1)
    assert Path(hf.state.best_model_checkpoint).name == "checkpoint-2"
    # save_total_limit=1 keeps the best through training, and HF's final cleanup removes the last one
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert (tmp_path / "out" / "checkpoint-2").is_dir() and not (tmp_path / "out" / "checkpoint-10").exists()
    current_hf = adapter_state(hf.model)
    assert all(torch.allclose(current_hf[k], current[k], rtol=1e-4, atol=1e-6) for k in current)


def test_save_model_and_from_pretrained_give_the_trained_logits(uninterrupted, tmp_path):
    _, _, our_run = uninterrupted
    our_run.save_model(str(tmp_path / "final"))
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in (tmp_path / "final").iterdir()}
    assert not (tmp_path / "final" / "model.safetensors").exists()
    batch = {k: torch.tensor(v) for k, v in lm_dataset(n=3, seed=5)[:3].items() if k != "labels"}
    our_run.model.eval()
    with torch.no_grad():
        want = our_run.model(**batch).logits
        for folder in (tmp_path / "final", Path(our_run.args.output_dir) / "checkpoint-10"):
            loaded = PeftModel.from_pretrained(tiny_gpt2(dropout=0.1, seed=0), str(folder)).eval()
            torch.testing.assert_close(loaded(**batch).logits, want, rtol=0, atol=0)


def test_classification_lora_saves_its_head_and_reloads(tmp_path, one_thread):
    """SEQ_CLS adapters also train (and save) the classifier head (`modules_to_save`)."""
    torch.manual_seed(0)
    model = get_peft_model(tiny_bert(), LoraConfig(r=4, target_modules=["query", "value"], task_type="SEQ_CLS"))
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, save_steps=4,
                                          learning_rate=1e-2, report_to="none", disable_tqdm=True)
    trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=classification_dataset(n=16),
                                   lightning_kwargs=dict(LIGHTNING_KWARGS))
    trainer.train()
    saved = load_file(str(tmp_path / "out" / "checkpoint-4" / "adapter_model.safetensors"))
    assert any("classifier" in key for key in saved)
    batch = {"input_ids": torch.randint(6, VOCAB, (3, 12))}
    model.eval()
    with torch.no_grad():
        loaded = PeftModel.from_pretrained(tiny_bert(), str(tmp_path / "out" / "checkpoint-4")).eval()
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, rtol=0, atol=0)


def test_an_adapter_checkpoint_of_another_model_is_refused(uninterrupted, tmp_path):
    root, _, _ = uninterrupted
    source = str(root / "ours" / "checkpoint-4")
    plain = hf_lightning.Trainer(model=tiny_gpt2(), args=hf_lightning.TrainingArguments(
        output_dir=str(tmp_path / "plain"), max_steps=2, report_to="none", disable_tqdm=True),
        train_dataset=lm_dataset(n=8), lightning_kwargs=dict(LIGHTNING_KWARGS))
    with pytest.raises(ValueError, match="holds a PEFT adapter .* not a peft.PeftModel"):
        plain.train(resume_from_checkpoint=source)
    base = tiny_gpt2()
    other = get_peft_model(base, LoraConfig(r=8, target_modules=["c_attn"], task_type="CAUSAL_LM"))
    wider = hf_lightning.Trainer(model=other, args=hf_lightning.TrainingArguments(
        output_dir=str(tmp_path / "other"), max_steps=2, report_to="none", disable_tqdm=True),
        train_dataset=lm_dataset(n=8), lightning_kwargs=dict(LIGHTNING_KWARGS))
    with pytest.raises(ValueError, match=r"belongs to a different model: default: .*lora_A.weight: "
                                         r"checkpoint \[4, 32\] vs model \[8, 32\]"):
        wider.train(resume_from_checkpoint=source)


def test_columns_are_those_of_the_base_models_forward(tmp_path):
    """As HF (T:1179-1191): the PEFT wrapper's `forward` lacks e.g. `position_ids`, the base model's has it."""
    from hf_lightning.data.collate import find_label_names, signature_columns

    model = lora_gpt2()
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    hf = transformers.Trainer(model=model, args=hf_args)
    hf._set_signature_columns_if_needed()
    assert set(signature_columns(model, find_label_names(model))) == set(hf._signature_columns)
    assert "position_ids" in hf._signature_columns and find_label_names(model) == ["labels"]


def test_the_lightning_pieces_train_and_resume_a_peft_model(uninterrupted, tmp_path, one_thread):
    """`TransformerModule` + `TransformerDataModule` + `HFTrainerFlow` on a hand-built `lightning.Trainer`: the
    facade's numbers, and a resume from the facade's PEFT checkpoint."""
    import lightning.pytorch as pl

    from hf_lightning import HFTrainerFlow, TransformerDataModule, TransformerModule

    root, _, our_run = uninterrupted
    source = tmp_path / "checkpoint-4"
    shutil.copytree(root / "ours" / "checkpoint-4", source)
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "pieces"), **ARGS)
    flow = HFTrainerFlow(args)
    flow.resume_from_checkpoint = str(source)
    module = TransformerModule(lora_gpt2(adapter_seed=99), args)
    data = TransformerDataModule(train_dataset=lm_dataset(n=18), eval_dataset=lm_dataset(n=6, seed=1), args=args)
    pl.Trainer(callbacks=[flow], use_distributed_sampler=False, enable_checkpointing=False, num_sanity_val_steps=0,
               **LIGHTNING_KWARGS).fit(module, datamodule=data)
    assert stable_log(flow, 4) == stable_log(our_run, 4) and stable_log(flow, 4)


def test_a_named_adapter_saved_in_its_sub_folder_resumes(tmp_path, one_thread):
    """peft saves an adapter not named "default" in a sub-folder of its name; HF finds it there, so do we."""
    def named(seed: int):
        base = tiny_gpt2(seed=0)
        torch.manual_seed(seed)
        return get_peft_model(base, LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM"),
                              adapter_name="mine")

    def run(output_dir, seed, resume=None):
        trainer = hf_lightning.Trainer(
            model=named(seed), args=hf_lightning.TrainingArguments(
                output_dir=str(output_dir), max_steps=4, save_steps=2, logging_steps=1, learning_rate=1e-2,
                seed=7, report_to="none", disable_tqdm=True),
            train_dataset=lm_dataset(n=16), lightning_kwargs=dict(LIGHTNING_KWARGS))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full", seed=0)
    assert (tmp_path / "full" / "checkpoint-2" / "mine" / "adapter_model.safetensors").is_file()
    source = tmp_path / "src" / "checkpoint-2"
    shutil.copytree(tmp_path / "full" / "checkpoint-2", source)
    resumed = run(tmp_path / "resumed", seed=99, resume=str(source))
    assert stable_log(resumed, 2) == stable_log(full, 2) and stable_log(full, 2)
