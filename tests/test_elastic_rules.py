"""The pure rules of an elastic resume (hf_lightning/checkpoint/elastic.py, data/sampling.py `shard_rest`)."""

from __future__ import annotations

import pytest

from hf_lightning.checkpoint.elastic import (
    ElasticResume,
    elastic_max_steps,
    elastic_resume,
    hf_rule_rows,
    keep_global_batch_accumulation,
    updates_per_epoch,
)
from hf_lightning.data.sampling import shard_rest

GEOMETRY = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "world_size": 1,
            "train_samples": 24, "dataloader_drop_last": False}
ORDER = {"num_samples": 24, "seed": 3, "shuffle": True}


def saved(windows_done: int, samples_done: int, finished: bool = False, **geometry) -> dict:
    return {"global_step": windows_done, "epoch": 0, "windows_done": windows_done, "epoch_finished": finished,
            "geometry": {**GEOMETRY, **geometry}, "sample_position": {**ORDER, "samples_done": samples_done}}


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("rest", [1, 7, 16, 20])
def test_the_rest_of_an_epoch_is_shared_once_with_as_many_micro_batches_per_process(world, rest):
    rows = list(range(100, 100 + rest))
    shards = [shard_rest(rows, 4, world, rank, False) for rank in range(world)]
    assert len({len(s) for s in shards}) == 1  # every process steps as often
    flat = sorted(r for s in shards for batch in s for r in batch)
    if rest >= world or rest % (4 * world) == 0:
        assert flat == rows  # every row exactly once
    else:  # fewer rows than processes in the last round: completed as accelerate does
        assert set(flat) == set(rows)


def test_the_same_geometry_from_a_window_position_keeps_the_exact_resume():
    assert elastic_resume(saved(2, 8), GEOMETRY, ORDER, 6, 4) is None


def test_another_world_size_continues_at_the_sample_position():
    now = {**GEOMETRY, "world_size": 2}
    assert elastic_resume(saved(2, 8), now, ORDER, 3, 2) == ElasticResume(0, 8, 2, 1)
    assert elastic_resume(saved(6, 24, finished=True), now, ORDER, 3, 3) == ElasticResume(1, 0, 3, 0)
    # another order (seed, dataset) or a checkpoint without a sample position: HF's rule (None)
    assert elastic_resume(saved(2, 8), now, {**ORDER, "seed": 4}, 3, 2) is None
    assert elastic_resume(saved(2, 8), {**now, "train_samples": 20}, ORDER, 3, 2) is None
    assert elastic_resume({**saved(2, 8), "sample_position": None}, now, ORDER, 3, 2) is None


def test_an_epoch_based_run_counts_the_updates_it_really_does():
    # 1 -> 2 processes after 1 update of 6: 20 rows left (3 updates of 8), then one epoch of 3
    assert elastic_max_steps(6, 3, 1, ElasticResume(0, 4, 3, 0)) == 7
    assert updates_per_epoch(GEOMETRY) == 6 and updates_per_epoch({**GEOMETRY, "world_size": 3}) == 2


def test_keep_global_batch_sets_the_accumulation_or_refuses_with_the_numbers():
    two = {**GEOMETRY, "world_size": 2, "gradient_accumulation_steps": 3}  # global batch 24
    assert keep_global_batch_accumulation(two, 4, 1, "ckpt") == 6
    assert keep_global_batch_accumulation(two, 2, 3, "ckpt") == 4
    with pytest.raises(ValueError, match=r"global batch is 24 \(4 per device x 3 accumulation x 2 process\(es\)\), "
                                         r"which per_device_train_batch_size=5 x 1 process\(es\) = 5 does not divide"):
        keep_global_batch_accumulation(two, 5, 1, "ckpt")
    with pytest.raises(ValueError, match="does not record its global batch"):
        keep_global_batch_accumulation(None, 4, 1, "ckpt")


def test_hf_rule_names_the_rows_it_skips_or_repeats():
    old = {**saved(1, 4), "sample_position": None}
    assert hf_rule_rows(old, GEOMETRY, {**GEOMETRY, "world_size": 2}, 0, 1) == (
        "4 row(s) of the order (samples 4..7, counted over epochs) are never trained")
    assert hf_rule_rows(saved(3, 12), GEOMETRY, {**GEOMETRY, "per_device_train_batch_size": 2}, 0, 3) == (
        "6 row(s) of the order (samples 6..11, counted over epochs) are trained twice")
