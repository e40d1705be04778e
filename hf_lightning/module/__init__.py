"""`TransformerModule`: the LightningModule that trains a `PreTrainedModel` with the HF Trainer's semantics.

- `module`: one optimizer update per Lightning batch (the accumulation window, clipping, the step order).
- `hooks`: `compute_loss`, HF's per-micro-batch `training_step`, `prediction_step`'s seam; `loss`: label
  smoothing and label-token counts; `optim`: optimizer, parameter groups, scheduler.
- `evaluation`, `eval_run`, `full_eval`, `metrics`: one evaluation run: prediction steps, accumulation, gathering,
  metrics.
"""
