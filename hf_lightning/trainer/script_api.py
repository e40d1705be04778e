"""The `Trainer` methods HF's example scripts and user code call around `train()` / `evaluate()` / `predict()`.

`ScriptApiMixin` is one of `hf_lightning.Trainer`'s bases. Each method has HF's signature and output:

- `log_metrics(split, metrics)`: the `***** <split> metrics *****` block on stdout, values through `metrics_format`
  (HF's own formatting function, so the text is HF's character for character), on the world-zero process only.
- `save_metrics(split, metrics, combined=True)`: `<split>_results.json` (indent 4, sorted keys) and
  `all_results.json`, updated with this call's metrics as HF merges it.
- `save_state()`: `trainer_state.json` of the last run in `output_dir`.
- `is_world_process_zero()` / `is_local_process_zero()`: from the running `lightning.Trainer` when one exists, else
  from the arguments' process layout (`args/process.py`), as HF reads `args.process_index`.
- `create_model_card(...)`: README.md as HF writes it, offline (`trainer/model_card.py`).
- `push_to_hub()`: refused with one error (there is no hub here); `args.push_to_hub=True` is refused when the
  arguments are built (`args/support.py`), before any training.

`init_script_api` runs at the end of the constructor: it keeps the arguments object the user passed (what
`training_args.bin` holds, also for a `transformers.TrainingArguments`) and creates `output_dir` as HF's constructor
does, so an evaluation-only script can write its results there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from torch import nn
from transformers import TrainingArguments as HFTrainingArguments
from transformers.trainer_pt_utils import metrics_format as hf_metrics_format

from hf_lightning.args import TrainingArguments
from hf_lightning.trainer.model_card import write_model_card

__all__ = ["PassedArguments", "ScriptApiMixin", "format_metrics_block"]

PassedArguments = TrainingArguments | HFTrainingArguments
"""The arguments object a user hands to a `Trainer`: ours, or a `transformers.TrainingArguments` (a subclass too),
which is converted to ours for the run and kept as given for `training_args.bin`. A union rather than a Protocol:
the conversion reads HF's dataclass fields by name (`args/from_transformers.py`), and these two classes are what the
constructor documents."""


def format_metrics_block(split: str, metrics: Mapping[str, Any]) -> str:
    """The text `log_metrics` prints: a header, then `key = value` lines, keys sorted and aligned (transformers
    `trainer_pt_utils.py`: `log_metrics`)."""
    formatted = hf_metrics_format(dict(metrics))
    lines = [f"***** {split} metrics *****"]
    if formatted:
        key_width = max(len(str(key)) for key in formatted)
        value_width = max(len(str(value)) for value in formatted.values())
        lines += [f"  {key: <{key_width}} = {formatted[key]:>{value_width}}" for key in sorted(formatted)]
    return "\n".join(lines)


class ScriptApiMixin:
    """`log_metrics`, `save_metrics`, `save_state`, process checks and HF's small helpers, for `hf_lightning.Trainer`.

    The class using it provides `args`, `model`, `flow` (whose `state` is HF's `TrainerState`) and
    `lightning_trainer` (the facade does).
    """

    args: TrainingArguments
    model: nn.Module
    flow: Any  # the facade's `HFTrainerFlow` and `TransformerDataModule`, and its `lightning.Trainer` (or None):
    datamodule: Any  # Lightning objects, a layer above this torch-level module (tests/test_layering.py)
    lightning_trainer: Any
    passed_args: PassedArguments | None = None
    """The arguments object given to the constructor (`training_args.bin` holds it); `args` when none was given."""

    def init_script_api(self, passed_args: PassedArguments | None) -> None:
        """End of the constructor: remember the user's arguments object, create `output_dir` (T:605-606)."""
        self.passed_args = passed_args if passed_args is not None else self.args
        self.flow.checkpoints.saved_args = self.passed_args
        if self.args.should_save:
            os.makedirs(self.args.resolved_output_dir, exist_ok=True)

    # ----- which process -----
    def is_world_process_zero(self) -> bool:
        """Whether this is the global main process (the only one that writes results and model cards)."""
        trainer = self.lightning_trainer
        if trainer is not None:
            return bool(trainer.is_global_zero)
        return bool(self.args.process_index == 0)

    def is_local_process_zero(self) -> bool:
        """Whether this is the main process of its machine."""
        trainer = self.lightning_trainer
        if trainer is not None:
            return bool(trainer.local_rank == 0)
        return bool(self.args.local_process_index == 0)

    # ----- results -----
    @staticmethod
    def metrics_format(metrics: dict[str, float]) -> dict[str, Any]:
        """HF's human-readable values: runtimes as `h:mm:ss.cc`, `total_flos` in GF, floats rounded to 4 digits."""
        return dict(hf_metrics_format(dict(metrics)))

    def log_metrics(self, split: str, metrics: dict[str, float]) -> None:
        """Print the metrics of `split` (`train`, `eval`, `predict`...) in HF's aligned format, on process zero."""
        if not self.is_world_process_zero():
            return
        print(format_metrics_block(split, metrics))

    def save_metrics(self, split: str, metrics: dict[str, float], combined: bool = True) -> None:
        """Write `<output_dir>/<split>_results.json`; with `combined`, merge the metrics into `all_results.json`."""
        if not self.is_world_process_zero():
            return
        output_dir = self.args.resolved_output_dir
        os.makedirs(output_dir, exist_ok=True)
        _write_json(os.path.join(output_dir, f"{split}_results.json"), metrics)
        if combined:
            path = os.path.join(output_dir, "all_results.json")
            merged: dict[str, Any] = {}
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    merged = json.load(f)
            merged.update(metrics)
            _write_json(path, merged)

    def save_state(self) -> None:
        """Write the `TrainerState` (`log_history`, `global_step`, best checkpoint...) to
        `<output_dir>/trainer_state.json`."""
        if not self.is_world_process_zero():
            return
        output_dir = self.args.resolved_output_dir
        os.makedirs(output_dir, exist_ok=True)
        self.flow.state.save_to_json(os.path.join(output_dir, "trainer_state.json"))

    # ----- model card, hub -----
    def create_model_card(
        self, language: str | None = None, license: str | None = None, tags: str | list[str] | None = None,
        model_name: str | None = None, finetuned_from: str | None = None, tasks: str | list[str] | None = None,
        dataset_tags: str | list[str] | None = None, dataset: str | list[str] | None = None,
        dataset_args: str | list[str] | None = None,
    ) -> None:
        """Write `<output_dir>/README.md` from the run's results, as HF's `create_model_card`, without the hub
        (`trainer/model_card.py` says what differs)."""
        if not self.is_world_process_zero():
            return
        evaluated = self.datamodule.eval_datasets
        dataset_used = evaluated.get("") if evaluated and list(evaluated) == [""] else evaluated
        if dataset_used is None:
            dataset_used = self.datamodule.train_dataset
        trainer = self.lightning_trainer
        write_model_card(
            self.args.resolved_output_dir, self.model, self.args, self.flow.state.log_history, dataset_used,
            trainer.world_size if trainer is not None else self.args.world_size, language=language, license=license,
            tags=tags, model_name=model_name, finetuned_from=finetuned_from, tasks=tasks, dataset_tags=dataset_tags,
            dataset_name=dataset, dataset_args=dataset_args,
        )

    def push_to_hub(self, *args: Any, **kwargs: Any) -> Any:
        """Not available: hf_lightning has no hub access.

        Raises:
            NotImplementedError: always, saying what to do instead.
        """
        raise NotImplementedError(
            "Trainer.push_to_hub: hf_lightning does not talk to the Hugging Face Hub. Save with "
            "`trainer.save_model()` (and `trainer.create_model_card()` for README.md), then upload the folder with "
            "`huggingface_hub.upload_folder(repo_id=..., folder_path=args.output_dir)`."
        )


def _write_json(path: str, metrics: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(dict(metrics), f, indent=4, sort_keys=True)
