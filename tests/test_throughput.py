"""Our `include_throughput` (`tokens_per_second`, `mfu`, and their totals at the end), counted with HF's rule for
`include_num_input_tokens_seen` (whose parity with `transformers.Trainer` is tests/test_tokens_seen.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hf_lightning
from hf_lightning.flow.throughput import Throughput
from hf_lightning.flow.peak_flops import peak_flops, precision_kind
from helpers import CPU_QUIET, lm_dataset, lm_run_args, tiny_gpt2


def _ours(out: Path, model=None, train=None, resume=None, **overrides) -> hf_lightning.Trainer:
    trainer = hf_lightning.Trainer(
        model=model or tiny_gpt2(),
        args=hf_lightning.TrainingArguments(output_dir=str(out), **lm_run_args(**{"max_steps": 5, "logging_steps": 2,
                                                                                    **overrides})),
        train_dataset=train if train is not None else lm_dataset(n=40), eval_dataset=lm_dataset(n=8, seed=1),
        lightning_kwargs=dict(CPU_QUIET))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_throughput_values_follow_tokens_and_flops(tmp_path, one_thread):
    """Unpadded rows (every input token counts): in each training entry `mfu / tokens_per_second` is the model FLOPs
    per token (HF's `6 * non-embedding parameters`) over the given peak; the summary has the totals; an HF-parity
    run without the option has none of these keys."""
    model = tiny_gpt2()
    per_token = 6 * model.num_parameters(exclude_embeddings=True)
    peak = 1e6  # a tiny made-up peak, so that the rounded mfu keeps its digits
    ours = _ours(tmp_path / "ours", model=model, train=lm_dataset(n=40, padded=False), include_throughput=True,
                 peak_flops_per_device=peak)
    training = [e for e in ours.state.log_history if "loss" in e]
    assert len(training) == 2
    for entry in training:
        assert entry["tokens_per_second"] > 0
        assert entry["mfu"] / entry["tokens_per_second"] == pytest.approx(per_token / peak, rel=1e-3)
    summary = ours.state.log_history[-1]
    assert summary["train_tokens_per_second"] == pytest.approx(5 * 8 * 16 / summary["train_runtime"], rel=2e-3)
    assert summary["train_mfu"] == pytest.approx(summary["train_tokens_per_second"] * per_token / peak, rel=2e-3)
    plain = _ours(tmp_path / "plain", model=tiny_gpt2(), train=lm_dataset(n=40, padded=False))
    assert not any(key in e for e in plain.state.log_history for key in ("tokens_per_second", "mfu", "train_mfu"))


def test_no_mfu_without_a_known_peak(tmp_path, one_thread):
    ours = _ours(tmp_path / "ours", include_throughput=True)
    assert all("tokens_per_second" in e and "mfu" not in e for e in ours.state.log_history if "loss" in e)
    assert "train_tokens_per_second" in ours.state.log_history[-1] and "train_mfu" not in ours.state.log_history[-1]


def test_the_window_leaves_evaluation_time_out(monkeypatch):
    """The arithmetic of one window, on a controlled clock: 2 s of which 1.5 s evaluating, 100 tokens: 200 tokens/s."""
    import hf_lightning.flow.throughput as throughput

    clock = iter([10.0, 12.0])
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
    meter = Throughput(peak_flops=1e3, world_size=2)
    meter.start(torch.device("cpu"), total_flos=50.0)
    meter.add_window([{"input_ids": torch.ones(2, 60), "attention_mask": torch.ones(2, 60)[:, :50]}], None, None)
    meter.exclude(1.5)
    assert meter.window_metrics(None, total_flos=350.0) == {"tokens_per_second": 200.0, "mfu": 0.3}


def test_throughput_says_once_that_it_counts_every_token(caplog):
    """Batches without `attention_mask` and no pad token: every token counts, and our option says so once per run
    (HF's `include_num_input_tokens_seen` repeats its warning at every micro-batch; that one is kept as HF's)."""
    meter = Throughput(peak_flops=None, world_size=1)
    meter.start(torch.device("cpu"), total_flos=0.0)
    with caplog.at_level("WARNING", logger="hf_lightning.flow.throughput"):
        for _ in range(3):
            meter.add_window([{"input_ids": torch.ones(2, 5)}, {"input_ids": torch.ones(2, 5)}], None, None)
    assert [r.getMessage() for r in caplog.records if "counts every input token" in r.getMessage()] != []
    assert len(caplog.records) == 1
    assert meter.summary(None, total_flos=0.0, runtime=1.0)["train_tokens_per_second"] == 60.0


@pytest.mark.parametrize("name, precision, tf32, expected", [
    ("NVIDIA A100-SXM4-80GB", "bf16-mixed", False, 312e12),
    ("NVIDIA A100-SXM4-80GB", "32-true", False, 19.5e12),
    ("NVIDIA A100-SXM4-80GB", "32-true", True, 156e12),
    ("NVIDIA H100 80GB HBM3", "bf16-mixed", False, 989.4e12),
    ("NVIDIA H100 PCIe", "16-mixed", False, 756e12),
    ("NVIDIA H200", "bf16-true", False, 989.4e12),
    ("NVIDIA L4", "bf16-mixed", False, 121e12),
    ("NVIDIA L40S", "bf16-mixed", False, 362.05e12),
    ("NVIDIA A10G", "bf16-mixed", False, 125e12),
    ("Tesla V100-SXM2-16GB", "16-mixed", False, 125e12),
    ("Tesla V100-SXM2-16GB", "bf16-mixed", False, None),  # no bf16 tensor cores
    ("Tesla T4", "16-mixed", False, 65e12),
    ("NVIDIA GeForce RTX 4090", "bf16-mixed", False, 165.2e12),
    ("AMD Instinct MI300X", "bf16-mixed", False, None),
])
def test_peak_flops_table(name, precision, tf32, expected):
    assert peak_flops(name, precision_kind(precision, tf32)) == expected


def test_peak_flops_per_device_must_be_positive():
    with pytest.raises(ValueError, match="peak_flops_per_device"):
        hf_lightning.TrainingArguments(peak_flops_per_device=0)
