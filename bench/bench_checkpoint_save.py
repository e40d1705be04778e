"""Time of one full checkpoint save: `hf_lightning` vs `transformers.Trainer._save_checkpoint`, same model.

Both trainers first train the `gpt2` case of `common.py` (GPT-2, n_embd 256, 4 layers, vocab 8192: 5.3M parameters,
21 MB of safetensors, 42 MB of AdamW state)
for 2 updates, so the AdamW state exists. Then each side saves a full checkpoint again and again, alternating
sides every repeat (ABAB...):

- `hf`: `transformers.Trainer._save_checkpoint(model, trial=None)`: `save_pretrained` (safetensors), tokenizer-less
  model files, `training_args.bin`, `optimizer.pt`, `scheduler.pt`, `rng_state.pth`, `trainer_state.json`,
  rotation (no limit);
- `ours`: `CheckpointSaver.save` as `HFTrainerFlow` calls it: the same files plus `lightning_state.pt`, written into
  `tmp-checkpoint-<n>` and renamed, then rotation.

Each timed save goes to a new step number (so no save replaces an existing folder); the folder is deleted after the
timing, outside the timed region. Reported: the median time per save of each side and the ratio ours / hf
(target: <= 1.0, "not slower"), plus the per-repeat paired ratios' median.

Usage: python bench/bench_checkpoint_save.py [--repeats 25] [--threads 1] [--json out.json]
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


def save_hf(trainer, step: int, keep: bool = False) -> float:
    trainer.state.global_step = step
    start = time.perf_counter()
    trainer._save_checkpoint(trainer.model, trial=None)
    elapsed = time.perf_counter() - start
    if not keep:
        shutil.rmtree(os.path.join(trainer.args.output_dir, f"checkpoint-{step}"))
    return elapsed


def save_ours(trainer, step: int, keep: bool = False) -> float:
    flow = trainer.flow
    flow.state.global_step = step
    start = time.perf_counter()
    flow.saver.save(trainer.lightning_trainer, trainer.module, flow.state, [*flow.handler.callbacks, flow.control])
    elapsed = time.perf_counter() - start
    if not keep:
        shutil.rmtree(os.path.join(trainer.args.output_dir, f"checkpoint-{step}"))
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    with tempfile.TemporaryDirectory() as root:
        hf_trainer, our_trainer = build_hf(root), build_ours(root)
        for saver, trainer in ((save_hf, hf_trainer), (save_ours, our_trainer)):
            saver(trainer, 1000)  # warm-up (first-call imports, allocator)
        files = {}
        for name, trainer in (("hf", hf_trainer), ("ours", our_trainer)):
            (save_hf if name == "hf" else save_ours)(trainer, 1001, keep=True)
            folder = os.path.join(trainer.args.output_dir, "checkpoint-1001")
            files[name] = {f: os.path.getsize(os.path.join(folder, f)) for f in sorted(os.listdir(folder))}
        times: dict[str, list[float]] = {"hf": [], "ours": []}
        for repeat in range(options.repeats):
            order = [("hf", save_hf, hf_trainer), ("ours", save_ours, our_trainer)]
            for name, saver, trainer in order if repeat % 2 == 0 else order[::-1]:
                times[name].append(saver(trainer, 2000 + repeat))
    hf_median, our_median = median(times["hf"]), median(times["ours"])
    paired = median([o / h for o, h in zip(times["ours"], times["hf"])])
    for name, listing in files.items():
        print(f"  {name} files: " + ", ".join(f"{f} ({size / 1e6:.2f} MB)" for f, size in listing.items()))
    params = sum(p.numel() for p in our_trainer.model.parameters()) / 1e6
    print(f"checkpoint save, gpt2 case ({params:.1f}M params), {options.repeats} repeats, {options.threads} thread(s)")
    print(f"  hf   (transformers.Trainer._save_checkpoint): median {hf_median * 1000:7.1f} ms")
    print(f"  ours (hf_lightning CheckpointSaver.save):      median {our_median * 1000:7.1f} ms")
    print(f"  ratio ours/hf of medians: {our_median / hf_median:.3f}   median of paired ratios: {paired:.3f}   "
          f"target <= 1.0: {'met' if our_median / hf_median <= 1.0 else 'NOT met'}")
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"hf": times["hf"], "ours": times["ours"], "ratio_of_medians": our_median / hf_median,
                       "median_paired_ratio": paired, "files": files}, f, indent=2)


if __name__ == "__main__":
    main()
