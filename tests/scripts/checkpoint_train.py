"""Checkpoint / resume scenarios in a subprocess, for tests/test_checkpoint_processes.py.

Usage:
  python checkpoint_train.py kill OUT_DIR KILL_POINT
      Train a tiny GPT-2 (save every 2 updates, 6 updates) and SIGKILL this process in the middle of the save at
      update 4: KILL_POINT "files" (model files written, RNG / trainer_state not yet) or "rename" (the temporary
      folder is complete, the rename has not happened).
  python checkpoint_train.py resume OUT_DIR STRATEGY RESULT_JSON
      On 2 CPU processes (gloo): an uninterrupted run of 6 updates (save_total_limit=2), then a run resumed from its
      checkpoint-4 (mid-epoch) in another output directory; rank 0 writes both log histories to RESULT_JSON.
      STRATEGY: "launched" (the processes torchrun started, on one node or several: README "Multi-node"), "ddp"
      (`lightning_kwargs["strategy"]="ddp"`), "hf-ddp" (HF's `ddp_*` arguments, Lightning chooses
      DDP), "fsdp2" (HF's `fsdp="full_shard auto_wrap"`: FSDP2 sharded by the default policy), "fsdp2-plain" (a plain
      `ModelParallelStrategy` given in `lightning_kwargs`, no `configure_model` of ours) or "fsdp2-subclass" (a user
      subclass sharding in its own `configure_model`).
      CUDA only (tests/test_gpu.py), on min(2, GPUs) devices: "gpu-fp16" (fp16 with the grad scaler), "gpu-bf16",
      "gpu-fsdp1" (`fsdp_config={"version": 1}`), "gpu-fsdp2", "gpu-zero2" / "gpu-zero3" (`deepspeed=` with HF's
      "auto" values and no optimizer / scheduler section: HF's), "gpu-zero2-optimizer" (an `optimizer` section: HF's
      scheduler on DeepSpeed's optimizer), "gpu-zero3-scheduler" (`optimizer` and `scheduler` sections: both
      DeepSpeed's), "gpu-zero2-hf-optimizer" (a `scheduler` section only: DeepSpeed's scheduler on HF's optimizer),
      "gpu-fsdp2-bf16" / "gpu-fsdp2-fp16" (FSDP2 with HF's MixedPrecisionPolicy; fp16 with the grad scaler),
      "gpu-fsdp1-bf16", "gpu-zero3-bf16" (a `bf16` section with HF's "auto").
      See GPU_DETERMINISM for what the GPU scenarios make deterministic and why not `full_determinism`.
  python checkpoint_train.py best OUT_DIR STRATEGY RESULT_JSON
      DeepSpeed on CUDA ("gpu-zero2" / "gpu-zero3"; "cpu": the same flow in one CPU process): `load_best_model_at_end`
      with the best checkpoint not the last (saved to after_first/), then a second `train()` of the same trainer at
      learning rate 0 (its updates change nothing: after_second/ must hold the best weights), then a third at 1e-2
      (after_third/: its updates must reach the model). Rank 0 writes the best and last folders to RESULT_JSON.
      A "-async" suffix ("ddp-async", "fsdp2-async", "gpu-fsdp1-async"...) adds `save_async=True`; under a sharded
      strategy the run writes the error it gets (no checkpoint, no resume) to RESULT_JSON instead.
  python checkpoint_train.py many OUT_DIR SCENARIO [SCENARIO ...]
      Several 2-process scenarios in ONE launch (the processes, imports and process group are shared; a launch costs
      more than a scenario): each SCENARIO is "resume:STRATEGY" or "nonfinite:STRATEGY", run in turn in
      OUT_DIR/<kind>-<strategy>/ with RESULT_JSON "result.json" there. A scenario that raises writes its traceback
      to "error.<rank>" in its folder and the next one runs.
  python checkpoint_train.py nonfinite OUT_DIR STRATEGY RESULT_JSON
      On 2 CPU processes (STRATEGY as above, without "-async"): right before the save at update 4, rank 1 alone puts
      a NaN into its local part (its shard under FSDP2) of `transformer.h.1.mlp.c_fc.weight`. Every rank writes the
      error its `train()` raised to RESULT_JSON.<rank>.
"""

import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from helpers import lm_dataset, tiny_gpt2  # noqa: E402

import hf_lightning  # noqa: E402
from hf_lightning import TransformerModule  # noqa: E402


class FSDP2Module(TransformerModule):
    """Shards every GPT-2 block, then the root, with FSDP2 (`fully_shard`) in `configure_model`."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        if any(type(p).__name__ == "DTensor" for p in self.model.parameters()):
            return
        mesh = self.device_mesh["data_parallel"]
        for block in self.model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


SETTINGS = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=6, learning_rate=1e-2,
                warmup_steps=1, logging_steps=1, save_strategy="steps", save_steps=2, seed=5, report_to="none",
                disable_tqdm=True, optim="adamw_torch", max_grad_norm=1.0)
"""The runs' training arguments besides `output_dir` (tests/scripts/sharded_twins.py gives HF's Trainer the same)."""


def make_trainer(output_dir: str, lightning_kwargs: dict, module_class=None, **overrides) -> hf_lightning.Trainer:
    settings: dict = dict(output_dir=output_dir, **SETTINGS)
    settings.update(overrides)
    eval_dataset = settings.pop("eval_dataset", None)
    trainer = hf_lightning.Trainer(
        model=tiny_gpt2(dropout=settings.pop("dropout", 0.1), seed=settings.pop("model_seed", 0)),
        args=hf_lightning.TrainingArguments(**settings), train_dataset=lm_dataset(n=24), eval_dataset=eval_dataset,
        lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False, **lightning_kwargs},
    )
    if module_class is not None:
        trainer.module_class = module_class
        trainer.module = trainer._build_module(trainer.model)
    return trainer


def kill(out_dir: str, point: str) -> None:
    from hf_lightning.checkpoint import content, io
    from hf_lightning.checkpoint import write as saving

    def die(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    def at_update_4(real):
        def wrapped(*args, **kwargs):
            if any("checkpoint-4-" in str(a) for a in args) or kwargs.get("step") == 4 or 4 in args:
                die()
            return real(*args, **kwargs)
        return wrapped

    if point == "files":
        content.write_rng_file = at_update_4(content.write_rng_file)
    else:
        saving.finalize_checkpoint = at_update_4(io.finalize_checkpoint)
    make_trainer(out_dir, {}).train()


def _zero(stage: int, optimizer: bool = False, scheduler: bool = False) -> dict:
    """An HF-style DeepSpeed config: every value the Trainer knows is "auto"; optionally DeepSpeed's own optimizer
    (`torch_adam`: DeepSpeed's fused Adam is compiled at first use, which needs the CUDA toolkit) and scheduler."""
    config: dict = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                    "train_batch_size": "auto", "gradient_clipping": "auto",
                    "zero_optimization": {"stage": stage, "reduce_bucket_size": "auto"}}
    if optimizer:
        config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                           "weight_decay": "auto", "torch_adam": True}}
    if scheduler:
        config["scheduler"] = {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}}
    return config


GPU_ARGS = {
    "gpu-fp16": {"fp16": True}, "gpu-bf16": {"bf16": True},
    "gpu-fsdp1": {"fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 1}},
    "gpu-fsdp2": {"fsdp": "full_shard auto_wrap"},
    "gpu-zero2": {"deepspeed": _zero(2)}, "gpu-zero3": {"deepspeed": _zero(3)},
    "gpu-zero2-optimizer": {"deepspeed": _zero(2, optimizer=True)},
    "gpu-zero3-scheduler": {"deepspeed": _zero(3, optimizer=True, scheduler=True)},
    "gpu-zero2-hf-optimizer": {"deepspeed": _zero(2, scheduler=True)},
    # mixed precision under the sharded strategies, as HF's (parallel/precision.py); CPU twins in
    # tests/scripts/sharded_twins.py
    "gpu-fsdp2-bf16": {"fsdp": "full_shard auto_wrap", "bf16": True},
    "gpu-fsdp2-fp16": {"fsdp": "full_shard auto_wrap", "fp16": True},
    "gpu-fsdp1-bf16": {"fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 1}, "bf16": True},
    "gpu-zero3-bf16": {"deepspeed": {**_zero(3), "bf16": {"enabled": "auto"}}, "bf16": True},
}

GPU_DETERMINISM = """Why the GPU scenarios set a seed and cuBLAS's fixed workspace, not `full_determinism`.

`full_determinism=True` calls `torch.use_deterministic_algorithms(True)`, under which any CUDA kernel without a
deterministic implementation raises (some that DeepSpeed's and FSDP's collectives and fused ops use do): a failing
test would then name the harness, not hf_lightning. What the comparisons need is narrower: the resumed run must
replay the uninterrupted one's updates 5 and 6. Both runs execute the same kernels on the same shapes in the same
order, so they are bit-identical except where a kernel accumulates with atomics in a scheduling-dependent order
(e.g. embedding backward) or cuBLAS picks a split-K reduction per workspace: `CUBLAS_WORKSPACE_CONFIG=:4096:8` pins
the latter, the seed (`seed=5`, HF's `set_seed`) and the restored RNG states fix dropout. tests/test_gpu.py compares
with a tolerance per precision that bounds the atomic reordering only (see `TOLERANCE` there) and records whether
the match was exact.
"""


def resume(out_dir: str, strategy_name: str, result_json: str) -> None:
    asynchronous = strategy_name.endswith("-async")
    strategy_name = strategy_name.removesuffix("-async")
    extra = {"save_async": True} if asynchronous else {}
    module_class = FSDP2Module if strategy_name == "fsdp2-subclass" else None
    hf_args = {"fsdp2": {"fsdp": "full_shard auto_wrap"},
               "fsdp1": {"fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 1}},
               "hf-ddp": {"ddp_find_unused_parameters": False, "ddp_static_graph": True}}.get(strategy_name, {})
    if strategy_name in GPU_ARGS:
        hf_args = dict(GPU_ARGS[strategy_name])  # seeded, not full_determinism: see GPU_DETERMINISM

    def kwargs() -> dict:  # a strategy object belongs to one Lightning trainer: a fresh one per run
        if strategy_name.startswith("gpu-"):
            return {"accelerator": "gpu", "devices": min(2, torch.cuda.device_count())}
        if strategy_name == "launched":  # started by torchrun: devices, nodes and DDP come from its environment
            return {}
        if strategy_name == "ddp":
            return {"devices": 2, "strategy": "ddp"}
        if strategy_name in ("fsdp2-plain", "fsdp2-subclass"):
            from lightning.pytorch.strategies import ModelParallelStrategy

            return {"devices": 2, "strategy": ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)}
        return {"devices": 2}  # the strategy comes from the HF arguments

    full = make_trainer(os.path.join(out_dir, "full"), kwargs(), module_class, save_total_limit=2, **hf_args,
                        **extra)
    if asynchronous and strategy_name not in ("ddp", "hf-ddp"):  # a sharded strategy: refused at the start of fit
        try:
            full.train()
        except ValueError as error:
            with open(result_json, "w") as f:
                json.dump({"error": str(error)}, f)
        return
    full.train()
    resumed = make_trainer(os.path.join(out_dir, "resumed"), kwargs(), module_class, model_seed=77, **hf_args,
                           **extra)
    resumed.train(resume_from_checkpoint=os.path.join(out_dir, "full", "checkpoint-4"))
    resumed.save_model(os.path.join(out_dir, "final_model"))  # a collective under FSDP2
    if resumed.lightning_trainer.is_global_zero:
        with open(result_json, "w") as f:
            json.dump({"full": full.state.log_history, "resumed": resumed.state.log_history,
                       "world_size": resumed.lightning_trainer.world_size,
                       "strategy": type(resumed.lightning_trainer.strategy).__name__,
                       "precision": str(resumed.lightning_trainer.precision),
                       "sharded": any(type(p).__name__ == "DTensor" for p in resumed.model.parameters())}, f)


NAN_PARAMETER = "transformer.h.1.mlp.c_fc.weight"


def nonfinite(out_dir: str, strategy_name: str, result_json: str) -> None:
    from transformers import TrainerCallback

    hf_args = {"fsdp2": {"fsdp": "full_shard auto_wrap"}}.get(strategy_name, {})
    lightning_kwargs = {"devices": 2, "strategy": "ddp"} if strategy_name == "ddp" else {"devices": 2}
    trainer = make_trainer(os.path.join(out_dir, "out"), lightning_kwargs, save_total_limit=None, **hf_args)

    class PoisonOneRank(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 4 and torch.distributed.get_rank() == 1:
                parameter = dict(trainer.model.named_parameters())[NAN_PARAMETER]
                local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
                with torch.no_grad():
                    local.view(-1)[0] = float("nan")

    trainer.add_callback(PoisonOneRank())
    try:
        trainer.train()
        outcome = {"error": None}
    except Exception as error:  # noqa: BLE001 - the test checks which
        outcome = {"error": type(error).__name__, "message": str(error)}
    outcome["sharded"] = any(type(p).__name__ == "DTensor" for p in trainer.model.parameters())
    with open(f"{result_json}.{torch.distributed.get_rank()}", "w") as f:
        json.dump(outcome, f)


def best(out_dir: str, strategy_name: str, result_json: str) -> None:
    """See the module docstring (`best`); "cpu" runs the same flow in one CPU process (the harness's own check)."""
    if strategy_name == "cpu":
        kwargs: dict = {"devices": 1}
    else:
        kwargs = {"accelerator": "gpu", "devices": min(2, torch.cuda.device_count())}
    # the eval set is other random tokens, so its loss rises while the training loss falls (4.158, 4.175, 4.180 on
    # the CPU): the best checkpoint is the first one, not the last (the test checks that it is not the last)
    trainer = make_trainer(os.path.join(out_dir, "run"), kwargs, eval_strategy="steps", eval_steps=2,
                           load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=False,
                           eval_dataset=lm_dataset(n=8, seed=3), **GPU_ARGS.get(strategy_name, {}))
    trainer.train()
    best_folder = trainer.state.best_model_checkpoint
    trainer.save_model(os.path.join(out_dir, "after_first"))
    # the next runs neither evaluate nor save: only their updates matter
    trainer.args.eval_strategy, trainer.args.save_strategy, trainer.args.load_best_model_at_end = "no", "no", False
    # Its updates change nothing: it ends on the weights it started from. Under DeepSpeed every run builds a fresh
    # optimizer (HF's `deepspeed_init`) that reads the new rate; elsewhere HF keeps the optimizer (and its rate)
    # across `train()` calls, so the CPU check asks for a new one as an HF user would.
    trainer.args.learning_rate = 0.0
    if strategy_name == "cpu":
        trainer.optimizer = None
    trainer.train()
    trainer.save_model(os.path.join(out_dir, "after_second"))
    trainer.args.learning_rate = 1e-2  # its updates must reach the model's own weights
    if strategy_name == "cpu":
        trainer.optimizer = None
    trainer.train()
    trainer.save_model(os.path.join(out_dir, "after_third"))
    if trainer.lightning_trainer.is_global_zero:
        with open(result_json, "w") as f:
            json.dump({"best": best_folder, "last": os.path.join(out_dir, "run", "checkpoint-6")}, f)


def many(out_dir: str, scenarios: list[str]) -> None:
    """See the module docstring (`many`)."""
    import traceback

    for scenario in scenarios:
        kind, strategy_name = scenario.split(":")
        folder = os.path.join(out_dir, f"{kind}-{strategy_name}")
        os.makedirs(folder, exist_ok=True)
        try:
            {"resume": resume, "nonfinite": nonfinite}[kind](folder, strategy_name, os.path.join(folder, "result.json"))
        except Exception:  # noqa: BLE001 - the test of this scenario reports it; the others still run
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            with open(os.path.join(folder, f"error.{rank}"), "w") as f:
                f.write(traceback.format_exc())


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1].startswith("gpu") or any(a.startswith("gpu-") for a in sys.argv[2:]):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # see GPU_DETERMINISM
    if sys.argv[1] == "kill":
        kill(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "nonfinite":
        nonfinite(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "many":
        many(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "best":
        best(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        resume(sys.argv[2], sys.argv[3], sys.argv[4])
