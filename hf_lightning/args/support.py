"""What hf_lightning does with each `transformers.TrainingArguments` field: the single table behind the checks and
the README's argument map (pure Python, the standard library only).

Every HF field exists on `hf_lightning.TrainingArguments` with HF's name, type and default, so any HF command line
parses. A field is either supported (HF's meaning), supported with a documented difference (`DIFFERENCES`), or not
supported (`UNSUPPORTED`): it keeps its default, and setting it to anything else raises one error naming every such
field and what to use instead (`unsupported_problem`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "UNSUPPORTED", "DIFFERENCES", "DEFAULT_DIFFERENCES", "OURS", "SCRIPT_ONLY", "accelerator_config_changes_nothing",
    "unsupported_problem",
]

_STRATEGY = "a Lightning strategy in `lightning_kwargs[\"strategy\"]` (CLI: `trainer.strategy`)"
_HUB = "no hub access: save with `trainer.save_model()` and upload with `huggingface_hub` yourself"
_TRACKIO = "trackio has no Lightning logger: pass a Lightning logger in `lightning_kwargs[\"logger\"]`"

UNSUPPORTED: dict[str, str] = {
    "optim_target_modules": "GaLore / APOLLO optimizers are not built; pass your own `optimizers=(optimizer, None)`",
    "tf32": "set `torch.backends.cuda.matmul.allow_tf32` (or `torch.set_float32_matmul_precision`) yourself",
    "use_liger_kernel": "HF patches the model's modules with the liger-kernel package's Triton kernels (CUDA only, "
                        "not a dependency here); apply them to the model yourself before passing it "
                        "(`liger_kernel.transformers._apply_liger_kernel_to_instance(model=model)`)",
    "liger_kernel_config": "apply the Liger kernels to the model yourself",
    "project": _TRACKIO,
    "trackio_space_id": _TRACKIO,
    "trackio_bucket_id": _TRACKIO,
    "trackio_static_space_id": _TRACKIO,
    "save_on_each_node": "checkpoints are written by global rank 0 (use a shared file system)",
    "push_to_hub": _HUB,
    "hub_token": _HUB,
    "hub_private_repo": _HUB,
    "hub_model_id": _HUB,
    "hub_always_push": _HUB,
    "hub_revision": _HUB,
    "accelerator_config": "no accelerate: Lightning owns devices and loaders (accepted, with accelerate's meaning: "
                          "`split_batches`, `even_batches`, `use_configured_state`, `non_blocking` (Lightning's CUDA "
                          "transfers are non-blocking), `gradient_accumulation_kwargs` (`num_steps` HF's rule, "
                          "`sync_each_batch`; `sync_with_dataloader`, `adjust_scheduler` change nothing in HF's "
                          "Trainer either), `use_seedable_sampler` (False: torch's "
                          "`RandomSampler` order, drawn from the global generator at each epoch's start; under "
                          "several processes rank 0's draw), `dispatch_batches` (True under several processes: rank "
                          "0 reads every training batch and sends each process its part; False with a stream under "
                          "several processes is refused))",
    "parallelism_config": _STRATEGY,
    "dataloader_multiprocessing_context": "pass `DataLoader`s with your own `multiprocessing_context` (override "
                                          "`train_dataloader`)",
    "dataloader_in_order": "batches are always yielded in order",
}
"""Fields that keep their default; a different value raises, and this says what to use instead."""

DIFFERENCES: dict[str, str] = {
    "optim": "ours build `adamw_torch`, `adamw_torch_fused`, `sgd`, `adafactor`, `adagrad`, `rmsprop`; HF's own "
             "handler builds the other plain optimizers (bitsandbytes, torchao, GaLore, APOLLO, GrokAdamW, "
             "StableAdamW, `adamw_anyprecision`...; HF's error when the package is missing, when the `Trainer` is "
             "built); `lomo` / `adalomo`, `schedule_free_*` and the `*_layerwise` ones are refused with the reason "
             "(they need HF's loop to call them inside the backward or around each phase)",
    "gradient_accumulation_steps": "the loss is token-normalised for every model (HF skips it for BERT-like models)",
    "bf16": "becomes Lightning `precision=\"bf16-mixed\"`; `trainer.precision` / `lightning_kwargs[\"precision\"]` "
            "wins",
    "fp16": "becomes Lightning `precision=\"16-mixed\"`; on the CPU it trains in float32 with a warning, as HF does "
            "there (Lightning would switch to bf16); `trainer.precision` / `lightning_kwargs[\"precision\"]` wins",
    "use_cpu": "sets Lightning `accelerator=\"cpu\"`",
    "disable_tqdm": "switches Lightning's progress bar",
    "include_num_input_tokens_seen": "`all`, `non_padding`, `no`, True, False only (HF counts any other string like "
                                     "`all`; a typo is refused here); the count is reduced once per update, not per "
                                     "micro-batch",
    "report_to": "default `tensorboard` (HF: `none`); `tensorboard`, `csv` (ours), `wandb`, `mlflow`, `comet_ml` "
                 "become Lightning loggers fed HF's log entries at HF's steps (a missing package is one error "
                 "naming it); "
                 "`all` = every installed one, as HF; HF's other integrations raise an error; a logger in "
                 "`lightning_kwargs[\"logger\"]` replaces them; the arguments and model config are not sent as "
                 "hyperparameters (HF's callbacks send them)",
    "run_name": "the logger's run name (TensorBoard / CSV: the version folder under `runs/` / `csv/`)",
    "train_sampling_strategy": "`random`, `sequential`, `group_by_length` (HF's order in every epoch, and a run "
                               "resumed inside an epoch keeps its order; under several processes all use rank 0's "
                               "draw; evaluation keeps dataset order); `batch_rebalance` raises an error",
    "torch_compile": "evaluations during and after `train()` also run the compiled model (HF's run uncompiled); "
                     "`remove_unused_columns` inspects the model inside a compiled one (README, \"Compiling\")",
    "length_column_name": "read before `remove_unused_columns` drops it (HF drops it first and measures the inputs)",
    "resume_from_checkpoint": "`train()` also reads it when called without `resume_from_checkpoint` (HF's Trainer "
                              "leaves it to scripts)",
    "fsdp": "becomes a Lightning strategy: FSDP2 (`ModelParallelStrategy`, sharded per layer by default) or FSDP1 "
            "(`FSDPStrategy`, CUDA); a strategy in `lightning_kwargs` / `trainer.strategy` wins (README, 'Swapping "
            "strategies')",
    "fsdp_config": "checkpoints always hold the gathered full weights, whatever `state_dict_type`; FSDP2 mixed "
                   "precision is accelerate's `MixedPrecisionPolicy` with float32 masters (README, 'Swapping "
                   "strategies')",
    "deepspeed": "Lightning's `DeepSpeedStrategy` (CUDA) with HF's `\"auto\"` values filled; ZeRO-3 checkpoints always "
                 "hold gathered weights",
    "ddp_static_graph": "gradients sync on every micro-batch of a window (Lightning's static-graph flush needs it)",
    "ddp_find_unused_parameters": "applies to the `DDPStrategy` Lightning chooses; a strategy you pass keeps its own "
                                  "options (warned)",
    "enable_jit_checkpoint": "on SIGTERM / SIGUSR1 every process agrees at the next update boundary, writes "
                             "`checkpoint-<step>` through the normal atomic save (no 3 s wait, no sentinel file) and "
                             "`train()` raises `TrainingPreempted` (exit status 143); False: the same stop and "
                             "status without the save (HF: killed by the signal); HF's `JITCheckpointCallback` is in "
                             "`callback_handler`, its manager installing no signal handler of its own (README, "
                             "'Checkpoints and resume')",
    "skip_memory_metrics": "False: HF's own `TrainerMemoryTracker` runs around `__init__`, `train`, `evaluate` and "
                           "`predict`, as in HF (the same `*_mem_cpu_*_delta` / `*_mem_gpu_*_delta` keys, in the same "
                           "dicts); the bytes are what Lightning's run allocates, not what HF's would",
    "eval_use_gather_object": "True: one process evaluates as HF's (accelerate's `gather_object` returns a single "
                              "process's outputs as they are); under several processes it is refused when the "
                              "loaders are built (evaluation outputs are gathered as tensors inside Lightning's loop; "
                              "HF's object gather of tensors returns lists of rows)",
    "auto_find_batch_size": "`args.per_device_train_batch_size` is back to your value after `train()`; "
                            "`state.train_batch_size` holds the size that fit",
}
"""Supported fields that behave differently from HF, and how (the README map prints these)."""

OURS: dict[str, str] = {
    "save_async": "write checkpoints in a background thread (the state is copied to CPU memory at the save step); "
                  "the same files, renames and rotation as a synchronous save",
    "include_throughput": "`tokens_per_second` (and `mfu`) in every training log entry, `train_tokens_per_second` "
                          "(and `train_mfu`) in the end-of-training metrics",
    "peak_flops_per_device": "the device's peak FLOP/s for `mfu` (default: from a table of GPUs and the precision)",
    "resume_keep_global_batch": "on a resume, `gradient_accumulation_steps` set so that per-device batch x "
                                "accumulation x processes is the checkpoint's global batch (refused before training "
                                "when it cannot divide) (README, 'Resuming on another number of processes')",
    "save_nonfinite_checkpoints": "default False: a save whose weights hold a NaN or inf stops the run with "
                                  "`NonFiniteWeightsError` (the step, the first such parameter) and writes nothing, "
                                  "so the last checkpoint stays the newest; True saves them, as HF does",
    "auto_micro_batch": "on an out-of-memory error in a forward or backward, the same update again from its start "
                        "with micro-batches half as large and twice as many: the global batch, the samples and the "
                        "token-normalised loss are kept; evaluation batches are split alike; the size found is "
                        "logged once, kept in checkpoints and used on resume (README, 'Micro-batching that keeps "
                        "the global batch'); single process, DDP or FSDP2",
}
"""hf_lightning's own fields (not in `transformers.TrainingArguments`), with what they do (the README map's rows)."""

DEFAULT_DIFFERENCES: dict[str, Any] = {"report_to": "tensorboard"}
"""Fields whose default is deliberately not HF's (HF writes no logs by default; we write TensorBoard)."""

SCRIPT_ONLY: dict[str, str] = {
    "do_train": "read by scripts; the HF Trainer does not use it either",
    "do_eval": "read by scripts; set to True when `eval_strategy` is not `no`, as in HF",
    "do_predict": "read by scripts; the HF Trainer does not use it either",
    "local_rank": "kept for `torch.distributed.launch` command lines, as in HF; read `local_process_index`",
    "log_level": "`get_process_log_level()`; the Trainer sets transformers' verbosity from it, as HF's",
    "log_level_replica": "`get_process_log_level()` on the processes that are not `should_log`",
    "log_on_each_node": "`should_log`: local rank 0 of every node, or global rank 0 only",
}
"""Fields with HF's meaning that only scripts (or the arguments' own methods) read: the map's notes for them."""


ACCELERATOR_CONFIG_DEFAULTS: dict[str, Any] = {
    "split_batches": False, "dispatch_batches": None, "even_batches": True, "use_seedable_sampler": True,
    "non_blocking": False, "gradient_accumulation_kwargs": None,
}
"""accelerate's `AcceleratorConfig` defaults (transformers 5.24), which are what a Lightning run does: batch sizes per
process, each process loading its own shard, the seeded order, eval results without duplicates."""
_ACCELERATOR_HONOURED = ("use_configured_state", "non_blocking", "split_batches", "even_batches",
                         "use_seedable_sampler", "dispatch_batches")
"""`accelerator_config` fields honoured whatever their value: `use_configured_state` (HF's rule: an accelerate state
must exist, `accelerator_config.accelerate_state_exists`), `non_blocking` (Lightning moves every batch to CUDA with
`non_blocking=True`, and blocking to the CPU / MPS, whatever the value: the same tensors either way), `split_batches`,
`even_batches` and `use_seedable_sampler` (the loaders, `data/sampling.py`), `dispatch_batches` (`data/dispatch.py`
under several processes; False with a stream is refused when the loaders are built, `data/datamodule.py`)."""


def _accelerator_settings(value: Any) -> Mapping[str, Any] | None:
    """An `accelerator_config` value as a mapping (a dict, an `AcceleratorConfig`, JSON text), or None for a path."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None  # a file path: its content could set anything
    if not isinstance(value, Mapping):
        to_dict = getattr(value, "to_dict", None)
        if not callable(to_dict):
            return None
        value = to_dict()
    return value


_ACCUMULATION_HONOURED = {"num_steps": None, "sync_with_dataloader": None, "sync_each_batch": None,
                          "adjust_scheduler": None}
"""`gradient_accumulation_kwargs` keys hf_lightning honours, with the one value it honours (None: any). `num_steps`
is HF's Trainer rule (`accelerator_config.apply_accumulation_steps`); gradients are synced once per update, or on
every micro-batch with `sync_each_batch=True` (`parallel/runtime.micro_batch_context`). `sync_with_dataloader` and
`adjust_scheduler` change nothing in HF's `Trainer` either: it sets `gradient_state.sync_gradients` itself on every
micro-batch (an update window ends with its loader whatever the value, T:1896-1899) and steps its scheduler only on
the update's last micro-batch, where accelerate's `AcceleratedScheduler` reads `adjust_scheduler` only when
gradients are not synced; they are kept in `trainer.accelerator.gradient_state.plugin_kwargs`."""


def _honoured(key: str, setting: Any) -> bool:
    """Whether hf_lightning does what this `accelerator_config` setting asks (module docstring of `support.py`)."""
    if key in _ACCELERATOR_HONOURED:
        return True
    if key == "gradient_accumulation_kwargs" and isinstance(setting, Mapping):
        return all(name in _ACCUMULATION_HONOURED and _ACCUMULATION_HONOURED[name] in (None, value)
                   for name, value in setting.items())
    return key in ACCELERATOR_CONFIG_DEFAULTS and ACCELERATOR_CONFIG_DEFAULTS[key] == setting


def changed_accelerator_settings(value: Any) -> Any:
    """The keys of an `accelerator_config` value hf_lightning does not honour (what an error shows)."""
    settings = _accelerator_settings(value)
    if settings is None:
        return value
    return {key: setting for key, setting in settings.items() if not _honoured(key, setting)}


def accelerator_config_changes_nothing(value: Any) -> bool:
    """Whether an `accelerator_config` value changes nothing under Lightning: None, or a mapping (or an
    `AcceleratorConfig`, or its JSON text) whose every setting hf_lightning honours (`_honoured`).

    `use_configured_state` asks accelerate to reuse an already configured process state instead of building one
    (HF's check that one exists is `hf_fields.normalise_hf_fields`'s); Lightning builds none either way.
    """
    if value is None:
        return True
    return _accelerator_settings(value) is not None and not changed_accelerator_settings(value)


_NEUTRAL = {"accelerator_config": accelerator_config_changes_nothing}
"""Unsupported fields whose value may differ from the default when it changes nothing (the rule, per field)."""

_SHOWN = {"accelerator_config": changed_accelerator_settings}
"""How an error shows a field's value when its whole value would hide what was changed."""


def unsupported_problem(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> str | None:
    """One message naming every `UNSUPPORTED` field whose value differs from its default, or None.

    A value `_NEUTRAL`'s rule finds changes nothing is accepted (`accelerator_config={"use_configured_state": True}`).

    Args:
        values: field name -> value as set (missing names count as default).
        defaults: field name -> default value.
    """
    changed = [name for name in UNSUPPORTED if name in values and values[name] != defaults[name]
               and not (name in _NEUTRAL and _NEUTRAL[name](values[name]))]
    if not changed:
        return None
    lines = [f"`{name}`={_SHOWN.get(name, lambda v: v)(values[name])!r}: {UNSUPPORTED[name]}" for name in changed]
    return (
        "these TrainingArguments fields are not supported by hf_lightning and must keep their defaults "
        "(README, 'HF argument map'):\n  * " + "\n  * ".join(lines)
    )
