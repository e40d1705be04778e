"""PEFT adapter checkpoints: finding and loading the adapter files of a `PeftModel` (HF's PEFT branch of
`Trainer._load_from_checkpoint`, T:3708-3736, and `Trainer._load_best_model`, T:3781-3818).

A `PeftModel`'s `save_pretrained` writes `adapter_model.safetensors` and `adapter_config.json` (plus a `README.md`)
instead of `model.safetensors` (`weight_files.py`: which file holds a checkpoint's weights). That is what HF's
checkpoints of a PEFT model hold, and ours (the same `save_pretrained` call, through the atomic writer of
`checkpoint/io.py`).

Loading follows HF: with adapter sub-folders, "default" (when present) and each sub-folder's adapter are loaded under
their names and the active adapter is set again; otherwise the top-level adapter is loaded into the active adapter.
`peft`'s `load_adapter` copies into the existing parameters, so the optimizer keeps its references. Unlike HF (where
peft only warns about missing keys), an adapter of another model is refused first, naming the differing keys.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hf_lightning.checkpoint.weight_files import adapter_file, adapter_subfolders
from hf_lightning.model_wrappers import is_peft_model

__all__ = ["load_adapter_checkpoint"]

log = logging.getLogger(__name__)


def _checkpoint_root(weights: Path, model: Any) -> Path:
    """The checkpoint folder of an adapter weights file: its folder, or the one above for a named adapter's
    sub-folder (`<checkpoint>/<adapter name>/adapter_model.safetensors`)."""
    folder = weights.parent
    names = set(getattr(model, "peft_config", {}) or {})
    if folder.name in names and folder.name != "default" and adapter_file(folder.parent) is None:
        return folder.parent
    return folder


def _adapter_problems(model: Any, folder: Path, adapter_name: str) -> list[str]:
    """Why the adapter saved in `folder` does not fit `model`'s adapter `adapter_name` (keys or shapes), or []."""
    from peft.utils import get_peft_model_state_dict, load_peft_weights

    if adapter_name not in model.peft_config:
        return []  # a new adapter: peft builds it from the folder's adapter_config.json
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model, adapter_name=adapter_name).items()}
    saved = {k: tuple(v.shape) for k, v in load_peft_weights(str(folder), device="cpu").items()}
    problems = [f"{k}: checkpoint {list(saved[k])} vs model {list(shape)}"
                for k, shape in expected.items() if k in saved and saved[k] != shape]
    missing, unexpected = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing:
        problems.append(f"missing from the checkpoint: {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else ""))
    if unexpected:
        problems.append(f"not in the model: {', '.join(unexpected[:3])}" + (" ..." if len(unexpected) > 3 else ""))
    return problems


def load_adapter_checkpoint(model: Any, weights: str | Path, what: str = "resume_from_checkpoint") -> None:
    """Load the adapter(s) of the checkpoint holding `weights` into the `PeftModel` `model`, as HF does.

    Args:
        model: the `PeftModel` being trained.
        weights: the checkpoint's adapter weights file (`weight_files.adapter_weights_file`).
        what: the argument named in errors (`resume_from_checkpoint`, `load_best_model_at_end`).

    Raises:
        ValueError: `model` is not a PEFT model, or the adapter belongs to another model (names the keys).
    """
    weights = Path(weights)
    if not is_peft_model(model):
        raise ValueError(
            f"{what}: {weights.parent} holds a PEFT adapter ({weights.name}), but the model is a "
            f"{type(model).__name__}, not a peft.PeftModel. Wrap the base model as during training "
            "(`get_peft_model(model, config)`) before resuming, or load the adapter with "
            "`PeftModel.from_pretrained(model, folder)`."
        )
    root = _checkpoint_root(weights, model)
    active = model.active_adapters[0]
    if len(model.active_adapters) > 1:
        log.warning("Several active adapters (%s): only %s is loaded as trainable, as HF does.", model.active_adapters,
                    active)
    subfolders = adapter_subfolders(root)
    targets = [(root, "default" if subfolders else active)] if adapter_file(root) is not None else []
    targets += [(sub, sub.name) for sub in subfolders]
    problems = [f"{name}: {p}" for folder, name in targets for p in _adapter_problems(model, folder, name)]
    if problems:
        listed = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ValueError(f"{what}: the adapter in {root} belongs to a different model: {listed}.")
    for folder, name in targets:
        model.load_adapter(str(folder), name, is_trainable=name == active)
    if subfolders:
        model.set_adapter(active)
