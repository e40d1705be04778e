"""Resuming a run from an HF-layout checkpoint folder (ours or one written by `transformers.Trainer`).

- `find`: which folder to resume from (`resume_from_checkpoint=True` -> the latest `checkpoint-<n>`), whether it is
  complete, and the output-directory rule (the checkpoints a run will replace, named once, as HF replaces them).
- `load`: restoring the folder into a starting Lightning run (weights, optimizer, scheduler, trainer state, RNG).
- `position`: the epoch and window the resumed run starts at, and Lightning's loop counters set to match.
"""
