"""The Trainer methods scripts call (`log_metrics`, `save_metrics`, `save_state`, `create_model_card`, process checks,
`num_examples`, `floating_point_ops`, `push_to_hub`), each against `transformers.Trainer` doing the same."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
import transformers
from torch.utils.data import DataLoader

import hf_lightning
from helpers import classification_dataset, tiny_bert

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
COMMON = dict(per_device_train_batch_size=8, per_device_eval_batch_size=8, num_train_epochs=2, eval_strategy="epoch",
              save_strategy="epoch", logging_steps=2, learning_rate=1e-3, seed=3)


def accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
    """One small run per trainer, each followed by what run_glue does after `train()` (a script's epilogue)."""
    root = tmp_path_factory.mktemp("script_api")
    model, train, dev = tiny_bert(), classification_dataset(32), classification_dataset(16, seed=1)
    out = {}
    for name in ("hf", "ours"):
        output_dir = str(root / name / "glue-tiny")  # same folder name: the card's model name
        if name == "hf":
            # HF's default progress bar: with `disable_tqdm=True` HF's PrinterCallback pops `total_flos` out of the
            # train metrics it is handed (transformers `trainer_callback.py`: `PrinterCallback.on_log`), an HF quirk
            args = transformers.TrainingArguments(output_dir=output_dir, use_cpu=True, report_to="none", **COMMON)
            trainer = transformers.Trainer(model=copy.deepcopy(model), args=args, train_dataset=train,
                                           eval_dataset=dev, compute_metrics=accuracy)
        else:
            args = hf_lightning.TrainingArguments(output_dir=output_dir, report_to="none", **COMMON)
            trainer = hf_lightning.Trainer(model=copy.deepcopy(model), args=args, train_dataset=train,
                                           eval_dataset=dev, compute_metrics=accuracy,
                                           lightning_kwargs=dict(LIGHTNING_KWARGS))
        train_metrics = trainer.train().metrics
        train_metrics["train_samples"] = len(train)
        trainer.save_model()
        trainer.save_metrics("train", train_metrics)
        trainer.save_state()
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_samples"] = len(dev)
        trainer.save_metrics("eval", eval_metrics)
        trainer.create_model_card(language="en", tags=["text-classification"], dataset="tiny sentiment",
                                  finetuned_from="tiny-bert")
        out[name] = (trainer, output_dir, train_metrics, eval_metrics)
    return out


def _json(path):
    with open(path) as f:
        return json.load(f)


def _without_timing(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.endswith(("_runtime", "_per_second"))}


def test_results_files_are_hf_s(both_runs):
    (_, hf_dir, _, _), (_, our_dir, _, _) = both_runs["hf"], both_runs["ours"]
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        hf, ours = _json(f"{hf_dir}/{name}"), _json(f"{our_dir}/{name}")
        assert sorted(ours) == sorted(hf), name
        for key, value in _without_timing(hf).items():
            assert ours[key] == pytest.approx(value, rel=1e-4), (name, key)
        # HF's layout: indent 4, sorted keys
        text = open(f"{our_dir}/{name}").read()
        assert text == json.dumps(ours, indent=4, sort_keys=True)
    merged = _json(f"{our_dir}/all_results.json")
    assert {"train_loss", "eval_loss", "eval_accuracy", "train_samples", "eval_samples"} <= set(merged)


def test_save_state_writes_the_run_s_trainer_state(both_runs):
    (hf_trainer, hf_dir, _, _), (our_trainer, our_dir, _, _) = both_runs["hf"], both_runs["ours"]
    hf, ours = _json(f"{hf_dir}/trainer_state.json"), _json(f"{our_dir}/trainer_state.json")
    assert sorted(ours) == sorted(hf)
    assert ours["global_step"] == hf["global_step"] == 8
    assert [sorted(entry) for entry in ours["log_history"]] == [sorted(entry) for entry in hf["log_history"]]
    assert ours["best_model_checkpoint"] is None and hf["best_model_checkpoint"] is None


def test_log_metrics_prints_hf_s_block(both_runs, capsys):
    (hf_trainer, _, hf_train, _), (our_trainer, _, our_train, _) = both_runs["hf"], both_runs["ours"]
    metrics = {**hf_train, "train_runtime": 3723.456, "total_flos": 3 * 2**30 + 5, "eval_mem_gpu": 5 << 20}
    hf_trainer.log_metrics("train", metrics)
    hf_text = capsys.readouterr().out
    our_trainer.log_metrics("train", metrics)
    assert capsys.readouterr().out == hf_text
    assert "***** train metrics *****" in hf_text and "1:02:03.45" in hf_text and "3GF" in hf_text
    # HF binds the module function `metrics_format(metrics)` as a method, so `hf_trainer.metrics_format(metrics)`
    # raises a TypeError (self is passed as `metrics`): the oracle is the function itself
    from transformers.trainer_pt_utils import metrics_format

    assert our_trainer.metrics_format(metrics) == metrics_format(metrics)


def test_model_card_is_hf_s_offline(both_runs):
    (_, hf_dir, _, _), (_, our_dir, _, _) = both_runs["hf"], both_runs["ours"]
    hf_card, our_card = open(f"{hf_dir}/README.md").read(), open(f"{our_dir}/README.md").read()
    # ours adds the two frameworks that did the training
    extra = re.findall(r"^- (?:Lightning|hf_lightning) .*\n", our_card, flags=re.M)
    assert len(extra) == 2
    ours_without = re.sub(r"^- (?:Lightning|hf_lightning) .*\n", "", our_card, flags=re.M)

    def numbers_rounded(card: str) -> str:  # the table and results carry float values: compare to 3 digits
        return re.sub(r"\d+\.\d+", lambda m: f"{float(m[0]):.3f}", card)

    assert numbers_rounded(ours_without) == numbers_rounded(hf_card)
    assert "- optimizer: Use OptimizerNames.ADAMW_TORCH" in our_card  # HF's print of its enum, byte for byte
    assert "### Training results" in our_card and "| Validation Loss | Accuracy |" in our_card
    assert "base_model: tiny-bert" in our_card and "- generated_from_trainer" in our_card


def test_model_card_keeps_tags_of_an_existing_card(both_runs):
    our_trainer, our_dir, _, _ = both_runs["ours"]
    our_trainer.create_model_card(tags="second")
    card = open(f"{our_dir}/README.md").read()
    assert "- second" in card and "- text-classification" in card and "- generated_from_trainer" in card


def test_process_checks_and_helpers_match_hf(both_runs):
    (hf_trainer, _, _, _), (our_trainer, _, _, _) = both_runs["hf"], both_runs["ours"]
    assert our_trainer.is_world_process_zero() is hf_trainer.is_world_process_zero() is True
    assert our_trainer.is_local_process_zero() is hf_trainer.is_local_process_zero() is True
    data = classification_dataset(10)
    loader = DataLoader(data, batch_size=4)
    assert our_trainer.num_examples(loader) == hf_trainer.num_examples(loader) == 10
    unsized = DataLoader(torch.utils.data.TensorDataset(torch.zeros(6, 2)), batch_size=4)
    assert our_trainer.num_examples(unsized) == hf_trainer.num_examples(unsized)
    inputs = {"input_ids": torch.ones(4, 12, dtype=torch.long)}
    assert our_trainer.floating_point_ops(inputs) == hf_trainer.floating_point_ops(inputs) > 0
    assert our_trainer.floating_point_ops({"pixel_values": torch.ones(2)}) == 0


def test_training_args_bin_holds_the_arguments_object_passed(tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=2,
                                          save_steps=2, per_device_train_batch_size=4)
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(8),
                                   lightning_kwargs=dict(LIGHTNING_KWARGS))
    trainer.train()
    trainer.save_model()
    for folder in (tmp_path / "checkpoint-2", tmp_path):
        saved = torch.load(folder / "training_args.bin", weights_only=False)
        assert type(saved) is transformers.TrainingArguments
        assert saved.max_steps == 2 and saved.output_dir == str(tmp_path)


def test_output_dir_exists_after_construction_so_eval_only_scripts_can_write(tmp_path):
    output_dir = tmp_path / "eval-only"
    for trainer_class, args in (
        (transformers.Trainer, transformers.TrainingArguments(output_dir=str(output_dir / "hf"), report_to="none",
                                                              use_cpu=True)),
        (hf_lightning.Trainer, hf_lightning.TrainingArguments(output_dir=str(output_dir / "ours"), report_to="none")),
    ):
        kwargs = {"lightning_kwargs": dict(LIGHTNING_KWARGS)} if trainer_class is hf_lightning.Trainer else {}
        trainer = trainer_class(model=tiny_bert(), args=args, eval_dataset=classification_dataset(8), **kwargs)
        assert (output_dir / args.output_dir.rsplit("/", 1)[1]).is_dir()
        metrics = trainer.evaluate()
        trainer.save_metrics("eval", metrics)  # no FileNotFoundError
    hf_keys = set(_json(output_dir / "hf" / "eval_results.json")) - {"eval_model_preparation_time"}  # README
    assert set(_json(output_dir / "ours" / "eval_results.json")) == hf_keys


def test_push_to_hub_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match="push_to_hub.*no hub access"):
        hf_lightning.TrainingArguments(output_dir=str(tmp_path), push_to_hub=True)
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path), push_to_hub=True, report_to="none")
    with pytest.raises(ValueError, match="push_to_hub"):
        hf_lightning.Trainer(model=tiny_bert(), args=hf_args)
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=hf_lightning.TrainingArguments(output_dir=str(tmp_path)),
                                   lightning_kwargs=dict(LIGHTNING_KWARGS))
    with pytest.raises(NotImplementedError, match="upload_folder"):
        trainer.push_to_hub()
