"""The HF argument map: every `transformers.TrainingArguments` field, marked supported / supported with a difference
/ not supported, computed from the code (our `TrainingArguments` fields and `from_transformers.py`'s ignored set).

`python -m hf_lightning.args.readme_map` prints the README table; tests/test_readme.py checks README holds exactly it.
"""

from __future__ import annotations

import dataclasses

__all__ = ["argument_map", "markdown_table"]

DIFFERENCES = {
    "bf16": "becomes Lightning `precision=\"bf16-mixed\"`; `trainer.precision` / `lightning_kwargs[\"precision\"]`"
            " wins",
    "fp16": "becomes Lightning `precision=\"16-mixed\"`; `trainer.precision` / `lightning_kwargs[\"precision\"]` wins",
    "report_to": "`tensorboard` (default; HF's is `none`), `csv`, `all`, `none` create Lightning loggers; any "
                 "Lightning logger can be given instead",
    "gradient_accumulation_steps": "the loss is token-normalised for every model (HF skips it for BERT-like models)",
    "lr_scheduler_type": "every `get_scheduler` name except `greedy`",
    "optim": "`adamw_torch`, `adamw_torch_fused`, `sgd`, `adafactor`, `adagrad`, `rmsprop` only",
    "use_cpu": "sets Lightning `accelerator=\"cpu\"`",
    "disable_tqdm": "switches Lightning's progress bar",
    "resume_from_checkpoint": "`train()` reads it when called without one (HF leaves it to the scripts); the resumed "
                              "run is exact (README \"Checkpoints and resume\")",
}
"""Supported fields that behave differently from HF, and why."""

IGNORED_REASONS = {
    "do_train": "not used by the HF Trainer either (scripts read it)",
    "do_eval": "derived from `eval_strategy`, as in HF",
    "do_predict": "not used by the HF Trainer either (scripts read it)",
    "local_rank": "Lightning launches and ranks processes",
    "ddp_backend": "Lightning strategy (`trainer.strategy`, e.g. `ddp` with `process_group_backend`)",
    "log_level": "Python logging is configured by the application",
    "log_level_replica": "Python logging is configured by the application",
    "log_on_each_node": "Lightning logs on global rank 0",
    "skip_memory_metrics": "memory metrics are not collected",
    "push_to_hub_token": "hub pushing is not supported",
    "hub_token": "hub pushing is not supported",
    "logging_dir": "loggers write under `output_dir` (`runs/`, `csv/`)",
    "accelerator_config": "no accelerate; Lightning owns devices",
    "deepspeed_plugin": "use a Lightning DeepSpeed strategy",
    "parallelism_config": "use a Lightning strategy",
    "activation_checkpointing": "HF 5 copies it into `gradient_checkpointing` (its old name), which hf_lightning reads",
}

NOT_SUPPORTED_REASONS = {
    "ddp_": "use `trainer.strategy` / `lightning_kwargs[\"strategy\"]` (a Lightning DDP strategy)",
    "fsdp": "use a Lightning FSDP strategy",
    "deepspeed": "use a Lightning DeepSpeed strategy",
    "push_to_hub": "hub pushing is not supported",
    "hub_": "hub pushing is not supported",
    "torch_compile": "not wired yet (compile the model yourself)",
    "trackio": "use a Lightning logger",
    "project": "use a Lightning logger",
    "group_by_length": "length-grouped sampling is not implemented",
    "length_column_name": "length-grouped sampling is not implemented",
    "tf32": "set `torch.backends` flags yourself",
    "half_precision_backend": "Lightning precision plugins decide",
}
DEFAULT_NOT_SUPPORTED = "not implemented; setting it on a `transformers.TrainingArguments` raises an error"


def _reason(name: str) -> str:
    for prefix, reason in NOT_SUPPORTED_REASONS.items():
        if name.startswith(prefix):
            return reason
    return DEFAULT_NOT_SUPPORTED


def argument_map() -> list[tuple[str, str, str]]:
    """`(field, status, note)` for every init field of `transformers.TrainingArguments`, in HF's order."""
    import transformers

    from hf_lightning.args import TrainingArguments
    from hf_lightning.args.from_transformers import _IGNORED

    ours = {f.name for f in dataclasses.fields(TrainingArguments)}
    rows = []
    for f in dataclasses.fields(transformers.TrainingArguments):
        if not f.init:
            continue
        if f.name in ours:
            status = "supported with a difference" if f.name in DIFFERENCES else "supported"
            rows.append((f.name, status, DIFFERENCES.get(f.name, "")))
        elif f.name in _IGNORED:
            rows.append((f.name, "supported with a difference", "accepted and ignored: " + IGNORED_REASONS.get(
                f.name, "no meaning here")))
        else:
            rows.append((f.name, "not supported", _reason(f.name)))
    return rows


def markdown_table() -> str:
    """The README table."""
    lines = ["| argument | status | note |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {status} | {note} |" for name, status, note in argument_map()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
