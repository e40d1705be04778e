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
"""

import json
import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from checkpoint_train import make_trainer  # noqa: E402

FSDP = {"fsdp": "full_shard auto_wrap"}
SCENARIOS = {
    "fsdp2-bf16": ({**FSDP, "bf16": True}, {}),
    "fsdp2-fp16": (FSDP, {"precision": "16-mixed"}),
    "fsdp1-bf16": ({**FSDP, "fsdp_config": {"version": 1}, "bf16": True}, {}),
    "ddp-bf16": ({"bf16": True}, {}),
}


def _watch(trainer) -> list:
    seen: list = []
    layer = trainer.model.transformer.h[0].mlp.c_fc
    layer.register_forward_pre_hook(lambda m, _: seen.append(str(m.weight.dtype)))
    return seen


def run(out_dir: str, name: str) -> None:
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
    for scenario in (sys.argv[2].split(",") if len(sys.argv) > 2 else SCENARIOS):
        run(sys.argv[1], scenario)
