"""Lightning callbacks reproducing the HF Trainer's flow (`hf_lightning.callbacks.flow.HFTrainerFlow`)."""
