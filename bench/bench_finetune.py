"""Fine-tuning throughput: LoRA (ours vs `transformers.Trainer` vs a hand loop), length-grouped and padding-free
batches (tokens/s vs random padded batches), and `torch_compile` on the CPU (start-up cost, steady speed-up).

What runs
---------
The model is a small Llama built from a config (hidden 256, 4 layers, 4 heads, ffn 688, vocab 8192), the same
weights in every runner (fixed seed).

- `--part lora`: a LoRA adapter (r 8, alpha 16, dropout 0.05, on `q_proj` / `v_proj`) on fixed-length data
  (sequences of 128, batch 8, one micro-batch per update), `max_steps` updates. Runners: `ours`
  (`hf_lightning.Trainer`), `hf` (`transformers.Trainer`), `raw` (a hand loop: HF's seeded order,
  `default_data_collator`, forward, backward, `clip_grad_norm_`, fused AdamW over the trainable parameters in HF's
  two groups, linear schedule). Reported: steady updates/s and ratios (targets: ours >= 1.0x HF, >= 0.97x raw).
- `--part grouping`: the same LoRA model on variable-length rows (uniform 16-256 tokens), batch 8, through `ours`
  only: `random` (padded to the longest row of each batch), `grouped` (`train_sampling_strategy="group_by_length"`,
  padded), `flat` (random order, `DataCollatorWithFlattening`: no padding at all). Reported: real (non-padding)
  tokens per second and the gain over `random`.
- `--part compile`: full fine-tuning of the model on fixed-length data through `ours`, eager vs `torch_compile=True`
  (inductor, its on-disk caches off and a fresh cache folder per run, so the compile is a cold one). Reported: the
  first update's time (compiling happens there) and the steady updates/s after the warm-up (speed-up).

Timing is `common.py`'s (steady rate over the updates after the warm-up, `StepTimer` at each update's end). The
variants of a repeat run interleaved, in an order rotated every repeat, or with `--lockstep` in separate processes
taking turns one update at a time (`lockstep.py`), so load from other processes hits all of them alike; the CPU
share other processes took is printed (`others`).

Usage::

    python bench/bench_finetune.py --part lora --repeats 5 --lockstep
    python bench/bench_finetune.py --part grouping --repeats 3 --lockstep
    python bench/bench_finetune.py --part compile --repeats 2 --lockstep
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    SEED,
    ContentionMeter,
    RunResult,
    StepTimer,
    add_common_flags,
    make_result,
    median,
    paired_ratios,
    rotate,
    run_isolated,
    run_mode,
    wait_for_quiet,
)
from lockstep import run_lockstep  # noqa: E402

VOCAB, SEQ, BATCH = 8192, 128, 8
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
TARGETS = {"ours/hf": 1.0, "ours/raw": 0.97}
LIGHTNING = {"accelerator": "cpu", "enable_progress_bar": False, "logger": False}


def llama(lora: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=4, intermediate_size=688,
                                         max_position_embeddings=512))
    if not lora:
        return model
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **LORA))


def fixed_rows(n: int) -> Any:
    import datasets

    ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(SEED)).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def varied_rows(n: int) -> Any:
    import datasets

    g = torch.Generator().manual_seed(SEED)
    lengths = torch.randint(16, 257, (n,), generator=g).tolist()
    ids = [torch.randint(0, VOCAB, (k,), generator=g).tolist() for k in lengths]
    return datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * k for k in lengths],
                                       "labels": ids})


def trainer_args(steps: int, output_dir: str, **extra: Any) -> dict[str, Any]:
    return {"output_dir": output_dir, "max_steps": steps, "per_device_train_batch_size": BATCH, "seed": SEED,
            "save_strategy": "no", "logging_strategy": "no", "eval_strategy": "no", "report_to": "none",
            "disable_tqdm": True, "learning_rate": 1e-4, **extra}


class CountingCollator:
    """Wraps a collator and records the real (non-padding) tokens of each batch, in order."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.tokens, self.slots = inner, [], []

    def __call__(self, features: list[Any]) -> Any:
        batch = self.inner(features)
        mask = batch.get("attention_mask")
        self.slots.append(int(batch["input_ids"].numel()))
        self.tokens.append(int(mask.sum()) if mask is not None else self.slots[-1])
        return batch


def _train_ours(name: str, model: Any, data: Any, steps: int, warmup: int, output_dir: str,
                collator: Any = None, **extra: Any) -> tuple[RunResult, StepTimer]:
    import hf_lightning

    timer = StepTimer(steps)
    trainer = hf_lightning.Trainer(model=model, args=hf_lightning.TrainingArguments(**trainer_args(
        steps, output_dir, **extra)), train_dataset=data, data_collator=collator, callbacks=[timer],
        lightning_kwargs=dict(LIGHTNING))
    start = time.perf_counter()
    out = trainer.train()
    return make_result(name, timer, warmup, time.perf_counter() - start, out.global_step, out.training_loss), timer


# ----- LoRA: ours vs HF vs a hand loop -----
def lora_ours(steps: int, warmup: int, output_dir: str) -> RunResult:
    return _train_ours("ours", llama(lora=True), fixed_rows(steps * BATCH), steps, warmup, output_dir)[0]


def lora_hf(steps: int, warmup: int, output_dir: str) -> RunResult:
    import transformers

    timer = StepTimer(steps)
    trainer = transformers.Trainer(model=llama(lora=True), args=transformers.TrainingArguments(**trainer_args(
        steps, output_dir)), train_dataset=fixed_rows(steps * BATCH), callbacks=[timer])
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    start = time.perf_counter()
    out = trainer.train()
    return make_result("hf", timer, warmup, time.perf_counter() - start, out.global_step, out.training_loss)


def lora_raw(steps: int, warmup: int, output_dir: str) -> RunResult:
    from torch.utils.data import DataLoader
    from transformers import default_data_collator, get_linear_schedule_with_warmup, set_seed
    from transformers.trainer_pt_utils import get_parameter_names

    set_seed(SEED)
    model = llama(lora=True)
    model.config.use_cache = False  # as both trainers set it
    dataset = fixed_rows(steps * BATCH)
    timer = StepTimer(steps)
    start = time.perf_counter()
    model.train()
    decay = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm", "norm"]))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for n, p in named if n in decay], "weight_decay": 0.0},
                                   {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}],
                                  lr=1e-4, fused=True)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=0, num_training_steps=steps)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(SEED)).tolist()
    loader = DataLoader(dataset, batch_size=BATCH, sampler=order, collate_fn=default_data_collator)
    losses = []
    timer.begin()
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
        timer.mark()
    return make_result("raw", timer, warmup, time.perf_counter() - start, len(losses),
                       float(torch.stack(losses).mean()))


# ----- length grouping and padding-free batches -----
def grouping_run(variant: str, steps: int, warmup: int, output_dir: str) -> RunResult:
    from tokenizers import Tokenizer, models
    from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0}, unk_token="<pad>")),
                                        pad_token="<pad>")
    inner = DataCollatorWithFlattening() if variant == "flat" else DataCollatorForSeq2Seq(tokenizer, padding=True)
    collator = CountingCollator(inner)
    data = varied_rows(steps * BATCH)
    if variant == "flat":
        data = data.remove_columns("attention_mask")
    strategy = "group_by_length" if variant == "grouped" else "random"
    result, timer = _train_ours(variant, llama(lora=True), data, steps, warmup, output_dir, collator,
                                train_sampling_strategy=strategy)
    timed = sum(collator.tokens[warmup:steps])  # the batches of the timed updates, in training order
    result.extra.update(tokens_per_s=timed / sum(timer._durations(warmup)),
                        padding_share=1 - sum(collator.tokens[:steps]) / sum(collator.slots[:steps]))
    return result


# ----- torch_compile on the CPU -----
def compile_run(variant: str, steps: int, warmup: int, output_dir: str) -> RunResult:
    if variant == "compiled":
        import torch._inductor.config as inductor

        inductor.fx_graph_cache = False  # a cold compile: what a first run pays
        inductor.autotune_local_cache = False
        # The C++ kernels inductor builds are also cached on disk (by source hash) whatever `fx_graph_cache` says:
        # without a fresh cache folder per run, a second repeat reuses the first one's kernels (44 s -> 15 s here).
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(output_dir, "inductor-cache")
    extra = {"torch_compile": True} if variant == "compiled" else {}
    result, timer = _train_ours(variant, llama(lora=False), fixed_rows(steps * BATCH), steps, warmup, output_dir,
                                **extra)
    result.extra.update(first_update_s=timer.times[0] - timer.starts[0],
                        slowest_timed_update_s=max(timer._durations(warmup)))
    return result


PARTS = {
    "lora": {"ours": lora_ours, "hf": lora_hf, "raw": lora_raw},
    "grouping": {v: functools.partial(grouping_run, v) for v in ("random", "grouped", "flat")},
    "compile": {v: functools.partial(compile_run, v) for v in ("eager", "compiled")},
}
LOAD: list[float] = []
"""1-minute load averages at the start of each repeat (other processes plus the one running benchmark process)."""
DEFAULT_STEPS = {"lora": (30, 5), "grouping": (40, 5), "compile": (30, 5)}


def run_part(part: str, opts: argparse.Namespace) -> dict[str, list[RunResult]]:
    steps, warmup = opts.steps or DEFAULT_STEPS[part][0], opts.warmup or DEFAULT_STEPS[part][1]
    runners = PARTS[part]
    results: dict[str, list[RunResult]] = {name: [] for name in runners}
    for rep in range(opts.repeats):
        LOAD.append(os.getloadavg()[0])  # the machine's 1-minute load when the repeat starts (2 cores here)
        order = rotate(list(runners), rep)
        partials = [_bind(runners[name], steps, warmup) for name in order]
        if opts.lockstep:
            wait_for_quiet(opts.max_others, opts.quiet_wait)
            with ContentionMeter(children=True) as meter:  # the whole repeat, runner processes counted as ours
                got = run_lockstep(partials, opts.threads)
            for result in got:
                result.others_share = meter.others_share
        else:
            got = [run_isolated(p, opts.threads, opts.quiet_wait, opts.max_others) for p in partials]
        for name, result in zip(order, got):
            results[name].append(result)
            extra = " ".join(f"{k} {v:.4g}" for k, v in result.extra.items())
            others = "n/a" if result.others_share is None else f"{result.others_share:.0%}"
            print(f"  [{part} rep {rep + 1}/{opts.repeats}] {name:8s} steady {result.steady_ups:6.2f} upd/s  "
                  f"median-step {result.median_step_ups:6.2f}  loss {result.loss:.4f}  {extra}  others {others}",
                  flush=True)
    return results


def _bind(runner: Any, steps: int, warmup: int) -> functools.partial:
    """A picklable partial taking the output folder last (what `lockstep.run_lockstep` and `run_isolated` call)."""
    if isinstance(runner, functools.partial):
        return functools.partial(runner.func, *runner.args, steps, warmup)
    return functools.partial(runner, steps, warmup)


def summarize(part: str, results: dict[str, list[RunResult]]) -> dict[str, Any]:
    steady = {name: median([r.steady_ups for r in runs]) for name, runs in results.items()}
    shares = [r.others_share for runs in results.values() for r in runs if r.others_share is not None]
    summary: dict[str, Any] = {"part": part, "steady_updates_per_s": steady,
                               "others_share": median(shares) if shares else None,
                               "load_average_at_repeat_start": [round(x, 2) for x in LOAD]}
    LOAD.clear()
    if part == "lora":
        summary["ratios"] = {f"ours/{o}": steady["ours"] / steady[o] for o in ("hf", "raw")}
        summary["paired"] = {f"ours/{o}": paired_ratios([r.steady_ups for r in results["ours"]],
                                                        [r.steady_ups for r in results[o]]) for o in ("hf", "raw")}
        summary["targets_met"] = {k: summary["ratios"][k] >= v for k, v in TARGETS.items()}
    elif part == "grouping":
        tokens = {name: median([r.extra["tokens_per_s"] for r in runs]) for name, runs in results.items()}
        summary["tokens_per_s"] = tokens
        summary["gain_over_random"] = {name: tokens[name] / tokens["random"] for name in tokens}
        summary["paired_gain"] = {name: paired_ratios([r.extra["tokens_per_s"] for r in results[name]],
                                                      [r.extra["tokens_per_s"] for r in results["random"]])
                                  for name in ("grouped", "flat")}
    else:
        summary["first_update_s"] = {name: median([r.extra["first_update_s"] for r in runs])
                                     for name, runs in results.items()}
        summary["steady_speedup"] = steady["compiled"] / steady["eager"]
        summary["paired_speedup"] = paired_ratios([r.steady_ups for r in results["compiled"]],
                                                  [r.steady_ups for r in results["eager"]])
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--json", default=None)
    add_common_flags(parser)
    opts = parser.parse_args(argv)
    from bench_throughput import quiet

    quiet()
    torch.set_num_threads(opts.threads)
    summaries = []
    for part in PARTS if opts.part == "all" else [opts.part]:
        print(f"\n## {part}: {opts.repeats} repeats, {opts.threads} thread(s), {run_mode(opts)}, torch "
              f"{torch.__version__}", flush=True)
        summary = summarize(part, run_part(part, opts))
        print(json.dumps(summary, indent=2), flush=True)
        summaries.append(summary)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(summaries, f, indent=2)


if __name__ == "__main__":
    main()
