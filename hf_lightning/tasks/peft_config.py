"""The CLI's `peft:` section: a LoRA adapter on the task's model (`peft.LoraConfig` fields), and loading a PEFT
checkpoint folder for `validate` / `predict`.

    peft: {r: 8, lora_alpha: 16, lora_dropout: 0.05, target_modules: [c_attn]}

The task decides `task_type` (a classifier then also trains and saves its head, peft's `modules_to_save`); a
`task_type` key in the section wins. `peft` is an optional extra: the error says how to install it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hf_lightning.checkpoint.verify import require_verified

__all__ = ["PEFT_TASK_TYPES", "apply_peft"]

PEFT_TASK_TYPES: dict[str, str | None] = {
    "text_classification": "SEQ_CLS",
    "token_classification": "TOKEN_CLS",
    "causal_lm": "CAUSAL_LM",
    "causal_lm_generation": "CAUSAL_LM",
    "seq2seq": "SEQ_2_SEQ_LM",
    "masked_lm": None,  # peft has no masked-LM task type: a plain PeftModel
}
"""peft's `task_type` for each built-in task (tasks registered later get none unless the section names one)."""


def _import_peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ValueError("peft: the `peft` section needs the peft package: pip install 'hf-lightning[peft]'.") from None
    return peft


def apply_peft(model: Any, values: dict[str, Any] | None, task_name: str, adapter_folder: str | None = None) -> Any:
    """`model` with a new LoRA adapter from `values`, or with the trained adapter of `adapter_folder`.

    Args:
        model: the base model the task built.
        values: the `peft` section (`LoraConfig` keyword arguments), or None.
        task_name: the task, for the default `task_type`.
        adapter_folder: a folder with `adapter_config.json` (a PEFT checkpoint given to validate / predict), loaded
            for inference; wins over `values`.

    Raises:
        ValueError: peft is not installed, or a key is not a `LoraConfig` field (the message lists them).
    """
    if adapter_folder is not None:
        require_verified(adapter_folder, "ckpt_path")  # an adapter checkpoint is verified before it is loaded
        return _import_peft().PeftModel.from_pretrained(model, adapter_folder)
    if not values:
        return model
    peft = _import_peft()
    fields = {f.name for f in dataclasses.fields(peft.LoraConfig) if f.init}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"peft: unknown LoraConfig key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}.")
    settings = {"task_type": PEFT_TASK_TYPES.get(task_name), **values}
    try:
        config = peft.LoraConfig(**settings)
        return peft.get_peft_model(model, config)
    except (ValueError, TypeError) as err:  # e.g. target_modules naming no layer of the model
        raise ValueError(f"peft: {err}") from None
