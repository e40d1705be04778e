"""The checkpoint lifecycle: HF-layout `checkpoint-<n>` folders written, rotated, found, verified and restored.

`lifecycle.Checkpoints` is the one object a run holds: `begin_run` / `restore` / `save` / `finish` / `end_run`; when
and what to save comes from the plan (`plan.SavePolicy`, `plan.BestRule`), never from the arguments. Its parts, in the
order a run meets them:

- `run_lock`: one run per `output_dir` (the lock file); `checks`: setup-time checks HF does not make.
- `find`: which folder to resume from (`resume_from_checkpoint=True` -> the latest `checkpoint-<n>`), and the
  output-directory rule (the checkpoints a run will replace, named once, as HF replaces them); `same_run`,
  `changed_settings`: what the resumed folder says about the run that wrote it.
- `restore`: a folder restored into a starting Lightning run (weights, optimizer, scheduler, trainer state, RNG);
  `position`: the epoch and window the resumed run starts at; `csv_logs`: the CSV logger's rows past the step.
- `write`: the save itself (`CheckpointSaver`: the folder, rotation, best pointer; `ModelFilesWriter`, the seam for a
  facade's own model files); `io` / `content` / `background`: the
  folder written atomically (`tmp-checkpoint-<n>` then rename), in the foreground or on a writer thread;
  `weight_files`, `adapters`, `distributed`, `sharded`: what the weights are under each strategy; `lightning_state`,
  `stream_position`: the Lightning loop position and a stream's position; `manifest`: every file's size and checksum,
  written before the rename; `finite`: no checkpoint of NaN or inf weights; `permissions`: the weight files' modes.
- `rotate`: HF 5's `save_total_limit` rule, as pure functions; `layout`: which folders are checkpoints, deletion by
  rename, leftovers of killed runs.
- `best`: `metric_for_best_model` / `load_best_model_at_end`; `integrity` / `verify`: whether a folder's files are
  whole and match its manifest (resume, best model, `hf-lightning verify`); `final_model`: `save_model`.
"""
