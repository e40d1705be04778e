"""The HF `TrainingArguments`, as hf_lightning takes them (pure Python: importing this package loads no torch).

- `choices`: the allowed values of the fields that take a name.
- `training_args`: the `TrainingArguments` dataclass (every HF field, HF's names, types and defaults).
- `support`: the table of what hf_lightning does with each HF field (supported / difference / not supported).
- `process`: the process-layout properties scripts call (`process_index`, `should_log`, `main_process_first`...).
- `validation` (+ `hf_fields`): HF's `__post_init__` normalisation and checks, every problem reported at once.
- `report_to`: HF integration names -> Lightning loggers.
- `from_transformers`: converting a `transformers.TrainingArguments` (unsupported fields reported together).
- `to_lightning`: translating the arguments into `lightning.Trainer` keyword arguments.
- `readme_map`: the README's argument map, generated from `support`.
"""

from hf_lightning.args.choices import (
    HF_BUILT_OPTIMIZERS,
    OPTIMIZER_NAMES,
    SCHEDULER_NAMES,
    IntervalStrategyName,
    SamplingStrategyName,
    SaveStrategyName,
)
from hf_lightning.args.training_args import TrainingArguments

__all__ = [
    "TrainingArguments",
    "IntervalStrategyName",
    "SaveStrategyName",
    "SamplingStrategyName",
    "HF_BUILT_OPTIMIZERS",
    "OPTIMIZER_NAMES",
    "SCHEDULER_NAMES",
]
