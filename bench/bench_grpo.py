"""TRL `GRPOTrainer` step time: hf_lightning (`use_as_transformers_trainer()`) vs the real `transformers.Trainer`,
generation and update apart, in the same run.

What runs
---------
A tiny Llama (hidden 64, 2 layers, vocab 44) and a local word-level tokenizer, both built here (no hub); 64 prompts of
2-4 words; `GRPOConfig(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2,
num_iterations=2, max_completion_length=16, beta=0.1, logging_steps=1, save_strategy="no")`, generation by
`model.generate` (no vLLM), a reward function counting one word. The swap is process-wide, so every run is its own
child process (`--child ours|hf`); each repeat runs both, the order alternating.

Timing
------
In the child, per update (HF's `on_step_begin` .. `on_step_end`, fired by both trainers): the wall time of the
update, and inside it the time spent in TRL's `_generate_and_score_completions` (generation, rewards, advantages,
old / reference log-probabilities: a subclass times it, the same code on both bases). update = step - generation.
Wall and CPU (process) time both; on a shared machine the CPU ratio is the steadier one. The first `--warmup`
updates are dropped; medians over the rest; one thread (`torch.set_num_threads(1)`).

Usage::

    python bench/bench_grpo.py                            # 3 repeats of 8 updates (~2-3 min on 2 cores)
    python bench/bench_grpo.py --repeats 1 --steps 2 --warmup 1
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

REPO = Path(__file__).resolve().parents[1]


def _tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.decoders import WordPiece
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(40)]
    core = Tokenizer(WordLevel({t: i for i, t in enumerate(["<pad>", "</s>", "<unk>", "<s>", *words])},
                               unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    core.decoder = WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   bos_token="<s>"), words


def child(base: str, steps: int, warmup: int, out: str) -> None:
    """One GRPO run on `base`; writes the per-update generation and step times to `out`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if base == "ours":
        import hf_lightning

        hf_lightning.use_as_transformers_trainer(lightning_kwargs={"logger": False, "enable_progress_bar": False})
    import random

    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    tokenizer, words = _tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=44, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                         pad_token_id=0, bos_token_id=3, eos_token_id=1))
    work = tempfile.mkdtemp(prefix="bench_grpo_")
    model.save_pretrained(f"{work}/policy")
    tokenizer.save_pretrained(f"{work}/policy")
    rng = random.Random(1)
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 4))) for _ in range(64)]
    generation: list[tuple[float, float]] = []  # (wall, CPU) seconds of each generation

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                generation.append((time.perf_counter() - start, time.process_time() - cpu))

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.rows: list[dict] = []
            self._start = self._cpu = 0.0
            self._generated = 0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start, self._cpu, self._generated = time.perf_counter(), time.process_time(), len(generation)

        def on_step_end(self, args, state, control, **kwargs):
            step, step_cpu = time.perf_counter() - self._start, time.process_time() - self._cpu
            done = generation[self._generated:]
            gen, gen_cpu = sum(w for w, _ in done), sum(c for _, c in done)
            self.rows.append({"step": step, "generation": gen, "update": step - gen, "generated": bool(done),
                              "step_cpu": step_cpu, "generation_cpu": gen_cpu, "update_cpu": step_cpu - gen_cpu})

    def reward(completions, **kwargs):
        return [float(c.split().count("w1")) for c in completions]

    times = StepTimes()
    args = GRPOConfig(output_dir=f"{work}/out", max_steps=steps + warmup, per_device_train_batch_size=4,
                      num_generations=4, gradient_accumulation_steps=2, num_iterations=2, max_completion_length=16,
                      beta=0.1, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
                      disable_tqdm=True, bf16=False, use_cpu=True, seed=0)
    trainer = Timed(model=f"{work}/policy", reward_funcs=reward, args=args,
                    train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tokenizer,
                    callbacks=[times])
    trainer.train()
    Path(out).write_text(json.dumps(times.rows[warmup:]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed updates per run")
    parser.add_argument("--warmup", type=int, default=2, help="updates dropped at the start of each run")
    parser.add_argument("--json", help="write the medians here")
    parser.add_argument("--child", choices=["ours", "hf"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        child(options.child, options.steps, options.warmup, options.out)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    rows: dict[str, list[dict]] = {"ours": [], "hf": []}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(options.repeats):
            for base in (("ours", "hf") if repeat % 2 == 0 else ("hf", "ours")):
                out = f"{folder}/{base}{repeat}.json"
                subprocess.run([sys.executable, __file__, "--child", base, "--steps", str(options.steps),
                                "--warmup", str(options.warmup), "--out", out], env=env, check=True, timeout=1800,
                               stdout=subprocess.DEVNULL)
                rows[base].extend(json.loads(Path(out).read_text()))
    medians = {}
    for base, measured in rows.items():
        generating = [r for r in measured if r["generated"]]
        medians[base] = {"updates": len(measured)}
        for clock in ("", "_cpu"):
            medians[base].update({
                f"generation{clock}": statistics.median(r["generation" + clock] for r in generating)
                if generating else 0.0,
                f"update{clock}": statistics.median(r["update" + clock] for r in measured),
                f"step{clock}": statistics.median(r["step" + clock] for r in measured),
            })
    ours, hf = medians["ours"], medians["hf"]
    print(f"GRPO, {ours['updates']} timed updates per base (medians, seconds per update; generation: per update that "
          "generates; CPU: process time, not counting time other processes took the cores):")
    for name in ("generation", "update", "step"):
        cells = []
        for clock, label in (("", "wall"), ("_cpu", "CPU")):
            o, h = ours[name + clock], hf[name + clock]
            cells.append(f"{label}: ours {o:.4f} hf {h:.4f} ours/hf {o / h if h else float('nan'):.3f}")
        print(f"  {name:<10} " + "   ".join(cells))
    if options.json:
        Path(options.json).write_text(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
