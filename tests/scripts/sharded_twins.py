"""The CPU twins of the 2-rank GPU scenarios (tests/test_gpu.py), for tests/test_sharded_twins.py: ONE launch.

    python -m torch.distributed.run --standalone --nproc_per_node 2 sharded_twins.py OUT_DIR

On one GPU tests/test_gpu.py runs its scenarios on min(2, GPUs) = 1 rank: no collective, no sharding across ranks.
Here each runs on 2 CPU processes (gloo), one after another in this one launch (CI time: one start-up for all), as
tests/scripts/checkpoint_train.py's `resume` does: an uninterrupted run of 6 updates saving every 2, then a run from
other initial weights resumed from its checkpoint-4. Rank 0 writes OUT_DIR/<scenario>.json.

- "fsdp2-bf16": `fsdp=` + `bf16=True` (accelerate's MixedPrecisionPolicy, parallel/precision.py);
- "fsdp2-fp16": `fsdp=` + Lightning's "16-mixed" (float16 autocast, the policy, a grad scaler: the GPU's fp16 path;
  `fp16=True` on the CPU trains in float32, as HF);
- "fsdp1-bf16": `fsdp=` with `fsdp_config={"version": 1}` + `bf16=True` (Lightning's FSDPPrecision);
- "ddp-bf16": `bf16=True` on DDP, uninterrupted only: what HF's `fsdp` is on CPU processes (accelerate makes it DDP),
  the reference of the FSDP2 bf16 run.

Each JSON: both log histories, world size, strategy, precision, whether the parameters are sharded, and the dtypes a
layer's weight had inside its forwards (the gathered weight under FSDP2).

The "parity-*" scenarios (`PARITY`) are the same runs without dropout (a single process cannot draw the 2 ranks'
dropout masks), uninterrupted, their final weights saved to OUT_DIR/<scenario>/final: tests/test_sharded_twins.py
compares them with one process (`parity_trainer(name, processes=1)`, in the test's process) and with HF's Trainer.
Each JSON: the log history, the world size, the dtypes and shapes a layer's weight had inside its forwards, and
the shape of its local shard (FSDP2's DTensor; None under FSDP1, whose shards are flat).
"""

import json
import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from checkpoint_train import SETTINGS, make_trainer  # noqa: E402
from helpers import lm_dataset, tiny_gpt2  # noqa: E402

FSDP = {"fsdp": "full_shard auto_wrap"}
SCENARIOS = {
    "fsdp2-bf16": ({**FSDP, "bf16": True}, {}),
    "fsdp2-fp16": (FSDP, {"precision": "16-mixed"}),
    "fsdp1-bf16": ({**FSDP, "fsdp_config": {"version": 1}, "bf16": True}, {}),
    "ddp-bf16": ({"bf16": True}, {}),
}
PARITY = {
    "parity-fsdp2-bf16": {**FSDP, "bf16": True},
    "parity-fsdp2-fp16": FSDP,  # with a "16-mixed" plugin (`parity_trainer`)
    "parity-fsdp1-bf16": {**FSDP, "fsdp_config": {"version": 1}, "bf16": True},
}
"""Uninterrupted runs without dropout, compared with one process and HF (`parity_trainer`): their HF arguments."""


def _watch(trainer, shapes: bool = False) -> list:
    """What a layer's weight is inside its forwards: its dtype (with `shapes`: and its shape), one per forward."""
    seen: list = []
    layer = trainer.model.transformer.h[0].mlp.c_fc
    if shapes:
        layer.register_forward_pre_hook(lambda m, _: seen.append((str(m.weight.dtype), tuple(m.weight.shape))))
    else:
        layer.register_forward_pre_hook(lambda m, _: seen.append(str(m.weight.dtype)))
    return seen


def parity_trainer(name: str, output_dir: str, processes: int = 2):
    """The trainer of a `PARITY` scenario on `processes` processes: the same 8 samples per update either way (per
    process batch 2 x 2 processes, or 4 in one; 2 micro-batches each, sharded as accelerate's `BatchSamplerShard`).

    fp16 starts its grad scaler at 2^8, not 2^16: under `average_tokens_across_devices` each rank's loss is the
    global mean's share times the number of processes (HF's rule), so at 2^16 the 2 ranks' fp16 gradients overflow
    on more updates than one process's and the two runs skip different updates (each as HF would); from 2^8 neither
    skips one, so their updates can be compared one for one.
    """
    from lightning.pytorch.plugins.precision import MixedPrecision

    lightning_kwargs: dict = {"devices": processes} if processes == 1 else {}
    if name.endswith("fp16"):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        lightning_kwargs["plugins"] = [MixedPrecision("16-mixed", "cpu", scaler=scaler)]
    return make_trainer(output_dir, lightning_kwargs, dropout=0.0, save_strategy="no",
                        per_device_train_batch_size=4 // processes, **PARITY[name])


def hf_parity_trainer(name: str, output_dir: str):
    """`transformers.Trainer` on a `PARITY` scenario's model, data and arguments, in one process, without `fsdp`: HF
    refuses `fsdp` in one process ("Using fsdp only works in distributed training") and on several CPU processes
    runs it as DDP (accelerate's MULTI_CPU); so HF's CPU meaning of these runs is its one-process run. bf16: HF's
    bf16 autocast over float32 weights; fp16: HF trains in float32 on the CPU (tests/test_fp16_on_cpu.py)."""
    import transformers

    model = tiny_gpt2(dropout=0.0, seed=0)
    model.loss_type = "ForCausalLM"  # HF then counts shifted label tokens, as we do (see test_train_parity.py)
    precision = {"bf16": True} if name.endswith("bf16") else {"fp16": True}
    args = transformers.TrainingArguments(output_dir=output_dir, use_cpu=True, **{
        **SETTINGS, "per_device_train_batch_size": 4, "save_strategy": "no", **precision})
    return transformers.Trainer(model=model, args=args, train_dataset=lm_dataset(n=24))


def parity(out_dir: str, name: str) -> None:
    folder = os.path.join(out_dir, name)
    trainer = parity_trainer(name, folder)
    seen = _watch(trainer, shapes=True)
    trainer.train()
    trainer.save_model(os.path.join(folder, "final"))  # the gathered full weights (a collective)
    if trainer.lightning_trainer.is_global_zero:
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            weight = trainer.model.transformer.h[0].mlp.c_fc.weight
            json.dump({"full": trainer.state.log_history, "seen": sorted(set(seen)),
                       "world_size": trainer.lightning_trainer.world_size,
                       "local_shape": list(weight.to_local().shape) if hasattr(weight, "to_local") else None}, f)


def run(out_dir: str, name: str) -> None:
    if name in PARITY:
        parity(out_dir, name)
        return
    hf_args, lightning_kwargs = SCENARIOS[name]
    folder = os.path.join(out_dir, name)
    full = make_trainer(os.path.join(folder, "full"), dict(lightning_kwargs), save_total_limit=2, **hf_args)
    seen = _watch(full)
    full.train()
    resumed = None
    if not name.startswith("ddp"):
        resumed = make_trainer(os.path.join(folder, "resumed"), dict(lightning_kwargs), model_seed=77, **hf_args)
        resumed.train(resume_from_checkpoint=os.path.join(folder, "full", "checkpoint-4"))
    last = resumed or full
    if last.lightning_trainer.is_global_zero:
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump({"full": full.state.log_history, "resumed": resumed.state.log_history if resumed else None,
                       "world_size": last.lightning_trainer.world_size,
                       "strategy": type(last.lightning_trainer.strategy).__name__,
                       "precision": str(last.lightning_trainer.precision),
                       "scaler": last.accelerator.scaler is not None,
                       # FSDP2: DTensor parameters; FSDP1: FullyShardedDataParallel modules (flat parameters)
                       "sharded": any(type(p).__name__ == "DTensor" for p in last.model.parameters())
                       or any(type(m).__name__ == "FullyShardedDataParallel"
                              for m in last.lightning_trainer.strategy.model.modules()),
                       "seen_dtypes": sorted(set(seen))}, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    for scenario in (sys.argv[2].split(",") if len(sys.argv) > 2 else [*SCENARIOS, *PARITY]):
        run(sys.argv[1], scenario)
