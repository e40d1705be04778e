"""Time of the memory plan (`hf_lightning/run_options/memory_plan.py`) for a ~1B-parameter Llama on the CPU.

The model is built on the meta device (no weights at all); the plan copies it onto fake tensors and traces one
AdamW update at `--micro-batch` x `--seq-len`, then reads the largest micro-batch under `--budget` off a second
trace at twice the micro-batch. Nothing real is allocated: the process's peak RSS is printed to show it. Target:
under 10 s for the whole plan (issue 34). The plan's accuracy is checked by tests/test_memory_plan.py (README
"Memory plan").

Usage: python bench/bench_memory_plan.py [--layers 16] [--hidden 2048] [--micro-batch 4] [--seq-len 512]
       [--budget 40GiB] [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from hf_lightning.cli.plan import parse_size
from hf_lightning.run_options.memory_plan import MemoryPlan, format_bytes, plan_memory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--budget", type=parse_size, default=parse_size("40GiB"))
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args(argv)
    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)  # the trace runs no kernels: one thread, as on a busy machine
    config = LlamaConfig(hidden_size=options.hidden, intermediate_size=options.intermediate,
                         num_hidden_layers=options.layers, num_attention_heads=options.heads,
                         num_key_value_heads=options.heads, vocab_size=options.vocab)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    example = {"input_ids": torch.zeros(1, 8, dtype=torch.long), "attention_mask": torch.ones(1, 8, dtype=torch.long),
               "labels": torch.zeros(1, 8, dtype=torch.long)}

    def optimizer(fake: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in fake.parameters() if p.requires_grad], lr=1e-4)

    def plan(find_largest: bool) -> MemoryPlan:
        return plan_memory(model, example, options.micro_batch, options.seq_len, optimizer,
                           device=torch.device("cpu"), max_grad_norm=1.0, budget=options.budget,
                           find_largest=find_largest)

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}  # less sensitive than the wall time to a busy machine
    result = None
    for _ in range(options.repeats):
        for find_largest in (False, True):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = plan(find_largest)
            times[find_largest].append(time.perf_counter() - start)
            cpu[find_largest].append(time.process_time() - start_cpu)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert result is not None
    print(f"Llama {n_params / 1e9:.2f}B parameters ({options.layers} layers, hidden {options.hidden}), built on meta; "
          f"AdamW, fp32, micro-batch {options.micro_batch} x sequence {options.seq_len}, {options.repeats} repeats")
    print(result.line())
    print(f"peak RSS of this process: {format_bytes(rss_before)} before the plans, {format_bytes(rss_after)} after "
          f"(the plan's peak: {format_bytes(result.peak)})")
    one, both = statistics.median(times[False]), statistics.median(times[True])
    print(f"plan at one micro-batch: median {one:.2f} s (CPU {statistics.median(cpu[False]):.2f} s); with the "
          f"largest micro-batch under the budget: median {both:.2f} s (CPU {statistics.median(cpu[True]):.2f} s; "
          "target < 10 s)")


if __name__ == "__main__":
    main()
