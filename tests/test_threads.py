"""The thread rule: warn when torch's threads outnumber the free cores; never change the thread count."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import hf_lightning
from hf_lightning.run_options.threads import ThreadOversubscriptionWarning, available_cores, oversubscription
from helpers import classification_dataset, tiny_bert


@pytest.mark.parametrize(
    ("threads", "local", "cores", "host", "load", "warns"),
    [
        (2, 1, 2, 2, 0.3, False),   # idle machine: our own process is the load
        (2, 1, 2, 2, 1.0, False),   # only us, busy
        (2, 1, 2, 2, 1.4, False),   # others use 0.4 core: rounds to none
        (2, 1, 2, 2, 1.6, True),    # others use ~1 core of 2
        (2, 1, 2, 2, 3.5, True),    # the busy 2-core machine of the issue
        (1, 1, 2, 2, 9.0, False),   # one thread: nothing better to advise
        (4, 1, 2, 2, 0.0, True),    # more threads than cores
        (4, 1, 8, 64, 20.0, False),  # a container with 8 of 64 host cores: the host's load 20 is ~2 of ours
        (8, 1, 8, 64, 40.0, True),  # host load 40: ~5 of our 8 cores busy
        (8, 1, 8, 8, 4.0, True),    # 8 cores, 3 busy with others
        (1, 2, 2, 2, 3.0, False),   # DDP on CPU, one thread each
        (2, 2, 4, 4, 2.0, False),   # DDP, 2 x 2 threads on 4 idle cores
        (2, 2, 4, 4, 4.0, True),    # DDP, 2 x 2 threads, 2 cores busy with others
    ],
)
def test_rule(threads, local, cores, host, load, warns):
    message = oversubscription(threads, local, cores, host, load)
    assert (message is not None) is warns
    if message:
        assert f"torch uses {threads} threads" in message and "OMP_NUM_THREADS=" in message


def test_message_names_the_number_to_set():
    message = oversubscription(2, 1, 2, 2, 3.5)
    assert "only about 0 of the 2 CPU cores are free (1-minute load average 3.5)" in message
    assert "Set OMP_NUM_THREADS=1 (or call torch.set_num_threads(1))" in message
    assert "OMP_NUM_THREADS=2" in oversubscription(4, 2, 4, 4, 2.0)  # 4 free cores for 2 processes
    assert "OMP_NUM_THREADS=1" in oversubscription(2, 2, 4, 4, 4.0)  # 2 free cores for 2 processes


def test_available_cores():
    assert 1 <= available_cores() <= (os.cpu_count() or 1)


@pytest.fixture
def threads():
    """Set torch's intra-op threads for one test, then restore them."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _fit(tmp_path) -> list[warnings.WarningMessage]:
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                          save_strategy="no", report_to="none", disable_tqdm=True)
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    return [w for w in caught if issubclass(w.category, ThreadOversubscriptionWarning)]


def test_real_fit_warns_with_more_threads_than_cores_and_keeps_them(tmp_path, threads):
    """More threads than cores is oversubscribed whatever the load: the fit warns and leaves the count alone."""
    count = available_cores() + 2
    threads(count)
    (warning,) = _fit(tmp_path)
    assert f"torch uses {count} threads" in str(warning.message)
    assert torch.get_num_threads() == count


def test_real_fit_with_one_thread_does_not_warn(tmp_path, threads):
    threads(1)
    assert _fit(tmp_path) == []
    assert torch.get_num_threads() == 1
