"""`TrainingArguments`: every field of `transformers.TrainingArguments` (5.x), with HF's name, type and default.

Pure Python (no torch import), so the CLI can build its parser without loading the heavy stack; HF's enum types are
`Literal`s or `str` here. Any command line `HfArgumentParser` accepts for HF's class parses into this one. The
docstring under each field is what `hf-lightning fit --help` prints. What each field does here (supported, supported
with a difference, or not supported and refused when set) is the table in `support.py`; validation mirrors HF's
`__post_init__` (`validation.py`); the process-layout properties scripts call are in `process.py`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from hf_lightning.args.accelerator_config import provide_state
from hf_lightning.args.choices import (
    HubStrategyName,
    IntervalStrategyName,
    LogLevelName,
    SamplingStrategyName,
    SaveStrategyName,
    default_optimizer,
)
from hf_lightning.args.keyword_hints import with_keyword_hints
from hf_lightning.args.process import ProcessLayoutMixin
from hf_lightning.args.validation import normalise_and_check

__all__ = ["TrainingArguments"]

_BARE_FLAG = {"nargs": "?", "const": True}  # HF's metadata: a bare `--flag` means True for a `bool | None` field


def _dtype_names(values: dict[str, Any]) -> dict[str, Any]:
    """HF's `_dict_dtype_to_str` on a copy (HF's edits the argument's own dicts): a non-string `dtype` value (here
    and in nested dicts) becomes its name after the module prefix (`torch.float16` -> `"float16"`)."""
    out = {k: _dtype_names(v) if isinstance(v, dict) else v for k, v in values.items()}
    if out.get("dtype") is not None and not isinstance(out["dtype"], str):
        out["dtype"] = str(out["dtype"]).split(".")[1]
    return out


@with_keyword_hints
@dataclass
class TrainingArguments(ProcessLayoutMixin):
    """Every `transformers.TrainingArguments` field, with HF's names, types and defaults.

    Lightning-only settings (devices, strategy, precision, loggers) go to `lightning.Trainer`; the facade takes them
    as `lightning_kwargs`, the CLI under `trainer:`. Fields hf_lightning does not support keep their default; setting
    one raises (README, "HF argument map"). Our one deliberate default difference: `report_to="tensorboard"`.

    Raises:
        ValueError: listing every invalid field, its value and what is allowed, and every unsupported field set.
    """

    # HF's list of the fields a JSON string starting with `{` may give (parsed into a dict, its `"true"` / number
    # strings typed, in `__post_init__`); a subclass extends it for its own fields (TRL's `SFTConfig`). A comment, not
    # a docstring: the CLI reads attribute docstrings as field descriptions. Not annotated: not a dataclass field.
    _VALID_DICT_FIELDS = [
        "accelerator_config", "fsdp_config", "deepspeed", "activation_checkpointing_kwargs",
        "gradient_checkpointing_kwargs", "lr_scheduler_kwargs",
    ]

    # --- Output ---
    output_dir: str | None = None
    """Where checkpoints (`checkpoint-<step>/`) and logs go. Defaults to `trainer_output`."""

    # --- Training duration and batch size ---
    per_device_train_batch_size: int = 8
    """Micro-batch size per process for training."""
    num_train_epochs: float = 3.0
    """Epochs to train; a fraction stops inside the last epoch. Ignored when `max_steps > 0`."""
    max_steps: int = -1
    """Total optimizer updates; overrides `num_train_epochs` when > 0. Required for an unsized train dataset."""

    # --- Learning rate and scheduler ---
    learning_rate: float = 5e-5
    """Initial (peak) learning rate."""
    lr_scheduler_type: str = "linear"
    """Learning-rate schedule, a `transformers.get_scheduler` name except `greedy` (see README)."""
    lr_scheduler_kwargs: dict[str, Any] | str | None = None
    """Extra keyword arguments for the scheduler, a dict or a JSON string (e.g. `{"num_cycles": 2}`)."""
    warmup_steps: float = 0
    """Warmup updates: an int >= 1, or a fraction of the total updates in [0, 1)."""

    # --- Optimizer ---
    optim: str = default_optimizer()
    """Optimizer: `adamw_torch`, `adamw_torch_fused` (the default from torch 2.8, as HF), `sgd`, `adafactor`, `adagrad`,
    `rmsprop`."""
    optim_args: str | None = None
    """Extra optimizer arguments as `key=value,key=value`."""
    weight_decay: float = 0.0
    """Weight decay applied to every parameter except biases and normalisation weights."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    optim_target_modules: None | str | list[str] = None
    """Not supported (GaLore / APOLLO target modules): must stay None."""

    # --- Regularization and stability ---
    gradient_accumulation_steps: int = 1
    """Micro-batches accumulated into one optimizer update. A window never crosses an epoch boundary."""
    average_tokens_across_devices: bool = True
    """Normalise the loss by the label tokens of all processes (exact token-weighted mean under DDP)."""
    max_grad_norm: float = 1.0
    """Clip the total gradient norm to this value (<= 0: no clipping; the norm is still logged)."""
    label_smoothing_factor: float = 0.0
    """Label smoothing epsilon (HF's `LabelSmoother`, shifted for causal LMs)."""

    # --- Mixed precision ---
    bf16: bool = False
    """Train with bfloat16 autocast (Lightning `precision="bf16-mixed"`)."""
    fp16: bool = False
    """Train with float16 autocast and a grad scaler (Lightning `precision="16-mixed"`)."""
    bf16_full_eval: bool = False
    """Evaluate and predict with the model cast to bfloat16 (no autocast), as HF."""
    fp16_full_eval: bool = False
    """Evaluate and predict with the model cast to float16 (no autocast), as HF."""
    tf32: bool | None = None
    """Not supported (TF32 matmuls): must stay None; set `torch.backends` flags yourself."""

    # --- Activation checkpointing ---
    activation_checkpointing: bool | None = field(default=None, metadata=_BARE_FLAG)
    """Recompute activations in the backward pass to save memory (`model.activation_checkpointing_enable()`)."""
    activation_checkpointing_kwargs: dict[str, Any] | str | None = None
    """Keyword arguments for `torch.utils.checkpoint` (e.g. `{"use_reentrant": false}`), plus `every_n_layers` and
    `offload`; a dict or a JSON string."""
    gradient_checkpointing: bool | None = field(default=None, metadata=_BARE_FLAG)
    """HF's deprecated alias of `activation_checkpointing` (used when that one is not set)."""
    gradient_checkpointing_kwargs: dict[str, Any] | str | None = None
    """HF's deprecated alias of `activation_checkpointing_kwargs` (used when that one is not set)."""

    # --- Compilation and kernels ---
    torch_compile: bool = False
    """Compile the model the training and evaluation steps call with `torch.compile` (checkpoints stay plain)."""
    torch_compile_backend: str | None = None
    """`torch.compile` backend (setting it turns `torch_compile` on; default `inductor`)."""
    torch_compile_mode: str | None = None
    """`torch.compile` mode, e.g. `reduce-overhead`, `max-autotune` (setting it turns `torch_compile` on)."""
    use_liger_kernel: bool = False
    """Not supported (Liger kernels): must stay False."""
    liger_kernel_config: dict[str, bool] | None = None
    """Not supported (Liger kernel settings): must stay None."""

    # --- Additional optimizations ---
    use_cache: bool = False
    """Value forced onto `model.config.use_cache` (HF 5 sets False: the KV cache is useless in training)."""
    neftune_noise_alpha: float | None = None
    """NEFTune: uniform noise of this scale on the input embeddings while training (not in evaluation)."""
    torch_empty_cache_steps: int | None = None
    """Empty the accelerator's memory cache every this many updates (after the update's forward passes, as HF)."""
    auto_find_batch_size: bool = False
    """On an out-of-memory error, halve the per-device train batch size and start training again (as HF)."""

    # --- Logging ---
    logging_strategy: IntervalStrategyName = "steps"
    """When to log the training loss: `no`, `steps` or `epoch`."""
    logging_steps: float = 500
    """Log every this many updates (a fraction < 1 is a share of the total updates)."""
    logging_first_step: bool = False
    """Also log after the first update."""
    log_on_each_node: bool = True
    """`should_log` on local rank 0 of every node (True) or on global rank 0 only (False)."""
    logging_nan_inf_filter: bool = True
    """Replace a non-finite training loss by the running mean of the window when logging."""
    include_num_input_tokens_seen: str | bool = "no"
    """Count the input tokens trained on (`state.num_input_tokens_seen`, in every log entry, summed over processes):
    `all`, `non_padding` (attention-mask ones), `no`; True / False mean `all` / `no`."""
    log_level: LogLevelName = "passive"
    """transformers' log level on the main process (`passive`: leave it); see `get_process_log_level()`."""
    log_level_replica: LogLevelName = "warning"
    """transformers' log level on the other processes; see `get_process_log_level()`."""
    disable_tqdm: bool | None = None
    """Disable the progress bar (default: only when transformers logs less than warnings)."""

    # --- Experiment tracking ---
    report_to: None | str | list[str] = "tensorboard"
    """Loggers: `tensorboard` (default; HF's is `none`), `csv`, `wandb`, `mlflow`, `comet_ml`, `all`, `none`."""
    run_name: str | None = None
    """A name for the run: the logger's run name (TensorBoard / CSV: its version folder)."""
    project: str = "huggingface"
    """Not supported (trackio project): must stay `huggingface`."""
    trackio_space_id: str | None = None
    """Not supported (trackio): must stay None."""
    trackio_bucket_id: str | None = None
    """Not supported (trackio): must stay None."""
    trackio_static_space_id: str | None | Literal[False] = None
    """Not supported (trackio): must stay None."""

    # --- Evaluation ---
    eval_strategy: IntervalStrategyName = "no"
    """When to evaluate during training: `no`, `steps` (every `eval_steps` updates) or `epoch`."""
    eval_steps: float | None = None
    """Evaluate every this many updates; defaults to `logging_steps`."""
    eval_delay: float = 0
    """Updates (or epochs, with `eval_strategy="epoch"`) to wait before the first evaluation."""
    per_device_eval_batch_size: int = 8
    """Batch size per process for evaluation and prediction."""
    prediction_loss_only: bool = False
    """`evaluate`/`predict` return only the loss (no logits, no labels)."""
    eval_on_start: bool = False
    """Run one evaluation before the first training step (a sanity check)."""
    eval_do_concat_batches: bool = True
    """Concatenate eval predictions across batches (False: keep a list per batch)."""
    eval_use_gather_object: bool = False
    """Not supported (gather Python objects across processes): must stay False."""
    eval_accumulation_steps: int | None = None
    """Move accumulated eval tensors to the CPU every this many batches (values are identical)."""

    # --- Metrics ---
    include_for_metrics: list[str] = field(default_factory=list)
    """Extra fields for `compute_metrics`: `inputs` and/or `loss`."""
    batch_eval_metrics: bool = False
    """Call `compute_metrics(..., compute_result=...)` per batch instead of once at the end."""

    # --- Checkpointing and saving ---
    save_only_model: bool = False
    """Checkpoints hold the model files only (no optimizer, scheduler or RNG state: cannot resume exactly)."""
    save_strategy: SaveStrategyName = "steps"
    """When to write `checkpoint-<step>/`: `no`, `steps`, `epoch` or `best` (on every new best metric)."""
    save_steps: float = 500
    """Save every this many updates (a fraction < 1 is a share of the total updates)."""
    save_on_each_node: bool = False
    """Not supported (save on every node): must stay False."""
    save_total_limit: int | None = None
    """Keep at most this many checkpoints (the newest and the best are never deleted)."""
    enable_jit_checkpoint: bool = False
    """HF's: on SIGTERM / SIGUSR1 write `checkpoint-<step>` at the next update boundary, agreed by every process,
    then stop with `TrainingPreempted` (README "Pre-emption"). False: the same stop, without the save."""

    # --- Hub (not supported: no hub access) ---
    push_to_hub: bool = False
    """Not supported (push to the Hub): must stay False."""
    hub_token: str | None = None
    """Not supported (Hub token): must stay None."""
    hub_private_repo: bool | None = None
    """Not supported (Hub): must stay None."""
    hub_model_id: str | None = None
    """Not supported (Hub): must stay None."""
    hub_strategy: HubStrategyName = "every_save"
    """Accepted with any of HF's values: it only says when `push_to_hub` uploads, which is not supported."""
    hub_always_push: bool = False
    """Not supported (Hub): must stay False."""
    hub_revision: str | None = None
    """Not supported (Hub): must stay None."""

    # --- Best model ---
    load_best_model_at_end: bool = False
    """At the end of training, load the checkpoint with the best `metric_for_best_model`."""
    metric_for_best_model: str | None = None
    """Metric that picks the best checkpoint (`eval_` is prepended if missing). Defaults to `loss` when needed."""
    greater_is_better: bool | None = None
    """Whether a larger metric is better; defaults to `not metric_for_best_model.endswith("loss")`."""

    # --- Resuming ---
    ignore_data_skip: bool = False
    """On resume, replay the interrupted epoch from its start instead of skipping seen batches."""
    restore_callback_states_from_checkpoint: bool = False
    """On resume, also restore the state of `TrainerCallback`s that export one (e.g. early stopping)."""

    # --- Reproducibility ---
    full_determinism: bool = False
    """Deterministic algorithms everywhere (`transformers.enable_full_determinism(seed)` instead of `set_seed`)."""
    seed: int = 42
    """Random seed set at the start of training (model init with `model_init`, dropout, shuffling)."""
    data_seed: int | None = None
    """Seed of the training-data shuffle only; defaults to `seed`."""

    # --- Hardware ---
    use_cpu: bool = False
    """Train on the CPU even if an accelerator is present."""
    accelerator_config: dict | str | None = None
    """accelerate's data-loading settings: held as HF's `AcceleratorConfig` (from a dict, a JSON file or a config),
    each field with accelerate's meaning on Lightning's loaders (README, "accelerator_config")."""
    parallelism_config: Any = None
    """Not supported (accelerate `ParallelismConfig`; use a Lightning strategy): must stay None."""

    # --- Data loading ---
    dataloader_drop_last: bool = False
    """Drop the last incomplete batch of each epoch (train and eval loaders, as HF)."""
    dataloader_num_workers: int = 0
    """Worker processes for data loading."""
    dataloader_pin_memory: bool = True
    """Pin host memory in data loaders (ignored on CPU-only runs)."""
    dataloader_persistent_workers: bool = False
    """Keep data-loader workers alive between epochs."""
    dataloader_prefetch_factor: int | None = None
    """Batches prefetched per worker (only with workers)."""
    dataloader_multiprocessing_context: Literal["fork", "spawn", "forkserver"] | None = None
    """Not supported (workers' start method): must stay None."""
    dataloader_in_order: bool = True
    """Not supported (out-of-order batches): must stay True."""
    remove_unused_columns: bool = True
    """Drop dataset columns that the model's `forward` does not accept."""
    label_names: list[str] | None = None
    """Input keys holding the labels; defaults to the model's `forward` parameters containing `label`."""
    train_sampling_strategy: SamplingStrategyName = "random"
    """Order of training samples: `random` (seeded by `data_seed` or `seed`, and the epoch), `sequential`, or
    `group_by_length` (batches of similar lengths, longest first, drawn from torch's global generator as HF)."""
    length_column_name: str = "length"
    """Column with precomputed sample lengths for `group_by_length` (else the main input's length is measured)."""

    # --- DDP (Lightning's DDPStrategy when Lightning runs several processes; README "Swapping strategies") ---
    ddp_find_unused_parameters: bool | None = None
    """DDP `find_unused_parameters`; default: True unless activation checkpointing is on (HF's rule)."""
    ddp_bucket_cap_mb: int | None = None
    """DDP `bucket_cap_mb`."""
    ddp_broadcast_buffers: bool | None = None
    """DDP `broadcast_buffers`."""
    ddp_static_graph: bool | None = None
    """DDP `static_graph`."""
    ddp_backend: Literal["nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl"] | None = None
    """The process-group backend (default: Lightning's for the device: nccl on CUDA, gloo on CPU)."""
    ddp_timeout: int = 1800
    """Timeout of the process group's collectives, in seconds."""

    # --- FSDP and DeepSpeed (Lightning strategies; README "Swapping strategies") ---
    fsdp: str | None = field(default=None, metadata=_BARE_FLAG)
    """FSDP: True, or HF's options `full_shard` / `shard_grad_op` / `hybrid_shard` / `no_shard` / `offload` /
    `auto_wrap` (e.g. `"full_shard auto_wrap"`). FSDP2 by default (`fsdp_config["version"]`)."""
    fsdp_config: dict[str, Any] | str | None = None
    """FSDP settings (a dict or a JSON file): `version`, `reshard_after_forward`, `cpu_offload`, `auto_wrap_policy`,
    `transformer_layer_cls_to_wrap`, `min_num_params`, `activation_checkpointing`, `cpu_ram_efficient_loading`..."""
    deepspeed: dict | str | None = None
    """A DeepSpeed config (a dict or a JSON file); HF's `"auto"` values are filled from these arguments."""

    # --- Debugging ---
    debug: str | list[str] = ""
    """`"underflow_overflow"`: HF's `DebugUnderflowOverflow` watches the model's activations and weights and stops
    at the first inf / nan (as HF; held as a list of `DebugOption`); `tpu_metrics_debug` is refused."""
    skip_memory_metrics: bool = True
    """Not supported when False (memory metrics): must stay True."""

    # --- Flags for scripts (HF's Trainer does not read them either) ---
    do_train: bool = False
    """Whether the script should train (read by scripts, not by the Trainer)."""
    do_eval: bool = False
    """Whether the script should evaluate; set to True when `eval_strategy` is not `no` (as HF)."""
    do_predict: bool = False
    """Whether the script should predict on a test set (read by scripts, not by the Trainer)."""
    resume_from_checkpoint: str | None = None
    """A checkpoint folder to resume from (`train(resume_from_checkpoint=...)` wins; `train()` reads this one too)."""
    local_rank: int = -1
    """Filled by the deprecated `torch.distributed.launch`; read `local_process_index` instead."""

    # --- hf_lightning's own (not transformers.TrainingArguments fields; README "Our arguments") ---
    save_async: bool = False
    """Write checkpoints in a background thread: the training stalls only while the state is copied to CPU memory."""
    include_throughput: bool = False
    """Log `tokens_per_second` (non-padding input tokens of all processes) and, when the device's peak is known,
    `mfu` with every training log entry, and their averages in the end-of-training metrics."""
    peak_flops_per_device: float | None = None
    """Peak FLOP/s of one device for `mfu` (default: looked up from the GPU name and precision; unknown on CPU)."""
    resume_keep_global_batch: bool = False
    """On a resume: set `gradient_accumulation_steps` so that per-device batch x accumulation x processes is the
    checkpoint's global batch (refused before training when it cannot divide); the resumed run's updates are then
    the uninterrupted run's, on any number of processes."""
    save_nonfinite_checkpoints: bool = False
    """Write a checkpoint even when a weight is NaN or inf (HF's behaviour). By default such a save stops the run
    with `NonFiniteWeightsError` naming the step and the first non-finite parameter, and writes nothing."""
    auto_micro_batch: bool = False
    """On an out-of-memory error in a forward or backward, retry the same update from its start with each
    micro-batch split in two (accumulation doubled): the global batch, the update's samples and its token-normalised
    loss stay the same (README "Micro-batching that keeps the global batch"). Evaluation batches are split alike.
    HF's `auto_find_batch_size` instead restarts training with a smaller global batch."""

    def __post_init__(self) -> None:
        normalise_and_check(self)
        provide_state(self)  # accelerate's process state, as HF's arguments configure it (only while standing in)

    def __str__(self) -> str:
        """HF's form: one `name=value` per line, sorted, with `*_token` values hidden."""
        values = {k: (f"<{k.upper()}>" if k.endswith("_token") else v) for k, v in self._field_values().items()}
        return f"{type(self).__name__}(\n" + "".join(f"{k}={v},\n" for k, v in sorted(values.items())) + ")"

    __repr__ = __str__

    # ----- derived values (HF's TrainingArguments methods) -----
    @property
    def resolved_output_dir(self) -> str:
        """`output_dir`, or HF 5's default `trainer_output`."""
        return self.output_dir or "trainer_output"

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup updates for a run of `num_training_steps` (HF: an int is truncated, a fraction is ceil'd)."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil(num_training_steps * self.warmup_steps)

    def _field_values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-friendly, with `*_token` values hidden (HF's `to_dict`): an `Enum` (or a list of them)
        becomes its value, and a `dtype` key holding a `torch.dtype` (at the top or in a nested dict, e.g. a
        subclass's field or `model_init_kwargs`) becomes its name (`torch.bfloat16` -> `"bfloat16"`), as HF's."""
        out = {}
        for name, value in self._field_values().items():
            if name.endswith("_token"):
                value = f"<{name.upper()}>"
            elif isinstance(value, Enum):
                value = value.value
            elif isinstance(value, list) and value and isinstance(value[0], Enum):
                value = [v.value for v in value]
            elif hasattr(value, "to_dict"):  # e.g. a `GenerationConfig` (HF serialises it the same way)
                value = value.to_dict()
            elif isinstance(value, os.PathLike):  # a `Path` from the command line stays JSON-friendly
                value = os.fspath(value)
            out[name] = value
        return _dtype_names(out)

    def to_json_string(self) -> str:
        """`to_dict()` as indented JSON (what HF's callbacks print)."""
        return json.dumps(self.to_dict(), indent=2)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """`to_dict()` plus the batch sizes, every non-scalar value as a string (for TensorBoard hparams)."""
        values = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in values.items()}
