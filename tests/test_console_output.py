"""What a real run prints: the progress bar, the summary and real warnings; none of the noise of issue 16.

Real processes (the `hf-lightning` command and a facade script), their stdout and stderr captured together. The
model starts from a `from_pretrained` folder (in eval mode, like a hub model), training evaluates and saves
checkpoints, and the facade also evaluates and predicts: every source of the old noise is exercised.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOISE = [
    "💡 Tip", "litlogger",                       # Lightning's advertisement
    "in eval mode at the start of training",      # false: the model is put in training mode first
    "v_num",                                      # Lightning's logger version in the bar
    "Writing model shards",                       # transformers' save bars inside the training bar
    "LeafSpec",                                   # a deprecation Lightning 2.6 triggers under torch 2.13
    "`Trainer.fit` stopped: `max_steps=",         # every fit stops there
    "predict returned None",                      # predict_step returns None by design
    "Setting accelerator to CPU",                 # DeepSpeed's detection, imported by every save_pretrained
]


def _pretrained_bert(folder: Path) -> None:
    """A tiny BERT classifier for the bundled tokenizer, saved with `save_pretrained` (loads in eval mode)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=130, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=2, pad_token_id=0)
    BertForSequenceClassification(config).save_pretrained(folder)


def _run(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout + result.stderr


def _assert_quiet(output: str) -> None:
    found = [noise for noise in NOISE if noise in output]
    assert not found, f"noise {found} in:\n{output}"
    assert output.count("GPU available:") <= 1 and output.count("TPU available:") <= 1, output


def test_cli_fit_prints_bar_summary_and_nothing_else(tmp_path):
    _pretrained_bert(tmp_path / "pretrained")
    (tmp_path / "configs").symlink_to(REPO / "configs")
    output = _run(["-m", "hf_lightning", "fit", "--config", "configs/text_classification.yaml",
                   "--model.model_name_or_path", str(tmp_path / "pretrained"), "--args.output_dir", "out",
                   "--args.num_train_epochs", "2", "--data.max_train_samples", "128"], cwd=tmp_path)
    _assert_quiet(output)
    assert "GPU available: False, used: False" in output  # the device line itself stays, once
    assert "Training done: 8 updates (2 epochs)" in output and "Last evaluation (step 8): eval_accuracy" in output
    assert f"Model and tokenizer: {tmp_path / 'out'}" in output
    assert "eval_accuracy:" in output and "loss:" in output  # the bar shows the loss and the latest evaluation
    assert "Epoch 2/2" in output and "Epoch 0" not in output  # HF's epochs, from 1 (Lightning's bar: "Epoch 1/1")


FACADE_SCRIPT = """
import sys
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerFast
import hf_lightning
from hf_lightning.cli.quickstart import make_sentiment_dataset

tok = PreTrainedTokenizerFast(tokenizer_file="{tokenizer}", pad_token="[PAD]", unk_token="[UNK]")
data = Dataset.from_dict(make_sentiment_dataset(96, seed=0)).map(
    lambda b: tok(b["text"], truncation=True, max_length=32), batched=True, remove_columns=["text"])
model = AutoModelForSequenceClassification.from_pretrained("{pretrained}")
args = hf_lightning.TrainingArguments(output_dir="out", num_train_epochs=2, per_device_train_batch_size=16,
                                      eval_strategy="epoch", save_strategy="epoch", report_to="tensorboard")
accuracy = lambda p: {{"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}}
trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                               compute_metrics=accuracy)
trainer.train()
print("evaluate:", trainer.evaluate())
print("predict:", trainer.predict(data).predictions.shape)
"""


def test_facade_train_evaluate_predict_is_quiet(tmp_path):
    """HF-like: a bar, no summary, no noise; one device line although three `lightning.Trainer`s are built."""
    _pretrained_bert(tmp_path / "pretrained")
    script = tmp_path / "train.py"
    script.write_text(FACADE_SCRIPT.format(tokenizer=REPO / "configs/data/tokenizer.json",
                                           pretrained=tmp_path / "pretrained"))
    output = _run([str(script)], cwd=tmp_path)
    _assert_quiet(output)
    assert output.count("GPU available: False, used: False") == 1
    assert "evaluate: {'eval_loss'" in output and "predict: (96, 2)" in output
    assert "Training done" not in output  # the facade prints what transformers.Trainer prints: no summary


HAND_BUILT_SCRIPT = """
import sys
import lightning.pytorch as pl
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerFast
import hf_lightning
from hf_lightning import HFTrainerFlow, TransformerDataModule, TransformerModule
from hf_lightning.cli.quickstart import make_sentiment_dataset

tok = PreTrainedTokenizerFast(tokenizer_file="{tokenizer}", pad_token="[PAD]", unk_token="[UNK]")
data = Dataset.from_dict(make_sentiment_dataset(96, seed=0)).map(
    lambda b: tok(b["text"], truncation=True, max_length=32), batched=True, remove_columns=["text"])
args = hf_lightning.TrainingArguments(output_dir="out", num_train_epochs=2, per_device_train_batch_size=16,
                                      eval_strategy="epoch", logging_steps=2, report_to="none")
accuracy = lambda p: {{"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}}
module = TransformerModule(AutoModelForSequenceClassification.from_pretrained("{pretrained}"), args,
                           compute_metrics=accuracy)
flow = HFTrainerFlow(args, processing_class=tok, lightning_console=sys.argv[1] == "lightning")
trainer = pl.Trainer(callbacks=[flow], max_epochs=-1, num_sanity_val_steps=0, use_distributed_sampler=False,
                     enable_checkpointing=False)
trainer.fit(module, datamodule=TransformerDataModule(train_dataset=data, eval_dataset=data, args=args,
                                                     processing_class=tok))
print("callbacks:", sorted(type(cb).__name__ for cb in trainer.callbacks))
"""


def test_a_hand_built_lightning_trainer_prints_as_the_facade(tmp_path):
    """The README's `pl.Trainer(callbacks=[HFTrainerFlow(...)])`: no model-summary table (`Total FLOPs: 0`), no
    `v_num`, the latest evaluation and HF's epoch count in the bar; `lightning_console=True` keeps Lightning's."""
    _pretrained_bert(tmp_path / "pretrained")
    script = tmp_path / "train.py"
    script.write_text(HAND_BUILT_SCRIPT.format(tokenizer=REPO / "configs/data/tokenizer.json",
                                               pretrained=tmp_path / "pretrained"))
    output = _run([str(script), "hf"], cwd=tmp_path)
    _assert_quiet(output)
    assert "Total FLOPs" not in output and "Trainable params" not in output
    assert "eval_accuracy:" in output and "loss:" in output and "Epoch 2/2" in output and "Epoch 0" not in output
    assert "log_every_n_steps" not in output  # Lightning's "smaller than the logging interval" warning
    assert "HFRichProgressBar" in output and "ModelSummary" not in output.partition("callbacks:")[2]
    output = _run([str(script), "lightning"], cwd=tmp_path)
    assert "Total FLOPs" in output and "v_num" in output and "Epoch 1/1" in output


def test_epoch_description_counts_from_one():
    from hf_lightning.callbacks.progress_bar import epoch_description

    assert epoch_description(0, 3) == "Epoch 1/3" and epoch_description(2, 3) == "Epoch 3/3"
    assert epoch_description(4, -1) == "Epoch 5" and epoch_description(0, None) == "Epoch 1"


def test_filters_drop_only_what_they_name(caplog):
    """Other Lightning messages and warnings pass the filters unchanged."""
    import warnings

    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from hf_lightning.console import install_console_filters

    install_console_filters()
    with caplog.at_level(logging.INFO):
        rank_zero_info("`Trainer.fit` stopped: No training batches.")
        rank_zero_info("`Trainer.fit` stopped: `max_steps=5` reached.")
        rank_zero_info("HPU available: False, using: 0 HPUs")
        rank_zero_info("HPU available: False, using: 0 HPUs")
    messages = [record.getMessage() for record in caplog.records]
    assert "`Trainer.fit` stopped: No training batches." in messages
    assert not any("max_steps=5" in m for m in messages)
    assert messages.count("HPU available: False, using: 0 HPUs") <= 1
    with pytest.warns(UserWarning, match="a real problem"):
        warnings.warn("a real problem", UserWarning)


_DEEPSPEED_DETECTION = (
    "import sys\n"
    "if sys.argv[1] == 'filtered':\n"
    "    from hf_lightning.console import install_console_filters\n"
    "    install_console_filters()\n"
    "from deepspeed.accelerator import get_accelerator\n"
    "print('accelerator:', get_accelerator().device_name())\n"
)


@pytest.mark.parametrize("mode", ["filtered", "plain"])
def test_deepspeeds_cpu_detection_line_is_dropped_once_filters_are_installed(mode):
    """With deepspeed installed, every checkpoint's `save_pretrained` imports it (accelerate's
    `extract_model_from_parallel`): its "Setting accelerator to CPU" line broke the training bar of CPU runs. The
    plain case shows the line exists, so the filtered case can fail."""
    pytest.importorskip("deepspeed")
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}  # detection, not a choice
    result = subprocess.run([sys.executable, "-c", _DEEPSPEED_DETECTION, mode], capture_output=True, text=True,
                            env=env, cwd=REPO, check=True, timeout=300)
    output = result.stdout + result.stderr
    assert "accelerator: cpu" in output
    assert ("Setting accelerator to CPU" in output) == (mode == "plain"), output[-2000:]
