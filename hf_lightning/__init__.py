"""hf_lightning: the Hugging Face Trainer's behaviour on PyTorch Lightning.

Lightning-native pieces (`TransformerModule`, `TransformerDataModule`, `HFTrainerFlow`, `HFEarlyStopping`), drop-in
facades (`Trainer`, `TrainingArguments`, and the `Seq2Seq*` variants that evaluate by generation) with the
`transformers` signatures; `use_as_transformers_trainer()` makes `transformers.Trainer` itself hf_lightning's, for
library trainers built on it (TRL, sentence-transformers).

Names are imported on first access (PEP 562), so `hf-lightning --help` and `hf_lightning.args` do not load torch
and Lightning before they are needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "HFEarlyStopping": "hf_lightning.callbacks.early_stopping",
    "HFTrainerFlow": "hf_lightning.flow.flow",
    "Seq2SeqTrainer": "hf_lightning.seq2seq.trainer",
    "Seq2SeqTrainingArguments": "hf_lightning.seq2seq.args",
    "Seq2SeqTransformerModule": "hf_lightning.seq2seq.module",
    "Trainer": "hf_lightning.trainer.facade",
    "TrainingPreempted": "hf_lightning.flow.interruption",
    "TrainingArguments": "hf_lightning.args",
    "TransformerDataModule": "hf_lightning.data.datamodule",
    "TransformerModule": "hf_lightning.module.module",
    "restore_transformers_trainer": "hf_lightning.trainer.as_transformers",
    "use_as_transformers_trainer": "hf_lightning.trainer.as_transformers",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from hf_lightning.args import TrainingArguments
    from hf_lightning.callbacks.early_stopping import HFEarlyStopping
    from hf_lightning.data.datamodule import TransformerDataModule
    from hf_lightning.flow.flow import HFTrainerFlow
    from hf_lightning.flow.interruption import TrainingPreempted
    from hf_lightning.module.module import TransformerModule
    from hf_lightning.seq2seq.args import Seq2SeqTrainingArguments
    from hf_lightning.seq2seq.module import Seq2SeqTransformerModule
    from hf_lightning.seq2seq.trainer import Seq2SeqTrainer
    from hf_lightning.trainer.as_transformers import restore_transformers_trainer, use_as_transformers_trainer
    from hf_lightning.trainer.facade import Trainer


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hf_lightning' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
