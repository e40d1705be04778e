"""HF's strategy arguments (`fsdp` / `fsdp_config`, `ddp_*`, `deepspeed`) read as HF reads them (pure Python).

`transformers.TrainingArguments._process_fsdp_args` (TA:2775-2885) and `_apply_legacy_fsdp_to_config` (TA:2888-2938)
normalise `fsdp` / `fsdp_config`; `Trainer._build_accelerator_args` (T:743-765) builds the DDP options. This module
reproduces those rules without torch, Lightning or accelerate, and returns plain settings that
`hf_lightning.parallel.strategies` turns into Lightning strategies:

- `fsdp_config["version"]` 2 (HF 5's default) -> FSDP2 (`fully_shard`) through Lightning's `ModelParallelStrategy`
  with a default per-layer policy; 1 -> FSDP1, `HFFSDPStrategy` (Lightning's `FSDPStrategy`, the update outside the
  FSDP root's forward).
- `deepspeed` -> Lightning's `DeepSpeedStrategy` with HF's `"auto"` values filled (`args/deepspeed_config.py`).
- otherwise, when Lightning runs several processes with DDP: HF's `ddp_*` options.

`strategy_problems` lists what HF itself refuses and what has no Lightning counterpart, for one error at construction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FSDPSettings", "DDPSettings", "StrategyRequest", "STRATEGY_FIELDS", "fsdp_settings", "ddp_settings",
    "load_json_config", "strategy_fields_set", "strategy_problems",
]

STRATEGY_FIELDS = (
    "fsdp", "fsdp_config", "deepspeed", "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
    "ddp_static_graph", "ddp_backend", "ddp_timeout",
)
"""The HF fields that choose or configure the distributed strategy (an explicit Lightning strategy replaces them)."""

_DEFAULTS: dict[str, Any] = {
    "fsdp": None, "fsdp_config": None, "deepspeed": None, "ddp_find_unused_parameters": None,
    "ddp_bucket_cap_mb": None, "ddp_broadcast_buffers": None, "ddp_static_graph": None, "ddp_backend": None,
    "ddp_timeout": 1800,
}

# accelerate's FSDP_SHARDING_STRATEGY and FSDP_AUTO_WRAP_POLICY (accelerate/utils/constants.py), lower-cased as
# HF's `FSDPOption` values
SHARDING_STRATEGIES = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2")
AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")
_KNOWN_FSDP_KEYS = {
    "version", "reshard_after_forward", "cpu_offload", "activation_checkpointing", "cpu_ram_efficient_loading",
    "state_dict_type", "auto_wrap_policy", "transformer_layer_cls_to_wrap", "min_num_params", "xla",
    "xla_fsdp_settings", "xla_fsdp_v2", "xla_fsdp_grad_ckpt", "forward_prefetch", "backward_prefetch",
    "use_orig_params", "sync_module_states", "limit_all_gathers",
}


def _to_bool(value: Any, key: str) -> bool:
    """HF's `str_to_bool(str(value).lower())` (TA:2950-2962): `true/yes/1...` or `false/no/0...`."""
    text = str(value).lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"fsdp_config[{key!r}]={value!r} is not a truth value (true/false, yes/no, 1/0).")


@dataclass(frozen=True)
class FSDPSettings:
    """`fsdp` + `fsdp_config` after HF's normalisation.

    Attributes:
        version: 2 (FSDP2, `fully_shard`) or 1 (FSDP1, `FullyShardedDataParallel`).
        reshard_after_forward: FSDP2: a bool (`full_shard` True, `shard_grad_op` False); FSDP1: the sharding
            strategy name (`full_shard`, `shard_grad_op`, `no_shard`, `hybrid_shard`, `hybrid_shard_zero2`).
        cpu_offload: offload parameters (and gradients) to the CPU (`offload`).
        auto_wrap_policy: `TRANSFORMER_BASED_WRAP` (the layers), `SIZE_BASED_WRAP` (`min_num_params`) or `NO_WRAP`.
        layer_classes: `transformer_layer_cls_to_wrap`; None: the model's `_no_split_modules`.
        min_num_params: the size threshold of `SIZE_BASED_WRAP`.
        activation_checkpointing: FSDP's own activation checkpointing of the wrapped layers.
        cpu_ram_efficient_loading: the weights of global rank 0 are broadcast into every rank's shards.
        state_dict_type: `FULL_STATE_DICT` or `SHARDED_STATE_DICT` (see README: checkpoints hold the full weights).
        forward_prefetch / backward_prefetch / use_orig_params / sync_module_states / limit_all_gathers: FSDP1 only.
    """

    version: int = 2
    reshard_after_forward: bool | str = True
    cpu_offload: bool = False
    auto_wrap_policy: str = "TRANSFORMER_BASED_WRAP"
    layer_classes: tuple[str, ...] | None = None
    min_num_params: int = 0
    activation_checkpointing: bool = False
    cpu_ram_efficient_loading: bool = False
    state_dict_type: str = "FULL_STATE_DICT"
    forward_prefetch: bool = False
    backward_prefetch: str = "NO_PREFETCH"
    use_orig_params: bool = True
    sync_module_states: bool = True
    limit_all_gathers: bool | None = None


def load_json_config(value: dict[str, Any] | str, name: str) -> dict[str, Any]:
    """A config given as a dict or as the path of a JSON file (HF's `fsdp_config` / `deepspeed`), as a new dict.

    Raises:
        FileNotFoundError: the path does not exist (names the argument).
        ValueError: the file is not JSON, or holds something other than an object.
    """
    if isinstance(value, dict):
        return json.loads(json.dumps(value))  # a deep copy: HF fills the values in place, we never touch the user's
    try:
        with open(value, encoding="utf-8") as f:
            loaded = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"`{name}`={value!r}: no such JSON file.") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"`{name}`={value!r} is not valid JSON: {err}.") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"`{name}`={value!r} must hold a JSON object, got {type(loaded).__name__}.")
    return loaded


def _apply_legacy_options(fsdp: Any, config: dict[str, Any]) -> None:
    """HF's `_apply_legacy_fsdp_to_config` (TA:2888-2938): `"full_shard auto_wrap offload"` into `config`."""
    items = fsdp.split() if isinstance(fsdp, str) else list(fsdp)
    version = int(config.get("version", 2))
    for item in items:
        if item in SHARDING_STRATEGIES:
            if version == 2:
                if item not in ("full_shard", "shard_grad_op"):
                    raise ValueError(
                        f"`fsdp={item}` is only available with FSDP1. Set `fsdp_config['version'] = 1` to use it "
                        "(as in transformers)."
                    )
                config.setdefault("reshard_after_forward", item == "full_shard")
            else:
                config.setdefault("reshard_after_forward", item)
        elif item == "offload":
            config.setdefault("cpu_offload", True)
        elif item != "auto_wrap":
            raise ValueError(
                f"Unknown `fsdp` option: {item} (allowed: {', '.join(SHARDING_STRATEGIES)}, offload, auto_wrap)."
            )


def fsdp_settings(fsdp: Any, fsdp_config: dict[str, Any] | str | None) -> FSDPSettings | None:
    """`fsdp` / `fsdp_config` as HF's `_process_fsdp_args` reads them, or None when FSDP is off.

    Raises:
        ValueError: an unknown `fsdp` option or `auto_wrap_policy`, a sharding strategy of FSDP1 with FSDP2, XLA FSDP,
            an unknown `fsdp_config` key, a value that is not a truth value.
        FileNotFoundError: `fsdp_config` names a missing JSON file.
    """
    if not fsdp:
        return None
    config = {} if fsdp_config is None else load_json_config(fsdp_config, "fsdp_config")
    config = {(k[5:] if k.startswith("fsdp_") else k): v for k, v in config.items()}
    if isinstance(fsdp, (str, list, tuple)):
        _apply_legacy_options(fsdp, config)
    unknown = sorted(set(config) - _KNOWN_FSDP_KEYS)
    if unknown:
        raise ValueError(f"fsdp_config: unknown keys {unknown} (transformers' keys: {sorted(_KNOWN_FSDP_KEYS)}).")
    if config.get("xla") and _to_bool(config["xla"], "xla"):
        raise ValueError("fsdp_config['xla']: XLA FSDP is not supported (no TPU backend); remove `xla`.")
    version = int(config.get("version", 2))
    if version not in (1, 2):
        raise ValueError(f"fsdp_config['version']={version!r}: must be 1 or 2.")
    policy = config.get("auto_wrap_policy", AUTO_WRAP_POLICIES[0])
    if policy not in AUTO_WRAP_POLICIES:
        raise ValueError(f"fsdp_config: `auto_wrap_policy` must be one of {AUTO_WRAP_POLICIES}, got {policy}.")
    layers = config.get("transformer_layer_cls_to_wrap")
    if isinstance(layers, str):
        layers = [layers]
    state_dict_type = str(config.get("state_dict_type", "FULL_STATE_DICT"))
    if state_dict_type not in STATE_DICT_TYPES:
        raise ValueError(f"fsdp_config['state_dict_type']={state_dict_type!r}: must be one of {STATE_DICT_TYPES}.")
    reshard: bool | str
    if version == 2:
        reshard = _to_bool(config.get("reshard_after_forward", True), "reshard_after_forward")
    else:
        reshard = str(config.get("reshard_after_forward", "full_shard")).lower()
        if reshard not in SHARDING_STRATEGIES:
            raise ValueError(f"fsdp_config['reshard_after_forward']={reshard!r} (FSDP1): must be one of "
                             f"{SHARDING_STRATEGIES}.")
    prefetch = str(config.get("backward_prefetch", "NO_PREFETCH")).upper()
    if prefetch not in BACKWARD_PREFETCH:
        raise ValueError(f"fsdp_config['backward_prefetch']={prefetch!r}: must be one of {BACKWARD_PREFETCH}.")
    limit = config.get("limit_all_gathers")
    return FSDPSettings(
        version=version,
        reshard_after_forward=reshard,
        cpu_offload=_to_bool(config.get("cpu_offload", False), "cpu_offload"),
        auto_wrap_policy=policy,
        layer_classes=tuple(layers) if layers is not None else None,
        min_num_params=int(config.get("min_num_params", 0)),
        activation_checkpointing=_to_bool(config.get("activation_checkpointing", False), "activation_checkpointing"),
        cpu_ram_efficient_loading=_to_bool(config.get("cpu_ram_efficient_loading", False),
                                           "cpu_ram_efficient_loading"),
        state_dict_type=state_dict_type,
        forward_prefetch=_to_bool(config.get("forward_prefetch", False), "forward_prefetch"),
        backward_prefetch=prefetch,
        use_orig_params=_to_bool(config.get("use_orig_params", True), "use_orig_params"),
        sync_module_states=_to_bool(config.get("sync_module_states", True), "sync_module_states"),
        limit_all_gathers=_to_bool(limit, "limit_all_gathers") if limit is not None else None,
    )


@dataclass(frozen=True)
class DDPSettings:
    """HF's DDP options (`Trainer._build_accelerator_args`, T:743-765) and process-group settings (TA:1876-1891).

    Attributes:
        find_unused_parameters: `ddp_find_unused_parameters`; None: HF's default, decided with the model
            (`default_find_unused_parameters`).
        ddp_kwargs: the other `DistributedDataParallel` options that were set (`bucket_cap_mb`, `broadcast_buffers`,
            `static_graph`).
        backend: `ddp_backend` (None: Lightning's default for the device).
        timeout_s: `ddp_timeout`, seconds.
    """

    find_unused_parameters: bool | None
    ddp_kwargs: dict[str, Any]
    backend: str | None
    timeout_s: int

    @staticmethod
    def default_find_unused_parameters(is_pretrained_model: bool, model_checkpoints: bool, args_checkpoint: bool
                                       ) -> bool:
        """HF's default (T:749-756): a `PreTrainedModel` finds unused parameters unless activation checkpointing is
        on (it breaks checkpointing); any other module does."""
        return not (model_checkpoints or args_checkpoint) if is_pretrained_model else True


def ddp_settings(args: Any) -> DDPSettings:
    """The DDP settings of `args` (a `TrainingArguments`)."""
    kwargs = {
        name: getattr(args, f"ddp_{name}")
        for name in ("bucket_cap_mb", "broadcast_buffers", "static_graph")
        if getattr(args, f"ddp_{name}") is not None
    }
    return DDPSettings(args.ddp_find_unused_parameters, kwargs, args.ddp_backend, int(args.ddp_timeout))


def strategy_fields_set(args: Any) -> list[str]:
    """The strategy fields of `args` that differ from HF's defaults, in `STRATEGY_FIELDS` order."""
    return [name for name in STRATEGY_FIELDS if getattr(args, name) != _DEFAULTS[name]]


def strategy_problems(args: Any) -> list[str]:
    """What HF refuses about the strategy fields, and what has no Lightning counterpart (one line each)."""
    problems = []
    if args.fsdp and args.deepspeed:
        # HF's words (T:474-477)
        problems.append("Using --fsdp xxx together with --deepspeed is not possible, deactivate one of those flags.")
    try:
        settings = fsdp_settings(args.fsdp, args.fsdp_config)
    except (ValueError, FileNotFoundError) as err:
        return [*problems, str(err)]
    if settings is not None and settings.activation_checkpointing and args.activation_checkpointing:
        # HF's check (T:878-884)
        problems.append(
            "`fsdp_config['activation_checkpointing']` (FSDP's own activation checkpointing) and the "
            "`activation_checkpointing` training argument can't both be set to True. Use FSDP's activation "
            "checkpointing when using FSDP."
        )
    if args.ddp_timeout is not None and int(args.ddp_timeout) <= 0:
        problems.append(f"`ddp_timeout`={args.ddp_timeout!r}: must be a positive number of seconds.")
    return problems


@dataclass(frozen=True)
class StrategyRequest:
    """What the HF strategy fields ask of Lightning, resolved against the model (built by
    `hf_lightning.parallel.strategies.strategy_request`; a fresh Lightning strategy is made from it for every run).

    Attributes:
        args: the training arguments (DeepSpeed fills its `"auto"` values from them when the run starts).
        fsdp: the FSDP settings, or None.
        deepspeed: the user's DeepSpeed config (a copy, `"auto"` values unfilled), or None.
        ddp: the DDP settings (also the process-group backend and timeout of the FSDP strategies).
        find_unused_parameters: `ddp_find_unused_parameters`, or HF's default for the model.
        layer_names: the model's layer class names for FSDP1's wrap policy (`transformer_layer_cls_to_wrap`, else
            `_no_split_modules`).
    """

    args: Any
    fsdp: FSDPSettings | None
    deepspeed: dict[str, Any] | None
    ddp: DDPSettings
    find_unused_parameters: bool
    layer_names: tuple[str, ...] = ()
