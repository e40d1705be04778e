"""The public surface is small and explicit; importing it stays light."""

import subprocess
import sys

import hf_lightning

EXPECTED = [
    "HFEarlyStopping", "HFTrainerFlow", "Seq2SeqTrainer", "Seq2SeqTrainingArguments", "Seq2SeqTransformerModule",
    "Trainer", "TrainingArguments", "TransformerDataModule", "TransformerModule", "__version__",
]


def test_all_is_frozen() -> None:
    assert sorted(hf_lightning.__all__) == sorted(EXPECTED)
    for name in hf_lightning.__all__:
        assert hasattr(hf_lightning, name), name


def test_import_does_not_pull_transformers_trainer() -> None:
    """`transformers.trainer` drags pandas / pyarrow in; the library never needs it."""
    code = "import sys, hf_lightning; print('transformers.trainer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_args_module_imports_without_torch() -> None:
    """`TrainingArguments` is pure Python, so the CLI can parse configs before loading torch."""
    code = "import sys, hf_lightning.args as a; a.TrainingArguments(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
