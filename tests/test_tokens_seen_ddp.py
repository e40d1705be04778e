"""`include_num_input_tokens_seen` under 2 processes (gloo): every log entry's `num_input_tokens_seen` counts the
tokens of both processes, as HF's gathered count does."""

from __future__ import annotations


def test_tokens_are_summed_over_processes(ddp_train_runs: dict[str, dict]) -> None:
    # one launch shared with tests/test_ddp.py (the `ddp_train_runs` fixture in tests/conftest.py)
    history = ddp_train_runs["tokens"]["log_history"]
    # each entry (training, evaluation, summary): updates x micro-batches x processes x rows x tokens (classification
    # rows: 12 tokens, none padding)
    assert [e["num_input_tokens_seen"] for e in history] == [e["step"] * 2 * 2 * 4 * 12 for e in history]
    assert [e["step"] for e in history if "loss" in e] == [1, 2, 3, 4, 5, 6]
    # include_throughput (ours) counts from the same per-update counts: every training entry has a rate
    assert all(e["tokens_per_second"] > 0 for e in history if "loss" in e)
