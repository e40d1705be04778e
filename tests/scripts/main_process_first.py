"""An HF-style script: preprocessing under `main_process_first`, then a 2-process DDP `train()` on CPU.

Run by tests/test_process_layout.py, either under `torchrun` (all ranks start together: the barrier must hold rank 1
back until rank 0 has finished its block) or with plain `python` (Lightning's launcher re-runs this script for rank 1
inside `train()`, after rank 0 finished preprocessing alone: rank 1 must not wait for a partner).

Every block writes marker files; each rank writes `result-<rank>.json`. Usage: python main_process_first.py OUT_DIR
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from helpers import classification_dataset, tiny_bert  # noqa: E402

import hf_lightning  # noqa: E402


def _layout(args) -> dict:
    return {"process_index": args.process_index, "local_process_index": args.local_process_index,
            "world_size": args.world_size, "should_log": args.should_log, "should_save": args.should_save,
            "parallel_mode": args.parallel_mode.value}


def _block(out: str, name: str, rank: int, first: int) -> dict:
    """The body of a `main_process_first` block: did the first process finish its block before this one began?"""
    seen = {"first_finished_before": os.path.exists(os.path.join(out, f"{name}-done-{first}"))}
    open(os.path.join(out, f"{name}-start-{rank}"), "w").close()
    if rank == first and os.environ.get("TORCHELASTIC_RUN_ID"):
        # with a broken barrier the other rank would be inside its block now; give it the chance to show up
        # (only a failing run depends on this wait: a correct barrier keeps the other rank out whatever the timing)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not os.path.exists(os.path.join(out, f"{name}-start-1")):
            time.sleep(0.05)
        seen["other_started_meanwhile"] = os.path.exists(os.path.join(out, f"{name}-start-1"))
    open(os.path.join(out, f"{name}-done-{rank}"), "w").close()
    return seen


def main() -> None:
    out = sys.argv[1]
    args = hf_lightning.TrainingArguments(
        output_dir=os.path.join(out, "run"), use_cpu=True, report_to="none", disable_tqdm=True, max_steps=2,
        per_device_train_batch_size=4, logging_steps=1, save_strategy="no", learning_rate=1e-3, optim="adamw_torch",
    )
    before = _layout(args)
    rank = args.process_index
    with args.main_process_first(desc="tokenize"):
        local_block = _block(out, "local", rank, first=0)
    with args.main_process_first(local=False, desc="group texts"):
        global_block = _block(out, "global", rank, first=0)
    trainer = hf_lightning.Trainer(
        model=tiny_bert(), args=args, train_dataset=classification_dataset(32),
        lightning_kwargs={"accelerator": "cpu", "devices": 2, "strategy": "ddp"},
    )
    trainer.train()
    result = {"before": before, "after": _layout(args), "local": local_block, "global": global_block,
              "global_step": trainer.state.global_step, "pid": os.getpid()}
    with open(os.path.join(out, f"result-{args.process_index}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
