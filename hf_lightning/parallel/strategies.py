"""HF's strategy arguments as Lightning strategies (README "Swapping strategies").

`strategy_request` reads the arguments against the model once, when the trainer is built; `build_strategy` makes a
fresh Lightning strategy from it for every run (a strategy object belongs to one `lightning.Trainer`):

- `fsdp=...` with `fsdp_config["version"]` 2 (HF's default): `HFFSDP2Strategy`, a `ModelParallelStrategy` over every
  process; `TransformerModule.configure_model` shards the model per layer (`parallel/fsdp2.py`).
- `fsdp=...` with version 1: `HFFSDPStrategy`, Lightning's `FSDPStrategy` with the matching sharding strategy, offload
  and wrap policies, whose training step runs outside the FSDP root's forward (see the class).
- `deepspeed=<dict or JSON file>`: `HFDeepSpeedStrategy`, Lightning's `DeepSpeedStrategy` with HF's `"auto"` values
  filled when the run starts.
- neither: Lightning's own choice; when that is DDP (several processes), HF's `ddp_*` options are given to it.

`ddp_backend` / `ddp_timeout` also apply to the FSDP strategies (HF passes them to the process group), `ddp_timeout`
to DeepSpeed's (HF does not pass `ddp_backend` there).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy, Strategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.types import LRSchedulerConfig
from torch import nn
from torch.optim import Optimizer
from typing_extensions import override

from hf_lightning._lightning_compat import set_ddp_options
from hf_lightning.args import TrainingArguments
from hf_lightning.args.deepspeed_config import (
    DeepSpeedFill,
    fill_finalize_stage,
    fill_process_stage,
    for_lightning,
    mismatch_error,
    zero_stage,
)
from hf_lightning.args.parallel import (
    DDPSettings,
    FSDPSettings,
    StrategyRequest,
    ddp_settings,
    fsdp_settings,
    load_json_config,
)
from hf_lightning.contracts import flow_model
from hf_lightning.module.optim import build_scheduler

__all__ = ["HFFSDP2Strategy", "HFFSDPStrategy", "HFDeepSpeedStrategy", "strategy_request", "build_strategy",
           "adopt_ddp_options", "scheduler_base_optimizer"]


class HFFSDP2Strategy(ModelParallelStrategy):
    """FSDP2 over every process (data parallel only), carrying HF's FSDP settings for the default sharding.

    `TransformerModule.configure_model` shards the model with `fsdp_settings` (`parallel/fsdp2.py`); a plain
    `ModelParallelStrategy` gets the same sharding with HF's default settings.

    Args:
        fsdp_settings: HF's `fsdp` / `fsdp_config`, read by `args.parallel.fsdp_settings`.
        process_group_backend: `ddp_backend` (None: Lightning's default for the device).
        timeout: `ddp_timeout`.
    """

    def __init__(self, fsdp_settings: FSDPSettings, process_group_backend: str | None = None,
                 timeout: timedelta | None = None) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, process_group_backend=process_group_backend,
                         timeout=timeout)
        self.fsdp_settings = fsdp_settings

    @override
    def setup_environment(self) -> None:
        # Lightning's "auto" puts the processes of a node on the tensor-parallel axis: pure FSDP wants them all on
        # the data-parallel one
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


class HFFSDPStrategy(FSDPStrategy):
    """Lightning's `FSDPStrategy` (FSDP1) with `training_step` called directly, not from inside the FSDP root's forward.

    Lightning calls a LightningModule's `training_step` through the root's forward (`_forward_redirection`) so that a
    step's one forward is the root's and its backward, run by Lightning after the step returns, is hooked by it.
    `TransformerModule.training_step` is a whole update: every micro-batch's forward and backward, then the optimizer
    step. Inside the root's forward FSDP1 cannot work (torch `fsdp/_runtime_utils.py`): the root's post-backward hook
    asserts its handle is in a backward state (it is still `FORWARD`), and the root's pre-backward hook, the one that
    queues `_post_backward_final_callback` (which moves the reduced gradient shards into `.grad`), is registered only
    on the outputs of a finished root forward. So the step runs outside, and each micro-batch's forward is a root
    forward of its own (`parallel.runtime.step_model`), as HF's is through accelerate's FSDP wrapper.

    A subclass, so Lightning's check that FSDP runs on CUDA (which looks for `FSDPStrategy` itself) does not apply:
    FSDP1 also runs on CPU processes (gloo), which is how tests/test_fsdp1.py checks it.
    """

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self.lightning_module is not None
        with self.precision_plugin.train_step_context():
            return self.lightning_module.training_step(*args, **kwargs)

    @override
    def _setup_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if self.root_device.type != "cpu" or any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super()._setup_model(model)
        # torch runs FSDP1 on CPU processes when told the device (`device_id`), which Lightning passes for CUDA only:
        # wrap here, then Lightning's setup of an already wrapped model (activation checkpointing), without the
        # policy it would otherwise warn about and drop. torch's `sync_module_states` refuses CPU tensors: rank 0's
        # weights are broadcast here instead, before wrapping.
        kwargs = dict(self.kwargs)
        if kwargs.pop("sync_module_states", False):
            import torch.distributed as dist

            for tensor in model.state_dict().values():
                dist.broadcast(tensor.data, src=0)
        model = FullyShardedDataParallel(module=model, cpu_offload=self.cpu_offload,
                                         mixed_precision=self.mixed_precision_config,
                                         sharding_strategy=self.sharding_strategy, device_id=self.root_device,
                                         **kwargs)
        policy = self.kwargs.pop("auto_wrap_policy", None)
        try:
            return super()._setup_model(model)
        finally:
            if policy is not None:
                self.kwargs["auto_wrap_policy"] = policy


class HFDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's `DeepSpeedStrategy` with an HF config: `"auto"` values filled from the arguments when the run
    starts (world size, model and number of updates are known then), as `HfTrainerDeepSpeedConfig` does.

    The optimizer and the scheduler follow HF's four combinations (transformers `integrations/deepspeed.py`,
    `deepspeed_optim_sched`, with accelerate's `DummyOptim` / `DummyScheduler`):

    - no `optimizer` / no `scheduler` section: HF's optimizer and HF's scheduler (`configure_optimizers`).
    - `optimizer` section only: DeepSpeed's optimizer, HF's scheduler (`lr_scheduler_type`) built on the engine's
      *basic* optimizer (`scheduler_base_optimizer`): HF hands DeepSpeed a scheduler callable, which the engine
      calls with `engine.basic_optimizer`. DeepSpeed's ZeRO wrapper is not a `torch.optim.Optimizer`.
    - `scheduler` section (with or without `optimizer`): DeepSpeed's scheduler from the section, on the optimizer in
      use; HF's own scheduler is not passed to the engine (DeepSpeed would take it and ignore the section).

    Lightning steps the scheduler (it detaches it from the engine), once per update as HF's engine does. Every run
    builds its optimizer afresh, as HF's `deepspeed_init` does (see `_init_optimizers`).

    Args:
        hf_config: the user's DeepSpeed config (`"auto"` values unfilled).
        args: the training arguments.
        timeout: `ddp_timeout`.
    """

    def __init__(self, hf_config: dict[str, Any], args: TrainingArguments, timeout: timedelta | None = None) -> None:
        self._hf_config = hf_config
        self._hf_args = args
        self._hf_filled = False
        super().__init__(config=for_lightning(hf_config), timeout=timeout)

    def _fill_hf_config(self) -> None:
        if self._hf_filled or self.lightning_module is None:
            return
        trainer = self.lightning_module.trainer
        args = self._hf_args
        config, mismatches = fill_process_stage(self._hf_config, DeepSpeedFill.from_args(args, self.world_size))
        model = flow_model(self.lightning_module)  # built from HF's arguments: the flow's module
        steps = int(trainer.max_steps)
        config, more = fill_finalize_stage(config, getattr(model, "config", None), steps, args.get_warmup_steps(steps))
        if mismatches or more:
            raise ValueError(mismatch_error(mismatches + more))
        self.config = for_lightning(config)
        self._hf_filled = True

    @contextmanager
    @override
    def model_sharded_context(self) -> Any:
        self._fill_hf_config()  # Lightning reads the config here first (ZeRO-3's `zero.Init`)
        with super().model_sharded_context():
            yield

    @override
    def _init_optimizers(self) -> tuple[Optimizer, LRSchedulerConfig | None]:
        module: Any = self.lightning_module  # a TransformerModule (HF's `optimizer`), or any LightningModule
        if getattr(module, "optimizer", None) is not None:
            # HF's `deepspeed_init` ("important for when deepspeed_init is used as re-init"): a fresh optimizer per
            # run. An earlier run's engine made its optimizer DeepSpeed's: ZeRO replaced the parameter groups' params
            # with its flat fp32 partitions, so a next engine would train those copies, not the model.
            module.optimizer = None
        optimizer, scheduler = super()._init_optimizers()
        if "scheduler" in (self.config or {}):
            scheduler = None  # DeepSpeed builds the section's scheduler only without a client one (HF's DummyScheduler)
        return optimizer, scheduler

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        self._fill_hf_config()
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if not self.lr_scheduler_configs and "optimizer" in (self.config or {}):
            optimizer = scheduler_base_optimizer(self.deepspeed_engine)
            scheduler = build_scheduler(optimizer, self._hf_args, int(trainer.max_steps))
            self.lr_scheduler_configs = [LRSchedulerConfig(scheduler, interval="step")]
        module: Any = self.lightning_module
        if self.lr_scheduler_configs and hasattr(module, "lr_scheduler"):
            # HF's `trainer.lr_scheduler` is the scheduler in use; a later fit builds its own again
            module.lr_scheduler = self.lr_scheduler_configs[0].scheduler
            module._created_lr_scheduler = True


def scheduler_base_optimizer(engine: Any) -> Optimizer:
    """The torch optimizer HF's scheduler is built on when DeepSpeed's config has an `optimizer` section.

    DeepSpeed builds the section's optimizer (`engine.basic_optimizer`, e.g. `torch.optim.AdamW`) and wraps it (ZeRO:
    `DeepSpeedZeroOptimizer`, `DeepSpeedZeroOptimizer_Stage3`; bf16 / fp16: `BF16_Optimizer`, `FP16_Optimizer`);
    the wrappers are not `torch.optim.Optimizer`s, so torch's schedulers refuse them. HF gets its scheduler built on
    the basic optimizer (the engine calls HF's scheduler callable with it), and the wrappers step that object.

    Raises:
        TypeError: the engine has no torch optimizer to schedule (named, with what to do).
    """
    basic = getattr(engine, "basic_optimizer", None)
    if not isinstance(basic, Optimizer):
        raise TypeError(
            f"DeepSpeed's `optimizer` section gave the engine a {type(basic).__name__}, not a torch.optim.Optimizer: "
            "HF's `lr_scheduler_type` cannot be built on it. Add a `scheduler` section to the DeepSpeed config, or "
            "remove the `optimizer` section to use HF's optimizer (`optim`).")
    return basic


def _is_pretrained(model: nn.Module) -> bool:
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def strategy_request(args: TrainingArguments, model: nn.Module | None) -> StrategyRequest:
    """What `args`' strategy fields ask for, resolved against `model` (checked: `TrainingArguments` did).

    Raises:
        ValueError: `auto_find_batch_size` with DeepSpeed ZeRO-3 (HF's refusal), a DeepSpeed value that does not match
            the arguments (HF's message; the per-process batch checks only), or a missing FSDP layer class.
    """
    settings = fsdp_settings(args.fsdp, args.fsdp_config)
    ddp: DDPSettings = ddp_settings(args)
    find_unused = ddp.find_unused_parameters
    if find_unused is None:
        checkpointing = bool(getattr(model, "is_activation_checkpointing", False))
        find_unused = DDPSettings.default_find_unused_parameters(
            model is not None and _is_pretrained(model), checkpointing, bool(args.activation_checkpointing))
    deepspeed = load_json_config(args.deepspeed, "deepspeed") if args.deepspeed else None
    if deepspeed is not None:
        if args.auto_find_batch_size and zero_stage(deepspeed) == 3:
            raise ValueError("`auto_find_batch_size` isn't supported yet with DeepSpeed Zero-3. Please consider using "
                             "Zero-2, Zero-1, or FSDP")  # HF's words (T:898-906)
        # the values known now are checked now (one process: the batch total is checked again at the start)
        _, mismatches = fill_process_stage({k: v for k, v in deepspeed.items() if k != "train_batch_size"},
                                           DeepSpeedFill.from_args(args, 1))
        if mismatches:
            raise ValueError(mismatch_error(mismatches))
    names: tuple[str, ...] = ()
    if settings is not None and model is not None and settings.auto_wrap_policy == "TRANSFORMER_BASED_WRAP":
        from hf_lightning.parallel.fsdp2 import layer_classes

        names = tuple(cls.__name__ for cls in layer_classes(model, settings.layer_classes))
    return StrategyRequest(args, settings, deepspeed, ddp, bool(find_unused), names)


def _fsdp1(request: StrategyRequest, timeout: timedelta) -> Strategy:
    """`HFFSDPStrategy` for HF's FSDP1 settings (HF: accelerate's FSDP1 plugin arguments)."""
    from torch.distributed.fsdp import BackwardPrefetch
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy, size_based_auto_wrap_policy

    settings = request.fsdp
    assert settings is not None
    policy: Any = None
    if settings.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" and request.layer_names:
        names = frozenset(request.layer_names)
        policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: type(m).__name__ in names)
    elif settings.auto_wrap_policy == "SIZE_BASED_WRAP":
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=settings.min_num_params)
    kwargs: dict[str, Any] = {
        "sharding_strategy": str(settings.reshard_after_forward).upper(),
        "cpu_offload": settings.cpu_offload,
        "auto_wrap_policy": policy,
        "state_dict_type": "full",
        "process_group_backend": request.ddp.backend,
        "timeout": timeout,
        "forward_prefetch": settings.forward_prefetch,
        "use_orig_params": settings.use_orig_params,
        # HF's cpu_ram_efficient_loading needs rank 0's weights everywhere: FSDP1 syncs them at wrapping
        "sync_module_states": settings.sync_module_states or settings.cpu_ram_efficient_loading,
    }
    if settings.backward_prefetch != "NO_PREFETCH":
        kwargs["backward_prefetch"] = BackwardPrefetch[settings.backward_prefetch]
    if settings.limit_all_gathers is not None:
        kwargs["limit_all_gathers"] = settings.limit_all_gathers
    if settings.activation_checkpointing:
        if policy is None:
            raise ValueError("fsdp_config['activation_checkpointing'] needs layers to checkpoint: an auto wrap policy "
                             "other than NO_WRAP, and layer classes (`transformer_layer_cls_to_wrap`).")
        kwargs["activation_checkpointing_policy"] = policy
    return HFFSDPStrategy(**kwargs)


def build_strategy(request: StrategyRequest) -> Strategy | str:
    """A fresh Lightning strategy for one run, or `"auto"` (Lightning chooses; see `adopt_ddp_options`)."""
    timeout = timedelta(seconds=request.ddp.timeout_s)
    if request.deepspeed is not None:
        return HFDeepSpeedStrategy(request.deepspeed, request.args, timeout=timeout)
    if request.fsdp is not None and request.fsdp.version == 2:
        return HFFSDP2Strategy(request.fsdp, process_group_backend=request.ddp.backend, timeout=timeout)
    if request.fsdp is not None:
        return _fsdp1(request, timeout)
    return "auto"


def adopt_ddp_options(strategy: Strategy, request: StrategyRequest) -> None:
    """HF's DDP options for the `DDPStrategy` Lightning chose itself (several processes, no strategy given)."""
    if type(strategy) is not DDPStrategy:  # one process, or a strategy of its own
        return
    kwargs = {"find_unused_parameters": request.find_unused_parameters, **request.ddp.ddp_kwargs}
    set_ddp_options(strategy, kwargs, request.ddp.backend, timedelta(seconds=request.ddp.timeout_s))

