"""HF-layout checkpoint folders.

- `io`: writing a folder atomically (`tmp-checkpoint-<n>` then rename), the HF file set, RNG files.
- `distributed`: full weights / sharded optimizer state under FSDP2, plain state dicts otherwise.
- `lightning_state`: the Lightning loop position and callback states (`lightning_state.pt`).
- `rotation`: HF 5's `save_total_limit` rule, as pure functions.
- `checks`: setup-time checks HF does not make.
- `manifest`: every file's size and checksum (`checkpoint_manifest.json`), written before the rename.
- `integrity` / `verify`: whether a folder's files are whole and match its manifest, and its step is its name's
  (resume, `load_best_model_at_end`, `hf-lightning verify`).
- `finite`: whether the weights are finite at a save (no checkpoint of NaN or inf weights).

Resuming from a folder lives in `hf_lightning/resume/`; the save itself (when, rotation, best pointer) in
`hf_lightning/callbacks/checkpoint_saver.py`.
"""
