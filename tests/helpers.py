"""Tiny models and datasets built locally (no hub access), shared by the tests."""

from __future__ import annotations

import importlib.util
import json
import queue
import random
import subprocess
import threading
from pathlib import Path
from types import ModuleType

import torch
from datasets import Dataset
from torch.utils.data import Dataset as TorchDataset

VOCAB = 64
SCRIPTS = Path(__file__).parent / "scripts"


def load_script(name: str) -> ModuleType:
    """`tests/scripts/<name>.py` imported as a module, to call its functions in this process."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_bert(num_labels: int = 2, dropout: float = 0.0, seed: int = 0):
    """A 2-layer BERT classifier with hidden size 32."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, num_labels=num_labels, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout, pad_token_id=0,
    )
    return BertForSequenceClassification(config)


def tiny_gpt2(dropout: float = 0.0, seed: int = 0):
    """A 2-layer GPT-2 LM with n_embd 32."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, resid_pdrop=dropout,
        embd_pdrop=dropout, attn_pdrop=dropout, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    return GPT2LMHeadModel(config)


def classification_dataset(n: int = 48, length: int = 12, seed: int = 0) -> Dataset:
    """Label 1 when token 5 occurs in the sequence: learnable by a tiny BERT."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "attention_mask": [], "label": []}
    for _ in range(n):
        ids = [rng.randrange(6, VOCAB) for _ in range(length)]
        label = rng.random() < 0.5
        if label:
            ids[rng.randrange(length)] = 5
        rows["input_ids"].append(ids)
        rows["attention_mask"].append([1] * length)
        rows["label"].append(int(label))
    return Dataset.from_dict(rows)


def lm_dataset(n: int = 40, max_length: int = 16, seed: int = 0, padded: bool = True) -> Dataset:
    """Causal-LM rows of varying length, right-padded with labels -100 on padding."""
    rng = random.Random(seed)
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    for _ in range(n):
        length = rng.randrange(4, max_length + 1) if padded else max_length
        ids = [rng.randrange(3, VOCAB) for _ in range(length)]
        pad = max_length - length
        rows["input_ids"].append(ids + [0] * pad)
        rows["attention_mask"].append([1] * length + [0] * pad)
        rows["labels"].append(ids + [-100] * pad)
    return Dataset.from_dict(rows)


class RecordingDataset(TorchDataset):
    """A map-style dataset that records every index it serves, in order (the training order)."""

    def __init__(self, rows) -> None:
        self.rows = rows
        self.seen: list[int] = []

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        self.seen.append(int(index))
        return self.rows[int(index)]


CPU_QUIET = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}
"""`lightning_kwargs` of a test run on the CPU with no Lightning logger or progress bar."""


def lm_run_args(**overrides) -> dict:
    """Training arguments of the small GPT-2 runs of the token-count tests (HF's names, valid for both trainers):
    GA=2, evaluation every 3 updates, no saves; `overrides` win."""
    return {**dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=4, logging_steps=1,
                   eval_strategy="steps", eval_steps=3, save_strategy="no", seed=7, report_to="none",
                   disable_tqdm=True, optim="adamw_torch"), **overrides}


VOLATILE_LOG_KEYS = ("runtime", "per_second", "train_loss", "total_flos")
"""Log keys that differ between equal runs: timings, and the train summary's values (they cover one `train()` call)."""


def stable_log(trainer, after: int = 0) -> list[dict]:
    """The trainer's log entries after step `after`, without the train summary and the `VOLATILE_LOG_KEYS`."""
    return [{k: v for k, v in e.items() if not any(word in k for word in VOLATILE_LOG_KEYS)}
            for e in trainer.state.log_history if e["step"] > after and "train_runtime" not in e]


def assert_logs_close(got: list[dict], want: list[dict], rel: float = 1e-5) -> None:
    """The same non-empty sequence of log entries (same keys), values equal to `rel` (runs of two trainers)."""
    import pytest

    assert [sorted(e) for e in got] == [sorted(e) for e in want] and got
    for a, b in zip(got, want):
        assert a == pytest.approx(b, rel=rel), b["step"]


def wait_for_line(process: subprocess.Popen, prefix: str, timeout: float) -> str:
    """The first line of `process`'s stdout (text mode) starting with `prefix`, waited for at most `timeout` seconds.

    The lines are read in a daemon thread, so a child that never prints the line (or prints it into a full pipe
    while the test waits) fails the test with what was awaited instead of hanging it; the child is then killed.
    """
    found: queue.Queue = queue.Queue()

    def read() -> None:
        for line in process.stdout:  # type: ignore[union-attr]  # bounded: this thread, awaited with a timeout
            if line.startswith(prefix):
                found.put(line)
                return
        found.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        line = found.get(timeout=timeout)
    except queue.Empty:
        process.kill()
        process.wait(timeout=60)
        raise AssertionError(f"the child printed no line starting with {prefix!r} within {timeout} s") from None
    if line is None:
        process.wait(timeout=60)
        raise AssertionError(f"the child ended (status {process.returncode}) without a line starting with {prefix!r}")
    return line


def communicate_within(process: subprocess.Popen, timeout: float, what: str = "the child") -> tuple[str, str]:
    """`process.communicate()` bounded by `timeout` seconds: its stdout and stderr, or the test fails after the process
    is killed (and reaped, within 60 s more)."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate(timeout=60)
        raise AssertionError(f"{what} did not end within {timeout} s") from None


def child_result(process: subprocess.Popen, timeout: float, what: str = "the child") -> dict:
    """The JSON of the last `RESULT ` line `process` (text pipes) prints, once it has ended within `timeout` seconds
    with status 0; otherwise the test fails with its output (under torchrun, each process's `[rankN]:` traceback
    lines first: torchrun's own output often pushes them out of the tail)."""
    out, err = communicate_within(process, timeout, what)
    tracebacks = "\n".join(line for line in err.splitlines() if line.startswith("[rank") and "]:" in line[:9])
    assert process.returncode == 0, out[-3000:] + tracebacks[-6000:] + err[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-3000:] + err[-6000:]
    return json.loads(lines[-1][len("RESULT "):])
