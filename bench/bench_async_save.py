"""Checkpoint stalls: how long training stops for each save, `save_async=True` vs a synchronous save vs HF.

The model: GPT-2 with n_embd 384, 6 layers, 6 heads, vocab 8192 (about 14M parameters: 56 MB of safetensors, 113 MB
of AdamW state), sequences of 128, batch 8; `save_steps=1` (a checkpoint after every update), no rotation limit, no
evaluation, no logging. Runners, each a fresh process, alternating in an order rotated every repeat:

- `ours-async`: `hf_lightning.Trainer` with `save_async=True`;
- `ours-sync`:  `hf_lightning.Trainer` (the default synchronous save, fsync included);
- `hf`:         `transformers.Trainer` (its synchronous save; it does not fsync);
- `ours-nosave`, `hf-nosave`: the same runs with `save_strategy="no"`.

The stall of a checkpoint is the time the training thread spends in the save call (timed around
`CheckpointSaver.save` and `transformers.Trainer._save_checkpoint` on the trainer instance): for `ours-async` the
capture into CPU memory plus any wait for the previous save still being written; the last write's wait at the end of
training is in the total time, not in a stall. Reported: the median stall per checkpoint (saves 2.. of each run:
the first save of a process pays one-off costs), ours-async / HF's save time (target <= 0.25), the `train()` time
of each runner, and with saves / without saves. CPU threads: `--threads` (1) for torch in every runner; the
background writer runs on another core. `--dir` chooses the file system (default: the temp dir).

    python bench/bench_async_save.py --repeats 5 --steps 12 [--dir PATH] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNNERS = ("ours-async", "ours-sync", "hf", "ours-nosave", "hf-nosave")


def child(runner: str, steps: int, threads: int, out: str, layers: int = 6) -> dict:
    """One run in this process; returns the stalls and the train() time."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_positions=128, n_embd=384, n_layer=layers, n_head=6))
    import datasets

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8192, (steps * 8, 128), generator=g).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    save = "no" if runner.endswith("nosave") else "steps"
    common = dict(output_dir=out, per_device_train_batch_size=8, max_steps=steps, save_strategy=save, save_steps=1,
                  logging_strategy="no", report_to="none", disable_tqdm=True, seed=0)
    stalls: list[float] = []

    def timed(inner):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                stalls.append(time.perf_counter() - start)
        return wrapper

    if runner.startswith("hf"):
        import transformers

        trainer = transformers.Trainer(model=model, args=transformers.TrainingArguments(use_cpu=True, **common),
                                       train_dataset=data)
        trainer._save_checkpoint = timed(trainer._save_checkpoint)
    else:
        import hf_lightning

        args = hf_lightning.TrainingArguments(save_async=runner == "ours-async", **common)
        trainer = hf_lightning.Trainer(model=model, args=args, train_dataset=data,
                                       lightning_kwargs={"accelerator": "cpu", "logger": False,
                                                         "enable_progress_bar": False})
        trainer.flow.checkpoints.saver.save = timed(trainer.flow.checkpoints.saver.save)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    written = sorted(p.name for p in Path(out).iterdir() if p.name.startswith("checkpoint-"))
    return {"stalls": stalls, "train_s": total, "checkpoints": len(written)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--layers", type=int, default=6, help="GPT-2 layers (a smaller checkpoint: a smoke run)")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print("RESULT " + json.dumps(child(options.child[0], options.steps, options.threads, options.child[1],
                                            options.layers)))
        return
    runs: dict[str, list[dict]] = {r: [] for r in RUNNERS}
    loads = []
    for repeat in range(options.repeats):
        order = RUNNERS[repeat % len(RUNNERS):] + RUNNERS[:repeat % len(RUNNERS)]
        for runner in order:
            with tempfile.TemporaryDirectory(dir=options.dir) as out:
                loads.append(os.getloadavg()[0])
                done = subprocess.run([sys.executable, __file__, "--steps", str(options.steps), "--threads",
                                       str(options.threads), "--layers", str(options.layers), "--child", runner, out], capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{runner} failed:\n{done.stderr[-3000:]}")
                result = json.loads(next(line for line in done.stdout.splitlines()
                                         if line.startswith("RESULT "))[len("RESULT "):])
            runs[runner].append(result)
            stall = statistics.median(result["stalls"][1:]) if len(result["stalls"]) > 1 else 0.0
            print(f"  [rep {repeat + 1}/{options.repeats}] {runner:11s} train() {result['train_s']:6.2f} s  "
                  f"checkpoints {result['checkpoints']:3d}  median stall {1e3 * stall:8.1f} ms", flush=True)
    summary: dict = {"loads": loads, "runs": runs}
    print(f"\n== GPT-2 (n_embd 384, {options.layers} layers), save_steps=1, {options.steps} updates, medians of {options.repeats} "
          f"(load average {statistics.median(loads):.1f}, {min(loads):.1f}-{max(loads):.1f}) ==")
    stalls = {r: statistics.median(s for run in runs[r] for s in run["stalls"][1:]) for r in RUNNERS
              if not r.endswith("nosave")}
    train = {r: statistics.median(run["train_s"] for run in runs[r]) for r in RUNNERS}
    for runner, value in stalls.items():
        print(f"  stall per checkpoint  {runner:11s} {1e3 * value:8.1f} ms")
    print(f"  ours-async stall / HF save time: {stalls['ours-async'] / stalls['hf']:.3f}   (target <= 0.25)")
    print(f"  ours-sync save / HF save: {stalls['ours-sync'] / stalls['hf']:.3f}")
    for runner, value in train.items():
        print(f"  train()  {runner:11s} {value:8.2f} s")
    print(f"  with saves / without: ours-async {train['ours-async'] / train['ours-nosave']:.3f}, ours-sync "
          f"{train['ours-sync'] / train['ours-nosave']:.3f}, hf {train['hf'] / train['hf-nosave']:.3f}")
    summary.update(stalls=stalls, train=train)
    if options.json:
        Path(options.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
