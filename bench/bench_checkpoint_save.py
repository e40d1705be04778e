"""Time of one full checkpoint save: `hf_lightning` vs `transformers.Trainer._save_checkpoint`, same model.

Both trainers first train the `gpt2` case of `common.py` (GPT-2, n_embd 256, 4 layers, vocab 8192: 5.3M parameters,
21 MB of safetensors, 42 MB of AdamW state)
for 2 updates, so the AdamW state exists. Then each side saves a full checkpoint again and again, alternating
sides every repeat (ABAB...):

- `hf`: `transformers.Trainer._save_checkpoint(model, trial=None)`: `save_pretrained` (safetensors), tokenizer-less
  model files, `training_args.bin`, `optimizer.pt`, `scheduler.pt`, `rng_state.pth`, `trainer_state.json`,
  rotation (no limit);
- `ours`: `CheckpointSaver.save` as `HFTrainerFlow` calls it: the same files plus `lightning_state.pt`, written into
  `tmp-checkpoint-<n>-<run>`, every file and folder flushed (`fsync`), renamed, the parent flushed, then rotation;
- `ours-nofsync`: the same without the flushes (`saver.durable = False`), to measure what durability costs;
- `ours-nomanifest`: the same without the manifest (`saver.manifest = False`): what the checksums of every file
  (`checkpoint_manifest.json`, xxh3_128) cost inside a real save.

The four alternate every repeat (rotating order). Each timed save goes to a new step number (so no save replaces
an existing folder); the folder is deleted after the timing, outside the timed region. Reported: the median time
per save of each side, the ratio ours / hf (target: <= 1.0, "not slower"), ours / ours-nofsync (the cost of
`fsync`) and ours / ours-nomanifest (the cost of the manifest, target <= 1.05), plus the per-repeat paired ratios'
medians. The manifest is also timed alone (`write_manifest` on a just-written checkpoint folder, its files in the
page cache as right after a save), with blake2b (hashlib) in place of xxh3_128 for comparison. `--dir` chooses the
file system (default: the temp dir): the cost of `fsync` depends on it (tmpfs: none; a local SSD: the time to write
the checkpoint's bytes).

Usage: python bench/bench_checkpoint_save.py [--repeats 25] [--threads 1] [--dir PATH] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
from common import CASES, median  # noqa: E402


def build_hf(root: str):
    import transformers

    case = CASES["gpt2"]
    args = transformers.TrainingArguments(
        output_dir=os.path.join(root, "hf"), per_device_train_batch_size=2, max_steps=2, save_strategy="no",
        report_to="none", disable_tqdm=True, use_cpu=True, logging_strategy="no",
    )
    trainer = transformers.Trainer(model=case.build_model(), args=args, train_dataset=case.build_dataset(4))
    trainer.train()
    return trainer


def build_ours(root: str):
    import hf_lightning

    case = CASES["gpt2"]
    args = hf_lightning.TrainingArguments(
        output_dir=os.path.join(root, "ours"), per_device_train_batch_size=2, max_steps=2, save_strategy="no",
        report_to="none", disable_tqdm=True, logging_strategy="no",
    )
    trainer = hf_lightning.Trainer(model=case.build_model(), args=args, train_dataset=case.build_dataset(4),
                                   lightning_kwargs={"accelerator": "cpu", "logger": False})
    trainer.train()
    return trainer


CPU: dict[str, list[float]] = {}
"""Process CPU seconds (all threads) of each timed save, by side: what the save costs whatever the machine's load."""


def save_hf(trainer, step: int, keep: bool = False) -> float:
    trainer.state.global_step = step
    start, cpu = time.perf_counter(), time.process_time()
    trainer._save_checkpoint(trainer.model, trial=None)
    elapsed = time.perf_counter() - start
    CPU.setdefault("hf", []).append(time.process_time() - cpu)
    if not keep:
        shutil.rmtree(os.path.join(trainer.args.output_dir, f"checkpoint-{step}"))
    return elapsed


def save_ours(trainer, step: int, keep: bool = False, durable: bool = True) -> float:
    flow = trainer.flow
    flow.state.global_step = step
    saver = flow.checkpoints.saver
    saver.durable = durable
    start, cpu = time.perf_counter(), time.process_time()
    saver.save(trainer.lightning_trainer, trainer.module, flow.state, [*flow.handler.callbacks, flow.control])
    elapsed = time.perf_counter() - start
    side = "ours" if durable and saver.manifest else "ours-nofsync" if saver.manifest else "ours-nomanifest"
    CPU.setdefault(side, []).append(time.process_time() - cpu)
    if not keep:
        shutil.rmtree(os.path.join(trainer.args.output_dir, f"checkpoint-{step}"))
    return elapsed


def save_ours_nofsync(trainer, step: int, keep: bool = False) -> float:
    return save_ours(trainer, step, keep, durable=False)


def save_ours_nomanifest(trainer, step: int, keep: bool = False) -> float:
    trainer.flow.checkpoints.saver.manifest = False
    try:
        return save_ours(trainer, step, keep)
    finally:
        trainer.flow.checkpoints.saver.manifest = True


def time_manifest_alone(folder: str, repeats: int) -> dict[str, float]:
    """Median seconds to checksum every file of `folder` and write the manifest (xxh3_128), and to checksum them
    with blake2b instead (the fastest strong hash of hashlib here)."""
    import hashlib

    from hf_lightning.checkpoint.manifest import MANIFEST_NAME, write_manifest

    def blake2b_all() -> None:
        for root, _, names in os.walk(folder):
            for name in names:
                if name != MANIFEST_NAME:
                    with open(os.path.join(root, name), "rb") as f:
                        hashlib.file_digest(f, "blake2b")

    times: dict[str, list[float]] = {"xxh3_128 manifest": [], "blake2b checksums": [], "xxh3_128 manifest CPU": []}
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        write_manifest(folder, 1001)
        times["xxh3_128 manifest"].append(time.perf_counter() - start)
        times["xxh3_128 manifest CPU"].append(time.process_time() - cpu)
        start = time.perf_counter()
        blake2b_all()
        times["blake2b checksums"].append(time.perf_counter() - start)
    return {name: median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dir", default=None, help="where the checkpoints are written (default: the temp dir)")
    parser.add_argument("--json", default=None)
    options = parser.parse_args(argv)
    torch.set_num_threads(options.threads)
    with tempfile.TemporaryDirectory(dir=options.dir) as root:
        hf_trainer, our_trainer = build_hf(root), build_ours(root)
        our_trainer.flow.checkpoints.saver.begin_run(our_trainer.lightning_trainer)  # the lock, run id
        sides = {"hf": (save_hf, hf_trainer), "ours": (save_ours, our_trainer),
                 "ours-nofsync": (save_ours_nofsync, our_trainer),
                 "ours-nomanifest": (save_ours_nomanifest, our_trainer)}
        for saver, trainer in sides.values():
            saver(trainer, 1000)  # warm-up (first-call imports, allocator)
        files = {}
        for name, (saver, trainer) in list(sides.items())[:2]:
            saver(trainer, 1001, keep=True)
            folder = os.path.join(trainer.args.output_dir, "checkpoint-1001")
            files[name] = {f: os.path.getsize(os.path.join(folder, f)) for f in sorted(os.listdir(folder))}
        alone = time_manifest_alone(os.path.join(our_trainer.args.output_dir, "checkpoint-1001"), options.repeats)
        times: dict[str, list[float]] = {name: [] for name in sides}
        CPU.clear()  # the warm-up saves are not counted
        names = list(sides)
        for repeat in range(options.repeats):
            for name in names[repeat % len(names):] + names[: repeat % len(names)]:  # rotate the order every repeat
                saver, trainer = sides[name]
                times[name].append(saver(trainer, 2000 + repeat))
        our_trainer.flow.checkpoints.saver.end_run()
        filesystem = os.statvfs(root)
    hf_median, our_median, plain_median = median(times["hf"]), median(times["ours"]), median(times["ours-nofsync"])
    paired = median([o / h for o, h in zip(times["ours"], times["hf"])])
    fsync_paired = median([o / p for o, p in zip(times["ours"], times["ours-nofsync"])])
    bare_median = median(times["ours-nomanifest"])
    manifest_paired = median([o / p for o, p in zip(times["ours"], times["ours-nomanifest"])])
    for name, listing in files.items():
        print(f"  {name} files: " + ", ".join(f"{f} ({size / 1e6:.2f} MB)" for f, size in listing.items()))
    params = sum(p.numel() for p in our_trainer.model.parameters()) / 1e6
    print(f"checkpoint save, gpt2 case ({params:.1f}M params), {options.repeats} repeats, {options.threads} thread(s)")
    print(f"  written to {options.dir or tempfile.gettempdir()} (block size {filesystem.f_bsize})")
    print(f"  hf   (transformers.Trainer._save_checkpoint): median {hf_median * 1000:7.1f} ms")
    print(f"  ours (hf_lightning CheckpointSaver.save):      median {our_median * 1000:7.1f} ms")
    print(f"  ours without fsync (saver.durable=False):     median {plain_median * 1000:7.1f} ms")
    print(f"  ratio ours/hf of medians: {our_median / hf_median:.3f}   median of paired ratios: {paired:.3f}   "
          f"target <= 1.0: {'met' if our_median / hf_median <= 1.0 else 'NOT met'}")
    print(f"  cost of fsync: ours/ours-nofsync of medians {our_median / plain_median:.3f}, paired "
          f"{fsync_paired:.3f} ({(our_median - plain_median) * 1000:+.1f} ms per save)")
    print(f"  ours without manifest (saver.manifest=False): median {bare_median * 1000:7.1f} ms")
    print(f"  cost of the manifest: ours/ours-nomanifest of medians {our_median / bare_median:.3f}, paired "
          f"{manifest_paired:.3f} ({(our_median - bare_median) * 1000:+.1f} ms per save)")
    for name in ("xxh3_128 manifest", "blake2b checksums"):
        seconds = alone[name]
        print(f"  {name} alone, files in the page cache: median {seconds * 1000:6.2f} ms = "
              f"{seconds / our_median:.1%} of our save's wall time (target <= 5%)")
    cpu = {name: median(values) for name, values in CPU.items() if values}
    print("  CPU time per save (process, all threads; independent of other processes' load): " + ", ".join(
        f"{name} {seconds * 1000:.1f} ms" for name, seconds in cpu.items()))
    print(f"  xxh3_128 manifest alone: {alone['xxh3_128 manifest CPU'] * 1000:.2f} ms CPU = "
          f"{alone['xxh3_128 manifest CPU'] / cpu['ours']:.1%} of our save's CPU time (target <= 5%)")
    if options.json:
        with open(options.json, "w") as f:
            json.dump({**times, "ratio_of_medians": our_median / hf_median, "median_paired_ratio": paired,
                       "fsync_ratio_of_medians": our_median / plain_median, "fsync_median_paired_ratio": fsync_paired,
                       "manifest_ratio_of_medians": our_median / bare_median,
                       "manifest_median_paired_ratio": manifest_paired, "manifest_alone": alone, "cpu": CPU,
                       "files": files}, f, indent=2)


if __name__ == "__main__":
    main()
