"""Data loading with the HF Trainer's semantics (`hf_lightning.data.datamodule.TransformerDataModule`)."""
