"""Resuming costs O(1) in the number of trained batches: the sampler starts at the window (no skipped sample is
loaded, no skipped batch is iterated), so the time from `fit` start to the first resumed update does not grow with
the step resumed from."""

from __future__ import annotations

import json
import shutil
import time

import lightning.pytorch as pl
from torch.utils.data import Dataset

import hf_lightning
from helpers import lm_dataset, tiny_gpt2


class CountingDataset(Dataset):
    """Counts `__getitem__` calls: every loaded sample, skipped or not, would show here."""

    def __init__(self, rows) -> None:
        self.rows = rows
        self.loads = 0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        self.loads += 1
        return self.rows[int(index)]


class StartupTimer(pl.Callback):
    """From `setup` (before the restore in `HFTrainerFlow.on_fit_start`) to the first resumed update."""

    def setup(self, trainer, pl_module, stage) -> None:
        self.start = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not hasattr(self, "elapsed"):
            self.elapsed = time.perf_counter() - self.start
            self.first_batch_idx = batch_idx


def trainer_for(output_dir, dataset, max_steps, timer=None):
    args = hf_lightning.TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=max_steps,
        save_steps=1, logging_steps=1, report_to="none", disable_tqdm=True,
    )
    return hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=dataset, callbacks=[timer] if timer else [],
                                lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False})


def test_resume_start_up_does_not_grow_with_the_resumed_step(tmp_path, one_thread):
    rows = lm_dataset(n=8_000, max_length=8)  # 2,000 updates per epoch
    trainer_for(tmp_path / "seed", CountingDataset(rows), max_steps=1).train()
    measured = {}
    for step in (2, 1_900):
        # the same checkpoint, relabelled as taken at `step` (only the position matters for start-up)
        folder = tmp_path / f"at{step}" / f"checkpoint-{step}"
        shutil.copytree(tmp_path / "seed" / "checkpoint-1", folder)
        state = json.loads((folder / "trainer_state.json").read_text())
        state["global_step"] = step
        (folder / "trainer_state.json").write_text(json.dumps(state))
        (folder / "lightning_state.pt").unlink()  # HF's rule then places it: epoch 0, window `step`
        (folder / "checkpoint_manifest.json").unlink()  # the edited folder no longer matches it: loads as HF's do
        data, timer = CountingDataset(rows), StartupTimer()
        trainer_for(tmp_path / f"run{step}", data, max_steps=step + 1, timer=timer).train(
            resume_from_checkpoint=str(folder))
        assert timer.first_batch_idx == step  # the loop continues at the window after the checkpoint
        # one window of 2 x 2 samples, and the next micro-batch of 2 (fetched one ahead, as HF's loader does):
        # nothing before it was loaded
        assert data.loads == 4 + 2
        measured[step] = timer.elapsed
    print(f"resume start-up: from step 2 {measured[2]:.3f}s, from step 1900 {measured[1_900]:.3f}s")
    assert measured[1_900] < 3 * measured[2] + 0.5
