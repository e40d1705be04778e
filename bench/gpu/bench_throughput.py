"""GPU throughput: `hf_lightning.Trainer` vs `transformers.Trainer` vs a hand-written loop, bf16, sequence 1024.

Cases (models built from configs, seeded, identical weights for the three runners):

- `gpt2`: GPT-2 124M (12 layers, 768 wide, 12 heads, vocabulary 50257), batch 8 x 1024 tokens.
- `llama1b`: a ~1.1B Llama (TinyLlama's shape: 22 layers, 2048 wide, 32 heads / 4 KV heads, MLP 5632, vocabulary
  32000), batch 8 x 1024 tokens, SDPA attention.
- `llama1b-lora`: the same with LoRA (r 16, alpha 32, q/k/v/o projections; PEFT), batch 8 x 1024.
- `gpt2-fsdp2`: GPT-2 124M under FSDP2 (`fsdp="full_shard auto_wrap"`, one process: world size 1), bf16 with HF's
  `MixedPrecisionPolicy` (parameters gathered, gradients reduced and outputs cast in bf16, fp32 masters): ours
  (`HFFSDP2Strategy`), HF's through accelerate (`fsdp2_prepare_model`), the loop with `fully_shard` per block and the
  root and the same policy. Last: it sets a one-process torch.distributed environment (RANK=0, WORLD_SIZE=1...) that
  would make the other cases distributed.

Every runner: bf16 autocast over fp32 weights (HF's `bf16=True`; Lightning's `bf16-mixed`; `torch.autocast` in the
loop), fused AdamW (HF's default `adamw_torch_fused`), linear schedule, clipping at 1.0, no logging, saving or
evaluation, the same random-token rows in the same seeded order. Runners are interleaved (the order rotates per
repeat). Timing: `torch.cuda.synchronize()` then `perf_counter()` at the end of each update (HF's `on_step_end`, the
loop's own end of update), steady rate over the updates after `warmup`: tokens/s = updates/s x batch x 1024. MFU =
tokens/s x FLOPs per token / the GPU's dense bf16 peak (`hf_lightning.flow.peak_flops`); FLOPs per token = 6 N + 12 L d S
(weights forward and backward, plus attention scores; N the parameters outside the input embeddings, the output
projection counted even when tied to them), with LoRA 4 N_base + 6 N_lora + 12 L d S (no weight gradients for the
frozen base). Peak memory: `torch.cuda.max_memory_allocated()` over the run (reset before it).

Targets: ours >= 1.0x HF tokens/s, ours >= 0.97x the hand loop, ours' peak memory <= HF's.

Usage::

    python bench/gpu/bench_throughput.py --json out.json                 # every case, 1 repeat
    python bench/gpu/bench_throughput.py --case gpt2 --repeats 3 --steps 60
    python bench/gpu/bench_throughput.py --tiny-cpu --json out.json      # tiny gpt2 and llama-lora on the CPU,
                                                                          # 3 updates: a check that the script runs
                                                                          # (check.sh --dry-run), no figures
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import SEED, StepTimer, rotate  # noqa: E402

SEQ = 1024
TARGETS = {"ours/hf tokens_per_s": 1.0, "ours/raw tokens_per_s": 0.97, "ours/hf peak_memory (at most)": 1.0}


@dataclass
class Case:
    name: str
    family: str  # "gpt2" / "llama"
    lora: bool
    batch: int
    steps: int
    warmup: int
    config: dict[str, Any]
    fsdp: bool = False


CASES = {
    "gpt2": Case("gpt2", "gpt2", False, 8, 40, 10,
                 dict(n_embd=768, n_layer=12, n_head=12, n_positions=SEQ, vocab_size=50257)),
    "llama1b": Case("llama1b", "llama", False, 8, 20, 5,
                    dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                         intermediate_size=5632, vocab_size=32000, max_position_embeddings=SEQ)),
    "llama1b-lora": Case("llama1b-lora", "llama", True, 8, 20, 5,
                         dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                              intermediate_size=5632, vocab_size=32000, max_position_embeddings=SEQ)),
    "gpt2-fsdp2": Case("gpt2-fsdp2", "gpt2", False, 8, 40, 10,
                       dict(n_embd=768, n_layer=12, n_head=12, n_positions=SEQ, vocab_size=50257), fsdp=True),
}
TINY = {  # --tiny-cpu: the same code paths on the CPU in seconds
    "gpt2": dict(n_embd=32, n_layer=2, n_head=2, n_positions=64, vocab_size=128),
    "llama": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=64, vocab_size=128, max_position_embeddings=64),
}


class SyncedTimer(StepTimer):
    """`StepTimer` that waits for the GPU before each reading (kernels run asynchronously)."""

    def mark(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        super().mark()


class Rows(torch.utils.data.Dataset):
    """Random token rows of one length, labels = inputs (a causal LM's own shift)."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(SEED)
        self.ids = torch.randint(0, vocab, (n, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}


def build_model(case: Case, device: str, tiny: bool) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    config = TINY[case.family] if tiny else case.config
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: a 1B model initialised on the CPU takes long
        if case.family == "gpt2":
            model = GPT2LMHeadModel(GPT2Config(**config, attn_implementation="sdpa"))
        else:
            model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa"))
    model.config.use_cache = False
    if case.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    return model


def flops_per_token(model: torch.nn.Module, case: Case, tiny: bool) -> float:
    config = TINY[case.family] if tiny else case.config
    layers = config.get("n_layer", config.get("num_hidden_layers"))
    width = config.get("n_embd", config.get("hidden_size"))
    embedding = {"wte", "wpe", "embed_tokens"}
    base = sum(p.numel() for n, p in model.named_parameters()
               if not any(f"{e}." in n for e in embedding) and "lora_" not in n)
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    if not any("lm_head" in n for n, _ in model.named_parameters()):  # tied to the input embedding (GPT-2): the
        base += config.get("vocab_size", 0) * width  # output projection is still a matmul per token
    attention = 12 * layers * width * SEQ
    return (4 * base + 6 * lora + attention) if case.lora else (6 * base + attention)


def _args(case: Case, steps: int, output_dir: str, tiny: bool) -> dict[str, Any]:
    fsdp = {"fsdp": "full_shard auto_wrap"} if case.fsdp else {}
    return dict(**fsdp, output_dir=output_dir, max_steps=steps, per_device_train_batch_size=2 if tiny else case.batch,
                seed=SEED, bf16=not tiny, use_cpu=tiny, save_strategy="no", logging_strategy="no", eval_strategy="no",
                report_to="none", disable_tqdm=True, learning_rate=1e-4, max_grad_norm=1.0, optim="adamw_torch_fused")


def run_ours(case, model, rows, steps, timer, output_dir, tiny):
    import hf_lightning

    trainer = hf_lightning.Trainer(
        model=model, args=hf_lightning.TrainingArguments(**_args(case, steps, output_dir, tiny)), train_dataset=rows,
        callbacks=[timer], lightning_kwargs={"accelerator": "cpu" if tiny else "gpu", "devices": 1,
                                             "enable_progress_bar": False, "logger": False})
    return trainer.train().training_loss


def run_hf(case, model, rows, steps, timer, output_dir, tiny):
    import transformers

    args = _args(case, steps, output_dir, tiny)
    trainer = transformers.Trainer(model=model, args=transformers.TrainingArguments(**args), train_dataset=rows,
                                   callbacks=[timer])
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    return trainer.train().training_loss


def run_raw(case, model, rows, steps, timer, output_dir, tiny):
    from torch.utils.data import DataLoader
    from transformers import default_data_collator, get_linear_schedule_with_warmup

    device = "cpu" if tiny else "cuda"
    model.to(device).train()
    if case.fsdp:  # as accelerate's fsdp2_prepare_model: each block, then the root, HF's bf16 policy
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        low = torch.float32 if tiny else torch.bfloat16
        policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low, output_dtype=low)
        mesh = init_device_mesh(device, (1,))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, steps)
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(SEED)).tolist()
    loader = DataLoader(rows, batch_size=_args(case, steps, output_dir, tiny)["per_device_train_batch_size"],
                        sampler=order, collate_fn=default_data_collator, pin_memory=not tiny)
    losses = []
    timer.begin()
    for batch in loader:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device, dtype=torch.bfloat16, enabled=not tiny):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        timer.mark()
    return float(torch.stack(losses).float().mean())


RUNNERS = {"ours": run_ours, "hf": run_hf, "raw": run_raw}


def run_one(name: str, case: Case, steps: int, warmup: int, tiny: bool, peak: float | None) -> dict[str, Any]:
    import tempfile

    gc.collect()
    device = "cpu" if tiny else "cuda"
    if case.fsdp:
        _one_process_group(tiny)
    if not tiny:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = build_model(case, device, tiny)
    batch = 2 if tiny else case.batch
    rows = Rows(steps * batch, 32 if tiny else SEQ, TINY[case.family]["vocab_size"] if tiny
                else case.config["vocab_size"])
    per_token = flops_per_token(model, case, tiny)
    timer = SyncedTimer(steps)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        loss = RUNNERS[name](case, model, rows, steps, timer, tmp, tiny)
    total = time.perf_counter() - start
    updates = timer.steady_rate(warmup)
    tokens = updates * batch * (32 if tiny else SEQ)
    result = {"runner": name, "updates_per_s": updates, "tokens_per_s": tokens, "train_wall_s": total,
              "loss": loss, "peak_memory_gb": None if tiny else torch.cuda.max_memory_allocated() / 2**30,
              "mfu": None if peak is None else tokens * per_token / peak, "flops_per_token": per_token}
    del model
    return result


def _one_process_group(tiny: bool) -> None:
    """A one-process torch.distributed environment and process group, as torchrun would give (FSDP2 needs one)."""
    import torch.distributed as dist

    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29561"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    if not dist.is_initialized():
        dist.init_process_group("gloo" if tiny else "nccl")


def _median(values: list[float]) -> float:
    ordered, middle = sorted(values), len(values) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def summarize(case: Case, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    med = {name: {key: (_median([r[key] for r in rs]) if rs[0][key] is not None else None)
                  for key in ("tokens_per_s", "mfu", "peak_memory_gb")} for name, rs in runs.items()}
    ratios = {}
    if {"ours", "hf"} <= set(med):
        ratios["ours/hf tokens_per_s"] = med["ours"]["tokens_per_s"] / med["hf"]["tokens_per_s"]
        if med["ours"]["peak_memory_gb"] is not None:
            ratios["ours/hf peak_memory (at most)"] = med["ours"]["peak_memory_gb"] / med["hf"]["peak_memory_gb"]
    if {"ours", "raw"} <= set(med):
        ratios["ours/raw tokens_per_s"] = med["ours"]["tokens_per_s"] / med["raw"]["tokens_per_s"]
    met = {key: (value <= TARGETS[key] if "at most" in key else value >= TARGETS[key]) for key, value in ratios.items()}
    return {"case": case.name, "median": med, "ratios": ratios, "targets": TARGETS, "targets_met": met, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="updates per run (default: per case)")
    parser.add_argument("--tiny-cpu", action="store_true", help="tiny models on the CPU, 3 updates: runs, no figures")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    tiny = opts.tiny_cpu
    if not tiny and not torch.cuda.is_available():
        print("no CUDA device: use --tiny-cpu for the CPU check", file=sys.stderr)
        return 2
    from hf_lightning.flow.peak_flops import peak_flops

    device_name = "cpu" if tiny else torch.cuda.get_device_name()
    peak = None if tiny else peak_flops(device_name, "bf16")
    summaries = []
    names = list(CASES) if opts.case == "all" else [opts.case]
    if tiny and opts.case == "all":
        names = ["gpt2", "llama1b-lora", "gpt2-fsdp2"]  # both families, PEFT, FSDP2: the code paths, in less time
    for name in names:
        case = CASES[name]
        steps = 3 if tiny else (opts.steps or case.steps)
        warmup = 1 if tiny else max(1, min(case.warmup, steps // 2))
        runs: dict[str, list[dict[str, Any]]] = {runner: [] for runner in RUNNERS}
        for repeat in range(opts.repeats):
            for runner in rotate(list(RUNNERS), repeat):
                result = run_one(runner, case, steps, warmup, tiny, peak)
                runs[runner].append(result)
                print(f"[{name} {repeat + 1}/{opts.repeats}] {runner:4s} {result['tokens_per_s']:10.0f} tok/s  "
                      f"mfu {result['mfu'] if result['mfu'] is None else round(result['mfu'], 3)}  "
                      f"peak {result['peak_memory_gb']} GiB  loss {result['loss']:.4f}", flush=True)
        summary = summarize(case, runs)
        if tiny:  # the code paths ran; tiny CPU rates say nothing about the targets
            summary["targets_met"] = {}
            summary["note"] = "--tiny-cpu: a check that the bench runs, no figures"
        print(json.dumps({k: summary[k] for k in ("case", "median", "ratios", "targets_met")}), flush=True)
        summaries.append(summary)
        if opts.json:  # after every case: a timeout later still leaves the cases done
            with open(opts.json, "w") as f:
                json.dump({"device": device_name, "torch": torch.__version__, "tiny_cpu": tiny, "cases": summaries},
                          f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
