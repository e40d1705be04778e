"""The model inside its wrappers: PEFT, `torch.compile`, DDP.

HF keeps two names for the model (T:343-346, 510-511): `model`, the user's model (a `PreTrainedModel` or a
`PeftModel`), which is saved and loaded, and `model_wrapped`, the outermost wrapper (compiled, DDP...), which is
called. It inspects the PEFT *base* model for the forward signature, the label names and the loss type
(`unwrap_peft_model`, TU:69-97; T:515-545, 1179-1191).

- `is_peft_model`: a `peft.PeftModel` / `PeftMixedModel` (without importing peft when nothing imported it: no PEFT
  model can exist then).
- `without_compile`: the module inside `torch.compile` (`OptimizedModule._orig_mod`) and DDP-like wrappers (their
  `module`); its `state_dict()` keys carry no `_orig_mod.` / `module.` prefix.
- `unwrap_model`: the transformers model itself, inside PEFT too; what HF inspects.
"""

from __future__ import annotations

import sys

from torch import nn

__all__ = ["is_compiled", "is_peft_model", "unwrap_model", "without_compile"]


def is_peft_model(model: object) -> bool:
    """Whether `model` is a `peft.PeftModel` or `peft.PeftMixedModel` (HF's `_is_peft_model`, TU:69-72)."""
    peft = sys.modules.get("peft")  # a PEFT model cannot exist unless peft was imported: never import it here
    if peft is None:
        return False
    classes = tuple(getattr(peft, name) for name in ("PeftModel", "PeftMixedModel") if hasattr(peft, name))
    return isinstance(model, classes)


def is_compiled(model: object) -> bool:
    """Whether `model` is the wrapper `torch.compile(module)` returns (an `OptimizedModule`)."""
    dynamo = sys.modules.get("torch._dynamo.eval_frame")  # loaded by the first torch.compile call
    return dynamo is not None and isinstance(model, dynamo.OptimizedModule)


def without_compile(model: nn.Module) -> nn.Module:
    """The module inside `torch.compile` and DDP wrappers (a PEFT model stays one: it is what is saved)."""
    while True:
        # `_orig_mod`: an OptimizedModule's module; `module`: DDP's, DataParallel's, FSDP1's, DeepSpeed's
        inner = getattr(model, "_orig_mod", None) if is_compiled(model) else getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def unwrap_model(model: nn.Module) -> nn.Module:
    """The transformers model inside compile, DDP and PEFT wrappers: what HF inspects (TU:75-97)."""
    model = without_compile(model)
    if not is_peft_model(model):
        return model
    get_base = getattr(model, "get_base_model", None)  # PeftMixedModel has none
    base = get_base() if callable(get_base) else getattr(model.base_model, "model")  # noqa: B009  (peft's attribute)
    return without_compile(base)
