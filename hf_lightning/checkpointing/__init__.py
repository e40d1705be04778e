"""HF-layout checkpoint folders.

- `io`: writing a folder atomically (`tmp-checkpoint-<n>` then rename), the HF file set, RNG files.
- `distributed`: full weights / sharded optimizer state under FSDP2, plain state dicts otherwise.
- `lightning_state`: the Lightning loop position and callback states (`lightning_state.pt`).
- `rotation`: HF 5's `save_total_limit` rule, as pure functions.
- `resume`: finding and checking the checkpoint to resume from; the output-directory rule.
- `restore`: restoring a checkpoint into a starting run (driven by `HFTrainerFlow`).
- `checks`: setup-time checks HF does not make.
"""
