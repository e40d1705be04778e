"""`TrainingArguments`: the HF Trainer's argument names and defaults, for the fields hf_lightning supports.

Pure Python (no torch import), so the CLI can build its parser without loading the heavy stack. Each field keeps the
name and default of `transformers.TrainingArguments` (5.x); the docstring under each field is what
`hf-lightning --help` prints. Validation mirrors `TrainingArguments.__post_init__` (same messages where users grep
for them) and reports every problem at once. Converting a `transformers.TrainingArguments` lives in
`from_transformers.py`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from hf_lightning.args.choices import IntervalStrategyName, SamplingStrategyName, SaveStrategyName
from hf_lightning.args.validation import normalise_and_check

__all__ = ["TrainingArguments"]

@dataclass
class TrainingArguments:
    """The HF `TrainingArguments` fields that hf_lightning honours, with HF's names and defaults.

    Lightning-only settings (devices, strategy, precision, loggers) go to `lightning.Trainer`; the facade takes them
    as `lightning_kwargs`, the CLI under `trainer:`. Unsupported HF fields are listed in README's argument map.

    Raises:
        ValueError: listing every invalid field, its value and what is allowed.
    """

    output_dir: str | None = None
    """Where checkpoints (`checkpoint-<step>/`) and logs go. Defaults to `trainer_output`."""
    eval_strategy: IntervalStrategyName = "no"
    """When to evaluate during training: `no`, `steps` (every `eval_steps` updates) or `epoch`."""
    prediction_loss_only: bool = False
    """`evaluate`/`predict` return only the loss (no logits, no labels)."""
    per_device_train_batch_size: int = 8
    """Micro-batch size per process for training."""
    per_device_eval_batch_size: int = 8
    """Batch size per process for evaluation and prediction."""
    gradient_accumulation_steps: int = 1
    """Micro-batches accumulated into one optimizer update. A window never crosses an epoch boundary."""
    eval_accumulation_steps: int | None = None
    """Move accumulated eval tensors to the CPU every this many batches (values are identical)."""
    eval_delay: float = 0
    """Updates (or epochs, with `eval_strategy="epoch"`) to wait before the first evaluation."""
    learning_rate: float = 5e-5
    """Initial (peak) learning rate."""
    weight_decay: float = 0.0
    """Weight decay applied to every parameter except biases and normalisation weights."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Clip the total gradient norm to this value (<= 0: no clipping; the norm is still logged)."""
    num_train_epochs: float = 3.0
    """Epochs to train; a fraction stops inside the last epoch. Ignored when `max_steps > 0`."""
    max_steps: int = -1
    """Total optimizer updates; overrides `num_train_epochs` when > 0. Required for an unsized train dataset."""
    lr_scheduler_type: str = "linear"
    """Learning-rate schedule, a `transformers.get_scheduler` name (see README)."""
    lr_scheduler_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the scheduler (e.g. `{"num_cycles": 2}`)."""
    warmup_steps: float = 0
    """Warmup updates: an int >= 1, or a fraction of `max_steps` in [0, 1)."""
    logging_strategy: IntervalStrategyName = "steps"
    """When to log the training loss: `no`, `steps` or `epoch`."""
    logging_first_step: bool = False
    """Also log after the first update."""
    logging_steps: float = 500
    """Log every this many updates (a fraction < 1 is a share of `max_steps`)."""
    logging_nan_inf_filter: bool = True
    """Replace a non-finite training loss by the running mean of the window when logging."""
    save_strategy: SaveStrategyName = "steps"
    """When to write `checkpoint-<step>/`: `no`, `steps`, `epoch` or `best` (on every new best metric)."""
    save_steps: float = 500
    """Save every this many updates (a fraction < 1 is a share of `max_steps`)."""
    save_total_limit: int | None = None
    """Keep at most this many checkpoints (the newest and the best are never deleted)."""
    save_only_model: bool = False
    """Checkpoints hold the model files only (no optimizer, scheduler or RNG state: cannot resume exactly)."""
    seed: int = 42
    """Random seed set at the start of training (model init with `model_init`, dropout, shuffling)."""
    data_seed: int | None = None
    """Seed of the training-data shuffle only; defaults to `seed`."""
    bf16: bool = False
    """Train with bfloat16 autocast (Lightning `precision="bf16-mixed"`)."""
    fp16: bool = False
    """Train with float16 autocast and a grad scaler (Lightning `precision="16-mixed"`)."""
    dataloader_drop_last: bool = False
    """Drop the last incomplete batch of each epoch (train and eval loaders, as HF)."""
    eval_steps: float | None = None
    """Evaluate every this many updates; defaults to `logging_steps`."""
    dataloader_num_workers: int = 0
    """Worker processes for data loading."""
    dataloader_prefetch_factor: int | None = None
    """Batches prefetched per worker (only with workers)."""
    run_name: str | None = None
    """A name for the run, used as the logger's version folder."""
    disable_tqdm: bool | None = None
    """Disable the progress bar."""
    remove_unused_columns: bool = True
    """Drop dataset columns that the model's `forward` does not accept."""
    label_names: list[str] | None = None
    """Input keys holding the labels; defaults to the model's `forward` parameters containing `label`."""
    load_best_model_at_end: bool = False
    """At the end of training, load the checkpoint with the best `metric_for_best_model`."""
    metric_for_best_model: str | None = None
    """Metric that picks the best checkpoint (`eval_` is prepended if missing). Defaults to `loss` when needed."""
    greater_is_better: bool | None = None
    """Whether a larger metric is better; defaults to `not metric_for_best_model.endswith("loss")`."""
    ignore_data_skip: bool = False
    """On resume, replay the interrupted epoch from its start instead of skipping seen batches."""
    optim: str = "adamw_torch_fused"
    """Optimizer: one of `adamw_torch`, `adamw_torch_fused`, `sgd`, `adafactor`, `adagrad`, `rmsprop`."""
    optim_args: str | None = None
    """Extra optimizer arguments as `key=value,key=value`."""
    label_smoothing_factor: float = 0.0
    """Label smoothing epsilon (HF's `LabelSmoother`, shifted for causal LMs)."""
    dataloader_pin_memory: bool = True
    """Pin host memory in data loaders (ignored on CPU-only runs)."""
    dataloader_persistent_workers: bool = False
    """Keep data-loader workers alive between epochs."""
    resume_from_checkpoint: str | None = None
    """A checkpoint folder to resume from (the facade's `train(resume_from_checkpoint=...)` wins)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory (`model.gradient_checkpointing_enable()`)."""
    include_for_metrics: list[str] = field(default_factory=list)
    """Extra fields for `compute_metrics`: `inputs` and/or `loss`."""
    eval_do_concat_batches: bool = True
    """Concatenate eval predictions across batches (False: keep a list per batch)."""
    batch_eval_metrics: bool = False
    """Call `compute_metrics(..., compute_result=...)` per batch instead of once at the end."""
    eval_on_start: bool = False
    """Run one evaluation before the first training step (a sanity check)."""
    average_tokens_across_devices: bool = True
    """Normalise the loss by the label tokens of all processes (exact token-weighted mean under DDP)."""
    use_cpu: bool = False
    """Train on the CPU even if an accelerator is present."""
    use_cache: bool = False
    """Value forced onto `model.config.use_cache` (HF 5 sets False: the KV cache is useless in training)."""
    train_sampling_strategy: SamplingStrategyName = "random"
    """Order of training samples: `random` (seeded by `data_seed` or `seed`, and the epoch) or `sequential`."""
    restore_callback_states_from_checkpoint: bool = False
    """On resume, also restore the state of `TrainerCallback`s that export one (e.g. early stopping)."""
    report_to: str | list[str] = "tensorboard"
    """Loggers when none is given to Lightning: `tensorboard` (default, differs from HF's `none`), `csv`, `none`."""

    def __post_init__(self) -> None:
        normalise_and_check(self)

    # ----- derived values (HF's TrainingArguments properties) -----
    @property
    def do_eval(self) -> bool:
        """HF sets `do_eval` whenever an eval strategy is set."""
        return self.eval_strategy != "no"

    @property
    def resolved_output_dir(self) -> str:
        """`output_dir`, or HF 5's default `trainer_output`."""
        return self.output_dir or "trainer_output"

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup updates for a run of `num_training_steps` (HF: an int is truncated, a fraction is ceil'd)."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil(num_training_steps * self.warmup_steps)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly copy of every field."""
        return dataclasses.asdict(self)

    def to_json_string(self) -> str:
        """The fields as indented JSON (what HF callbacks and loggers print)."""
        import json

        return json.dumps(self.to_dict(), indent=2, sort_keys=True)
