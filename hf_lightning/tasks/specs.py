"""The `model:` and `data:` sections of an `hf-lightning` config, as plain dataclasses (no torch import).

jsonargparse reads the field docstrings for `--help`; `__post_init__` checks combinations so a bad YAML gives one
error line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelSpec", "DataSpec"]


@dataclass
class ModelSpec:
    """Which model to train: a pretrained one (`model_name_or_path`) or a random init from a config class."""

    model_name_or_path: str | None = None
    """A local directory (e.g. one of our `checkpoint-<step>/` folders) or a hub name, loaded with `from_pretrained`."""
    config_class: str | None = None
    """For a random init: a config class, e.g. `BertConfig` or `transformers.GPT2Config`. Ignored (with
    `config_kwargs`) when `model_name_or_path` is set, so one config trains from scratch and then evaluates the
    result with `--model.model_name_or_path <output_dir>`."""
    config_kwargs: dict[str, Any] = field(default_factory=dict)
    """Arguments of `config_class` (e.g. `{hidden_size: 64, num_hidden_layers: 2}`); `vocab_size` defaults to the
    tokenizer's size."""
    config_overrides: dict[str, Any] = field(default_factory=dict)
    """Config attributes to override on top of the loaded or built config (e.g. `{hidden_dropout_prob: 0.2}`)."""
    auto_class: str | None = None
    """The `transformers` Auto class to build the model with; defaults to the task's (e.g. `AutoModelForCausalLM`)."""
    from_pretrained_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for `from_pretrained` (e.g. `{revision: main}`)."""

    def __post_init__(self) -> None:
        if self.model_name_or_path is None and self.config_class is None:
            raise ValueError("model: set `model_name_or_path` (pretrained) or `config_class` (random init).")


@dataclass
class DataSpec:
    """Where the data comes from and how it is turned into model inputs (the tokenizer too)."""

    train_file: str | None = None
    """Training data: a local csv / json / jsonl / parquet file."""
    validation_file: str | None = None
    """Evaluation data file (same formats)."""
    test_file: str | None = None
    """Prediction data file for `predict` (defaults to the validation data)."""
    dataset_name: str | None = None
    """Instead of files: a saved dataset directory (`save_to_disk`) or a hub dataset name."""
    dataset_config_name: str | None = None
    """The hub dataset configuration (e.g. `sst2` of `glue`)."""
    train_split: str = "train"
    """Split name of the training data in `dataset_name`."""
    validation_split: str = "validation"
    """Split name of the evaluation data in `dataset_name`."""
    test_split: str | None = None
    """Split name used by `predict` (defaults to `validation_split`)."""
    tokenizer_name_or_path: str | None = None
    """Tokenizer directory or hub name (`AutoTokenizer.from_pretrained`); defaults to `model.model_name_or_path`."""
    tokenizer_file: str | None = None
    """A local `tokenizer.json` (the `tokenizers` library) wrapped in `PreTrainedTokenizerFast`."""
    special_tokens: dict[str, str] = field(default_factory=lambda: {
        "pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]",
    })
    """Special tokens of a `tokenizer_file` tokenizer (those missing from its vocabulary are skipped)."""
    text_column: str = "text"
    """Column with the input text (classification, LM) or the word list (`tokens` for token classification)."""
    text_pair_column: str | None = None
    """Second text column for sentence-pair classification (e.g. `sentence2`)."""
    target_column: str = "target"
    """`seq2seq`: the target text column (the source is `text_column`); `causal_lm_generation`: the completion
    column (the prompt is `text_column`). Without it (prediction data), only sources / prompts are tokenised."""
    max_target_length: int = 128
    """`seq2seq`: longest tokenised target (longer ones are truncated). `causal_lm_generation` uses `max_length`
    for prompt + completion."""
    label_column: str = "label"
    """Column with the labels (a class per example, or a tag list per word for token classification)."""
    label_list: list[str] | None = None
    """The class names in id order; by default read from the model config or the sorted labels of the data."""
    max_length: int = 128
    """Longest tokenised input (longer ones are truncated)."""
    block_size: int = 128
    """Causal / masked LM: texts are concatenated and cut into blocks of this many tokens."""
    mlm_probability: float = 0.15
    """Masked LM: share of tokens masked by `DataCollatorForLanguageModeling`."""
    max_train_samples: int | None = None
    """Keep only the first this many training examples (quick runs)."""
    max_eval_samples: int | None = None
    """Keep only the first this many evaluation / prediction examples."""
    preprocessing_num_workers: int | None = None
    """Processes for `datasets.map` (the result is cached by `datasets`)."""

    def __post_init__(self) -> None:
        if self.dataset_name is not None and (self.train_file or self.validation_file or self.test_file):
            raise ValueError("data: give either `dataset_name` or files (`train_file`, ...), not both.")
        if self.tokenizer_name_or_path is not None and self.tokenizer_file is not None:
            raise ValueError("data: give either `tokenizer_name_or_path` or `tokenizer_file`, not both.")
        for name in ("max_length", "block_size", "max_target_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name}={getattr(self, name)} must be >= 1.")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"data.mlm_probability={self.mlm_probability} must be in (0, 1).")
