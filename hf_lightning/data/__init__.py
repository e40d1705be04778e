"""Data loading with the HF Trainer's semantics."""

from hf_lightning.data.datamodule import TransformerDataModule

__all__ = ["TransformerDataModule"]
