"""Lightning callbacks reproducing the HF Trainer's flow."""

from hf_lightning.callbacks.flow import HFTrainerFlow

__all__ = ["HFTrainerFlow"]
