"""Lightning callbacks a user adds by hand: `HFEarlyStopping`, HF-style progress bars, the console tidy.

The HF Trainer's own flow is one callback in `hf_lightning/flow/`.
"""
