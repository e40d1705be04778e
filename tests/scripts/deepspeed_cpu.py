"""Real DeepSpeed engines on the CPU (one process, gloo), for tests/test_deepspeed_cpu.py.

deepspeed 0.19.8 runs its ZeRO-2 and ZeRO-3 optimizers (`DeepSpeedZeroOptimizer`, `DeepSpeedZeroOptimizer_Stage3`)
on its CPU accelerator; Lightning's `DeepSpeedStrategy` refuses the CPU, so these checks drive the engine directly
with the functions `HFDeepSpeedStrategy` and `load_full_weights` call. A tiny GPT-2 from a config, fp32 (ZeRO still
keeps its own fp32 master partitions), `torch_adam` (DeepSpeed's fused Adam needs CUDA).

Usage: python deepspeed_cpu.py RESULT_JSON [--old]
    --old: the code before the fix (the scheduler on the engine's optimizer; weights loaded without refreshing the
    masters, and under ZeRO-3 on rank 0 only), to show the checks fail there.

Writes, per stage: the TypeError of a torch scheduler on the ZeRO wrapper, the learning rates the engine's updates
used under HF's scheduler (with the oracle's: `transformers.get_scheduler` on a plain torch optimizer), and whether
weights loaded into the running engine survive its next step.
"""

import json
import os
import sys

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", DS_ACCELERATOR="cpu")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
from helpers import tiny_gpt2  # noqa: E402

STEPS = 5


def _engine(stage: int):
    import deepspeed

    model = tiny_gpt2(seed=0)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0, "torch_adam": True}}}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine, optimizer, model


def _step(engine, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (2, 8), generator=generator)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()


def _full_state(model, zero3: bool) -> dict:
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters()), enabled=zero3):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _oracle_lrs(args) -> list[float]:
    """HF's schedule on a plain torch optimizer: the LR each of the first STEPS updates uses."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(STEPS),
                              num_training_steps=STEPS)
    lrs = []
    for _ in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def scheduler_check(stage: int, old: bool) -> dict:
    from hf_lightning import TrainingArguments
    from hf_lightning.module.optim import build_scheduler
    from hf_lightning.parallel.strategies import scheduler_base_optimizer

    engine, optimizer, _ = _engine(stage)
    args = TrainingArguments(output_dir="unused", report_to="none", learning_rate=1e-2, warmup_steps=2,
                             lr_scheduler_type="linear")
    out: dict = {"wrapper": type(optimizer).__name__,
                 "is_torch_optimizer": isinstance(optimizer, torch.optim.Optimizer)}
    try:
        scheduler = build_scheduler(optimizer if old else scheduler_base_optimizer(engine), args, STEPS)
    except TypeError as error:
        out["error"] = str(error)
        return out
    used = []
    for step in range(STEPS):
        used.append(engine.optimizer.param_groups[0]["lr"])  # what the wrapper's step applies
        _step(engine, step)
        scheduler.step()
    out["lrs"], out["oracle_lrs"] = used, _oracle_lrs(args)
    return out


def load_check(stage: int, old: bool) -> dict:
    """Weights W0 loaded into the engine after an update moved it to W1; then an update with LR 0 (the masters are
    copied back into the model): the model must hold W0, not W1."""
    from hf_lightning.checkpoint.sharded import load_into_engine

    engine, optimizer, model = _engine(stage)
    zero3 = stage == 3
    before = _full_state(model, zero3)
    _step(engine, 0)
    moved = _full_state(model, zero3)
    if old:  # the code before the fix
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0, enabled=zero3):
            model.load_state_dict(before, strict=False)
    else:
        load_into_engine(engine, model, before, zero3)
    loaded = _full_state(model, zero3)
    for group in engine.optimizer.param_groups:
        group["lr"] = 0.0
    _step(engine, 1)
    after = _full_state(model, zero3)
    names = [k for k, v in before.items() if not torch.equal(v, moved[k])]
    return {"moved": len(names),
            "loaded_equal": all(torch.equal(loaded[k], before[k]) for k in names),
            "after_step_equal": all(torch.equal(after[k], before[k]) for k in names)}


def main() -> None:
    import deepspeed

    torch.set_num_threads(1)
    old = "--old" in sys.argv
    deepspeed.init_distributed(dist_backend="gloo")
    result = {f"stage{s}": {"scheduler": scheduler_check(s, old), "load": load_check(s, old)} for s in (2, 3)}
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
