"""Model and optimizer state under sharding (FSDP2 / `ModelParallelStrategy`) and without it.

Under FSDP2 parameters are `DTensor` shards: `save_pretrained` needs the full state dict, gathered with
`torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True)` (a collective: every rank calls
it, rank 0 gets the tensors). The optimizer state stays sharded and is written with `torch.distributed.checkpoint`
into `optimizer_sharded/` of the checkpoint (every rank writes its part). Without sharding these functions fall back
to the plain `state_dict()` calls, so callers need not distinguish.

Tied weights (GPT-2's `lm_head.weight` is `transformer.wte.weight`): a gathered state dict holds a separate copy per
name, so `save_pretrained`, which drops a tied key only when both names share one tensor, would write it twice
(29 tensors for a tiny GPT-2 where a single-process save writes 28). `alias_tied_weights` gives the gathered dict
the model's own aliasing back, so every strategy saves the tensors a single-process `save_pretrained` saves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["alias_tied_weights", "full_model_state_dict", "is_sharded", "load_full_optimizer", "load_model_state",
           "load_sharded_optimizer", "save_sharded_optimizer", "tied_parameter_names"]


def is_sharded(model: nn.Module) -> bool:
    """Whether the model's parameters are FSDP2 `DTensor` shards."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")
"""Name parts that wrappers add to parameter names and that state dict keys do not have."""


def tied_parameter_names(model: nn.Module) -> dict[str, str]:
    """Each name of a parameter that is another's (tied), mapped to the first name of that parameter.

    Ties are read from the parameters themselves (one object under several names), which FSDP2, ZeRO-3 and FSDP1 with
    `use_orig_params` keep. FSDP1 without it hides the parameters in its flat ones; for names no parameter shows, a
    transformers model's own tie map (`all_tied_weights_keys`, what `from_pretrained` ties again) is used.
    """
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        for part in _WRAPPER_PARTS:
            name = name.replace(part, "")
        source = first.setdefault(id(param), name)
        if source != name:
            tied[name] = source
    visible = set(first.values()) | set(tied)
    hf_ties = getattr(model, "all_tied_weights_keys", None)
    if isinstance(hf_ties, dict):
        tied.update({target: source for target, source in hf_ties.items() if target not in visible})
    return tied


def _clean_name(name: str) -> str:
    """A parameter's name without the parts wrappers add (what state dict keys use)."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def alias_tied_weights(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """`state` (a gathered full state dict of `model`) with each tied name pointing at the same tensor as the first
    name of its parameter, as in the model's own `state_dict()` (in place; returned for chaining)."""
    for name, source in tied_parameter_names(model).items():
        if name in state and source in state:
            state[name] = state[source]
    return state


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def full_model_state_dict(model: nn.Module) -> dict[str, Any] | None:
    """The gathered full state dict on rank 0 for a sharded model (a collective), else None (use the model's own)."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))
    return alias_tied_weights(state, model)


def load_model_state(model: nn.Module, state_dict: dict[str, Any]) -> None:
    """Load a full state dict (every rank passes the whole dict) into a sharded or plain model, `strict=False`."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(model, state_dict, options=_options(full_state_dict=True, strict=False))
        return
    model.load_state_dict(state_dict, strict=False)


def save_sharded_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """Every rank writes its optimizer shard into `folder` (torch.distributed.checkpoint; a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(folder))


def _renamed(state: dict[str, Any], rename: Any) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter names (`get_optimizer_state_dict`'s) with each name renamed."""
    return {**state, "state": {rename(k): v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [rename(p) for p in g["params"]]} for g in state["param_groups"]]}


def _saved_prefix(folder: str | Path, names: list[str]) -> tuple[str, str]:
    """`(add, strip)`: how this optimizer's parameter names differ from those saved in `folder`: the FSDP1 root
    names them from the LightningModule (`model.` first), FSDP2 and plain models from the HF model."""
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    probe = names[0] if names else ""
    if any(k.startswith(f"optimizer.state.{probe}.") for k in saved):
        return "", ""
    if any(k.startswith(f"optimizer.state.model.{probe}.") for k in saved):
        return "model.", ""
    if probe.startswith("model.") and any(k.startswith(f"optimizer.state.{probe[6:]}.") for k in saved):
        return "", "model."
    return "", ""


def load_sharded_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """Every rank reads its part of an optimizer state saved sharded in `folder` (a collective).

    `torch.distributed.checkpoint` reshards it: written by another number of processes, or by FSDP2 / FSDP1 and read
    into another of them, DDP or one process (whole tensors then). The names of an FSDP1 root (`model.` first) and
    of the HF model are matched."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    current: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer))
    add, strip = _saved_prefix(folder, list(current["state"]))
    state = {"optimizer": _renamed(current, lambda n: add + n.removeprefix(strip) if strip else add + n)}
    dcp.load(state, checkpoint_id=str(folder))
    loaded = _renamed(state["optimizer"], lambda n: strip + n.removeprefix(add) if add else strip + n)
    set_optimizer_state_dict(model, optimizer, loaded)


def load_full_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """A whole optimizer state (`optimizer.pt`: a plain `optimizer.state_dict()` written by DDP, one process or
    `transformers.Trainer`) into an optimizer over `model`'s sharded parameters (FSDP2 `DTensor`s, the FSDP1 root):
    every rank passes the whole state, each keeps its shard (`set_optimizer_state_dict` with `full_state_dict`).

    The saved state is keyed by position in its parameter groups; the same grouping of the same model orders the
    parameters alike, so position `i` is the `i`-th parameter of this optimizer's groups, named by `model`.

    Raises:
        ValueError: the saved groups do not hold as many parameters as this optimizer's (another model).
    """
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = {id(p): _clean_name(name) for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved_count = sum(len(group["params"]) for group in saved["param_groups"])
    if saved_count != len(order):
        raise ValueError(f"the saved optimizer state holds {saved_count} parameters, this optimizer {len(order)}: "
                         "it belongs to another model or another parameter grouping.")
    state = {order[int(index)]: value for index, value in saved["state"].items()}
    groups = [{**group, "params": [order[int(i)] for i in group["params"]]} for group in saved["param_groups"]]
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups},
                             options=_options(full_state_dict=True))
