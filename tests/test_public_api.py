"""The public surface is small and explicit; importing it stays light."""

import subprocess
import sys

import hf_lightning

EXPECTED = [
    "HFEarlyStopping", "HFTrainerFlow", "Seq2SeqTrainer", "Seq2SeqTrainingArguments", "Seq2SeqTransformerModule",
    "Trainer", "TrainingArguments", "TrainingPreempted", "TransformerDataModule", "TransformerModule", "__version__",
    "restore_transformers_trainer", "use_as_transformers_trainer",
]


def test_all_is_frozen() -> None:
    assert sorted(hf_lightning.__all__) == sorted(EXPECTED)
    for name in hf_lightning.__all__:
        assert hasattr(hf_lightning, name), name


_NO_HF_TRAINER = """
import pkgutil, sys, importlib
import hf_lightning
for info in pkgutil.walk_packages(hf_lightning.__path__, "hf_lightning."):
    if info.name != "hf_lightning.__main__":
        importlib.import_module(info.name)  # every module, so no import hides behind the lazy package root
assert all(getattr(hf_lightning, name) for name in hf_lightning.__all__)
import torch
from datasets import Dataset
from transformers import BertConfig, BertForSequenceClassification
model = BertForSequenceClassification(BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1,
                                                 num_attention_heads=1, intermediate_size=8))
data = Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4, "attention_mask": [[1, 1, 1]] * 4, "label": [0, 1] * 2})
args = hf_lightning.TrainingArguments(output_dir=sys.argv[1], max_steps=1, save_strategy="no", report_to="none",
                                      disable_tqdm=True, per_device_train_batch_size=2, use_cpu=True)
trainer = hf_lightning.Trainer(model, args, train_dataset=data, eval_dataset=data,
                               compute_metrics=lambda p: {"n": float(len(p.label_ids))})
trainer.train(); trainer.evaluate(); trainer.predict(data); trainer.save_model()
print([m for m in sys.modules if m == "transformers.trainer" or m.startswith("transformers.trainer.")])
"""


def test_import_does_not_pull_transformers_trainer(tmp_path) -> None:
    """`transformers.trainer` drags pandas / pyarrow in; no module of the library, nor a train / evaluate / predict /
    save, needs it."""
    out = subprocess.run([sys.executable, "-c", _NO_HF_TRAINER, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_args_module_imports_without_torch() -> None:
    """`TrainingArguments` is pure Python, so the CLI can parse configs before loading torch."""
    code = "import sys, hf_lightning.args as a; a.TrainingArguments(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "False"
