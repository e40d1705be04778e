"""hf_lightning: the Hugging Face Trainer's behaviour on PyTorch Lightning.

Lightning-native pieces (`TransformerModule`, `TransformerDataModule`, `HFTrainerFlow`) and a drop-in facade
(`Trainer`, `TrainingArguments`) with the `transformers.Trainer` signatures.
"""

from hf_lightning.args import TrainingArguments
from hf_lightning.callbacks.flow import HFTrainerFlow
from hf_lightning.data.datamodule import TransformerDataModule
from hf_lightning.facade import Trainer
from hf_lightning.module import TransformerModule

__version__ = "0.1.0"

__all__ = ["HFTrainerFlow", "Trainer", "TrainingArguments", "TransformerDataModule", "TransformerModule", "__version__"]
