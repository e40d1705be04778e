"""The HF Trainer's log / evaluate / save flow as one Lightning callback (`hf_lightning.flow.flow.HFTrainerFlow`).

- `flow`: the one Lightning callback, in the order of HF's loop (step end, log, evaluate, save, epoch end); every
  other module here is an object it holds or a helper of one. `steps`: the log / evaluate / save step and HF's
  state, control and callbacks (`HFRun`); `evaluation`: `evaluate()` / `predict()` over named datasets.
- `train_log`, `tokens_seen`, `throughput`, `peak_flops`: what a log line holds.
- `hf_callbacks`: `transformers.TrainerCallback` events; `messages`: HF's console lines.
- `preemption`, `interruption`: pre-emption signals and the stop they lead to.
- `contracts` (at the package root): what the flow needs from the module and data module.
"""
