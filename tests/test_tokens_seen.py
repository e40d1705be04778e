"""HF's `include_num_input_tokens_seen`: `num_input_tokens_seen` in every log entry (against the real
`transformers.Trainer`), kept by checkpoints and exact resume, and HF's per-micro-batch counting rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

import hf_lightning
from hf_lightning.flow.tokens_seen import count_input_tokens
from helpers import CPU_QUIET, lm_dataset, lm_run_args, tiny_gpt2


def _ours(out: Path, resume: str | None = None, trainer_cls=hf_lightning.Trainer, **overrides) -> hf_lightning.Trainer:
    trainer = trainer_cls(
        model=tiny_gpt2(), args=hf_lightning.TrainingArguments(output_dir=str(out), **lm_run_args(**overrides)),
        train_dataset=lm_dataset(n=40), eval_dataset=lm_dataset(n=8, seed=1), lightning_kwargs=dict(CPU_QUIET))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _hf(out: Path, **overrides) -> transformers.Trainer:
    trainer = transformers.Trainer(
        model=tiny_gpt2(),
        args=transformers.TrainingArguments(output_dir=str(out), use_cpu=True, **lm_run_args(**overrides)),
        train_dataset=lm_dataset(n=40), eval_dataset=lm_dataset(n=8, seed=1))
    trainer.train()
    return trainer


def _shape(history: list[dict]) -> list[tuple]:
    """Each entry's step, keys (timed values are compared by name only) and token count."""
    return [(e["step"], sorted(e), e.get("num_input_tokens_seen")) for e in history]


@pytest.mark.parametrize("value", ["all", "non_padding", False])
def test_num_input_tokens_seen_matches_hfs_log_history(tmp_path, value, one_thread):
    """Right-padded causal-LM rows, GA=2, logging every update, evaluations: every entry of HF's log_history (training,
    evaluation, summary) has the same keys as ours and HF's `num_input_tokens_seen` (`all`: padding included)."""
    hf = _hf(tmp_path / "hf", include_num_input_tokens_seen=value)
    ours = _ours(tmp_path / "ours", include_num_input_tokens_seen=value)
    assert _shape(ours.state.log_history) == _shape(hf.state.log_history)
    assert ours.state.num_input_tokens_seen == hf.state.num_input_tokens_seen
    if value is False:
        assert hf.state.num_input_tokens_seen == 0
        return
    # the oracle is not trivially equal: padding makes `all` and `non_padding` differ
    padded = 4 * 2 * 4 * 16  # updates x micro-batches x rows x padded length
    assert (hf.state.num_input_tokens_seen == padded) == (value == "all")
    training = [e for e in ours.state.log_history if "loss" in e]
    assert all(e["train_tokens_per_second"] >= 0 and "train_runtime" in e for e in training)
    assert ours.state.log_history[-1]["num_input_tokens_seen"] == hf.state.num_input_tokens_seen  # the summary


def test_num_input_tokens_seen_is_checkpointed_and_exactly_resumed(tmp_path, one_thread):
    """The count is in `trainer_state.json`; a run resumed from checkpoint-2 logs the uninterrupted run's entries."""
    full = _ours(tmp_path / "full", include_num_input_tokens_seen="non_padding", save_strategy="steps", save_steps=2)
    saved = json.loads((tmp_path / "full" / "checkpoint-2" / "trainer_state.json").read_text())
    assert saved["num_input_tokens_seen"] == next(e["num_input_tokens_seen"] for e in full.state.log_history
                                                  if e["step"] == 2 and "loss" in e) > 0
    resumed = _ours(tmp_path / "resumed", include_num_input_tokens_seen="non_padding",
                    resume=str(tmp_path / "full" / "checkpoint-2"))
    assert _shape(resumed.state.log_history) == _shape(full.state.log_history)
    losses = [e["loss"] for e in full.state.log_history if "loss" in e]
    assert [e["loss"] for e in resumed.state.log_history if "loss" in e] == pytest.approx(losses, rel=1e-5)


class _LoggingTrainer(hf_lightning.Trainer):
    """A subclass overriding `log`, as HF users do: HF's addition happens inside the base `log`."""

    def log(self, logs, start_time=None):
        logs["seen_by_override"] = "num_input_tokens_seen" in logs
        super().log(logs, start_time)


def test_a_log_override_gets_the_count_from_the_base_log(tmp_path, one_thread):
    ours = _ours(tmp_path / "ours", trainer_cls=_LoggingTrainer, include_num_input_tokens_seen="all", max_steps=2,
                 eval_strategy="no")
    assert [e["seen_by_override"] for e in ours.state.log_history] == [False, False, False]
    assert [e["num_input_tokens_seen"] for e in ours.state.log_history] == [2 * 4 * 16, 2 * 2 * 4 * 16, 2 * 2 * 4 * 16]
    assert all("train_tokens_per_second" in e for e in ours.state.log_history if "loss" in e)


def test_an_unknown_value_is_refused_and_command_line_spellings_are_read():
    """HF counts any string but `no` / `non_padding` like `all`; a typo is an error here."""
    with pytest.raises(ValueError, match="include_num_input_tokens_seen.*non-padding.*allowed: all, non_padding, no"):
        hf_lightning.TrainingArguments(include_num_input_tokens_seen="non-padding")
    assert hf_lightning.TrainingArguments(include_num_input_tokens_seen="true").include_num_input_tokens_seen == "all"
    assert hf_lightning.TrainingArguments(include_num_input_tokens_seen=True).include_num_input_tokens_seen == "all"
    assert hf_lightning.TrainingArguments(include_num_input_tokens_seen=False).include_num_input_tokens_seen == "no"


def test_count_input_tokens_follows_hfs_rule(caplog):
    ids = torch.tensor([[5, 6, 0], [7, 0, 0]])
    assert count_input_tokens({"input_ids": ids}, "input_ids", "all", 0) == 6
    assert int(count_input_tokens({"input_ids": ids, "attention_mask": (ids != 0).long()}, "input_ids",
                                  "non_padding", None)) == 3
    assert int(count_input_tokens({"input_ids": ids}, "input_ids", "non_padding", 0)) == 3  # by the pad token
    with caplog.at_level("WARNING", logger="hf_lightning.flow.tokens_seen"):
        assert count_input_tokens({"input_ids": ids}, "input_ids", "non_padding", None) == 6  # HF's fallback
    assert "falling back to counting all tokens" in caplog.text
    assert count_input_tokens({"pixel_values": ids}, "input_ids", "all", None) is None
    assert count_input_tokens((ids, ids), "input_ids", "all", None) is None
