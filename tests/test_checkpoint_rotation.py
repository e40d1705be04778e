"""`save_total_limit` rotation against HF's own `rotate_checkpoints` / end-of-training cleanup (the oracle).

Real folders with chosen names and modification times (several mtimes within one second, spread over seconds,
the best folder anywhere, temporary folders of an unfinished save) are rotated by HF's function in one copy, and our
pure functions choose the deletions in another: the survivors must be the same.

One deliberate difference: HF's rotation globs `checkpoint-*` and so also deletes folders the run did not write
(`checkpoint-best`, `checkpoint-7x`, a user's `checkpoint-5-backup`). Ours only ever sees `checkpoint-<n>` (README
"Differences"), so the oracle is HF's rule on the numbered folders, and every other folder must survive untouched.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from transformers.trainer_utils import rotate_checkpoints, sort_checkpoints

from hf_lightning.checkpoint.write import list_checkpoints
from hf_lightning.checkpoint.rotate import final_cleanup, select_for_deletion

FOREIGN = ["checkpoint-best", "checkpoint-7x", "checkpoint-abc", "checkpoint-final", "checkpoint-5-backup"]


def make_folders(root: Path, names: list[str], mtimes: list[float]) -> None:
    root.mkdir(parents=True)
    for name, mtime in zip(names, mtimes):
        (root / name).mkdir()
        os.utime(root / name, (mtime, mtime))


def scenario(seed: int) -> tuple[list[str], list[float], str | None, int]:
    rng = random.Random(seed)
    steps = rng.sample(range(1, 60), rng.randrange(1, 8))
    names = [f"checkpoint-{s}" for s in steps]
    base = 1_700_000_000.0
    spread = rng.choice([0.0, 0.5, 30.0])  # within 1 s -> numeric fallback; over seconds -> mtime order
    mtimes = [base + rng.random() * spread for _ in names]
    if rng.random() < 0.3 and len(mtimes) > 1:
        mtimes[1] = mtimes[0]  # equal mtimes: ties broken by path
    best = rng.choice(names + [None]) if rng.random() < 0.7 else None
    return names, mtimes, best, rng.choice([1, 2, 3])


T0 = 1_700_000_000.0
EDGE_CASES = [
    # equal mtimes over a >1 s spread: HF breaks the tie by path ("checkpoint-10" < "checkpoint-9"), so 10 goes
    (["checkpoint-9", "checkpoint-10", "checkpoint-20"], [T0, T0, T0 + 5], None, 2),
    # a resumed run rewrote checkpoint-20 (newest mtime) while a stale checkpoint-40 of the first run exists
    (["checkpoint-10", "checkpoint-30", "checkpoint-40", "checkpoint-20"], [T0, T0 + 2, T0 + 3, T0 + 10], None, 2),
    # the best folder is old and must survive with the newest: limit 1 keeps two
    (["checkpoint-10", "checkpoint-20", "checkpoint-30"], [T0, T0 + 2, T0 + 4], "checkpoint-10", 1),
    # mtimes within 1 s: numeric order
    (["checkpoint-5", "checkpoint-10", "checkpoint-15"], [T0, T0 + 0.1, T0 + 0.2], None, 1),
]


@pytest.mark.parametrize("case", range(60 + len(EDGE_CASES)))
def test_rotation_deletes_what_hf_deletes(tmp_path, case):
    names, mtimes, best, limit = EDGE_CASES[case - 60] if case >= 60 else scenario(case)
    hf_root, our_root = tmp_path / "hf", tmp_path / "ours"
    make_folders(hf_root, names, mtimes)
    # an unfinished save and folders the run did not write, some older and some newer than the checkpoints
    extra = ["tmp-checkpoint-99-0a1b2c3d", *FOREIGN]
    make_folders(our_root, names + extra, mtimes + [mtimes[0] + 100 * (i % 2 * 2 - 1) for i in range(len(extra))])
    rotate_checkpoints(str(hf_root), limit, str(hf_root / best) if best else None, use_mtime=True)
    doomed = select_for_deletion(list_checkpoints(our_root), limit, str(our_root / best) if best else None)
    for path in doomed:
        shutil.rmtree(path)
    assert sorted(os.listdir(our_root)) == sorted(os.listdir(hf_root) + extra)


@pytest.mark.parametrize("seed", range(20))
def test_end_of_training_cleanup_matches_hf(tmp_path, seed):
    names, mtimes, best, _ = scenario(seed)
    best = best or names[0]
    make_folders(tmp_path / "hf", names, mtimes)
    # HF (T:2027-2036): numeric order, every folder but the best is deleted when save_total_limit == 1
    for checkpoint in sort_checkpoints(str(tmp_path / "hf"), best_model_checkpoint=str(tmp_path / "hf" / best)):
        if not os.path.samefile(checkpoint, tmp_path / "hf" / best):
            shutil.rmtree(checkpoint)
    make_folders(tmp_path / "ours", names + FOREIGN, mtimes + [mtimes[0]] * len(FOREIGN))
    for path in final_cleanup(list_checkpoints(tmp_path / "ours"), str(tmp_path / "ours" / best), 1):
        shutil.rmtree(path)
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "hf") + FOREIGN)
    assert final_cleanup(list_checkpoints(tmp_path / "ours"), str(tmp_path / "ours" / best), 2) == []
