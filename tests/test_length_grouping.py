"""`train_sampling_strategy="group_by_length"` and `length_column_name`, against HF's `LengthGroupedSampler` and
accelerate's sharding (the oracles).

For the same seed, each epoch's order is `LengthGroupedSampler(batch * GA, lengths, generator=...)`'s (epoch 0: HF's fresh run), and
each process gets the batches accelerate's `BatchSamplerShard` hands it; the length column is read before
`remove_unused_columns` drops it; a resumed run continues the grouped order exactly.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from accelerate.data_loader import BatchSamplerShard
from datasets import Dataset
from torch.utils.data import BatchSampler, IterableDataset
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast
from transformers.trainer_pt_utils import LengthGroupedSampler

import hf_lightning
from hf_lightning.data.sampling import WindowBatchSampler
from helpers import VOCAB, tiny_gpt2

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


def varied_lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 40) for _ in range(n)]


def hf_order(lengths, group, seed, epoch) -> list[int]:
    """HF's sampler over our generator: epoch 0 is HF's fresh run (torch's generator seeded with `seed`, then one
    int64 drawn by the DataLoader iterator: see `test_a_fresh_run_trains_in_hfs_order`), later epochs `seed + epoch`."""
    generator = torch.Generator().manual_seed(seed + epoch)
    if epoch == 0:
        torch.empty((), dtype=torch.int64).random_(generator=generator)
    return list(LengthGroupedSampler(group, lengths=lengths, generator=generator))


@pytest.mark.parametrize("n, batch, accumulation", [(100, 4, 1), (203, 4, 2), (37, 8, 3), (5, 2, 1)])
@pytest.mark.parametrize("epoch", [0, 3])
def test_order_is_hfs_length_grouped_sampler_for_the_seed(n, batch, accumulation, epoch):
    lengths = varied_lengths(n)
    sampler = WindowBatchSampler(n, batch, accumulation, seed=11, lengths=lengths)
    sampler.set_epoch(epoch)
    ours = [i for window in sampler for i in window]
    assert ours == hf_order(lengths, batch * accumulation, 11, epoch)
    # the longest sample comes first (an out-of-memory error happens at once), batches are grouped by length
    assert lengths[ours[0]] == max(lengths)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [50, 53])
def test_each_process_gets_accelerates_shard_of_the_grouped_order(n, drop_last):
    lengths, batch, world = varied_lengths(n, seed=1), 4, 2
    order = hf_order(lengths, batch * 2, 5, 1)
    for rank in range(world):
        sampler = WindowBatchSampler(n, batch, 2, seed=5, drop_last=drop_last, world_size=world, rank=rank,
                                     lengths=lengths)
        sampler.set_epoch(1)
        shard = BatchSamplerShard(BatchSampler(order, batch, drop_last), num_processes=world, process_index=rank)
        assert sampler.microbatches() == list(shard)


def token_rows(n: int = 24, seed: int = 0) -> Dataset:
    """Unpadded causal-LM rows of varying length (the collator pads), plus a `length` column."""
    rng = random.Random(seed)
    # the first token of row i is 3 + i: it names the row in what the model sees
    ids = [[3 + i] + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 30))] for i in range(n)]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids], "labels": ids,
                              "length": [len(r) for r in ids]})


def tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")),
                                   pad_token="t0")


class RecordingModule(hf_lightning.TransformerModule):
    """Records the rows of every micro-batch the model is trained on (their indices)."""

    seen: list[list[int]] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        RecordingModule.seen.append([int(x) - 3 for x in inputs["input_ids"][:, 0]])
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class RecordingTrainer(hf_lightning.Trainer):
    module_class = RecordingModule


def train(output_dir, data, resume=None, seed=0, lightning_kwargs=None, **overrides):
    settings = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2,
                    learning_rate=1e-2, logging_steps=1, save_steps=3, seed=7, report_to="none", disable_tqdm=True,
                    train_sampling_strategy="group_by_length")
    tok = tokenizer()
    trainer = RecordingTrainer(
        model=tiny_gpt2(seed=seed), args=hf_lightning.TrainingArguments(output_dir=str(output_dir),
                                                                        **{**settings, **overrides}),
        train_dataset=data, data_collator=DataCollatorForSeq2Seq(tok, padding=True), processing_class=tok,
        lightning_kwargs={**LIGHTNING_KWARGS, **(lightning_kwargs or {})},
    )
    RecordingModule.seen = []
    trainer.train(resume_from_checkpoint=resume)
    return trainer, list(RecordingModule.seen)


class _RecordingHF(transformers.Trainer):
    """HF's Trainer recording the rows of every micro-batch it trains on (the oracle of the training order)."""

    seen: list[list[int]] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        _RecordingHF.seen.append([int(x) - 3 for x in inputs["input_ids"][:, 0]])
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def test_a_fresh_run_trains_in_hfs_order(tmp_path, one_thread):
    """Issue 22 item 13: a fresh `group_by_length` run sees HF's micro-batches in HF's order (the first epoch; HF's
    later epochs depend on its global generator's history) and counts the same `num_input_tokens_seen`."""
    settings = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=1,
                    learning_rate=1e-2, logging_steps=1, save_strategy="no", seed=7, report_to="none",
                    disable_tqdm=True, train_sampling_strategy="group_by_length", include_num_input_tokens_seen=True)
    tok = tokenizer()
    _RecordingHF.seen = []
    hf = _RecordingHF(model=tiny_gpt2(), args=transformers.TrainingArguments(output_dir=str(tmp_path / "hf"),
                                                                             use_cpu=True, **settings),
                      train_dataset=token_rows(), data_collator=DataCollatorForSeq2Seq(tok, padding=True),
                      processing_class=tok)
    hf.train()
    ours, seen = train(tmp_path / "ours", token_rows(), **{k: v for k, v in settings.items()
                                                           if k not in ("per_device_train_batch_size",)})
    assert seen == _RecordingHF.seen and len(seen) == 12
    assert ours.state.num_input_tokens_seen == hf.state.num_input_tokens_seen


def test_the_length_column_decides_even_when_remove_unused_columns_drops_it(tmp_path, one_thread):
    """HF drops the `length` column before building its sampler and measures `input_ids` instead (it ignores
    `length_column_name`): here a column claiming the reverse lengths wins, as HF documents the argument."""
    data = token_rows()
    claimed = [40 - n for n in data["length"]]
    data = data.remove_columns("length").add_column("length", claimed)
    trainer, seen = train(tmp_path / "out", data, max_steps=1)
    assert trainer.datamodule.train_lengths == claimed
    # the loader drops it afterwards, as HF's does; the dataset itself stays as given (HF's `train_dataset` too)
    assert "length" not in trainer.get_train_dataloader().dataset.column_names
    assert "length" in trainer.train_dataset.column_names
    assert seen[0] == hf_order(claimed, 4, 7, 0)[:2]
    measured, _ = train(tmp_path / "measured", token_rows().remove_columns("length"), max_steps=1)
    assert measured.datamodule.train_lengths == token_rows()["length"]


def test_grouped_batches_are_less_padded_than_random_ones(tmp_path, one_thread):
    _, grouped_seen = train(tmp_path / "g", token_rows(n=48))
    lengths = token_rows(n=48)["length"]

    def padding(batches):
        return sum(max(lengths[r] for r in b) * len(b) - sum(lengths[r] for r in b) for b in batches)

    _, random_seen = train(tmp_path / "r", token_rows(n=48), train_sampling_strategy="random")
    assert padding(grouped_seen) < padding(random_seen) / 2


@pytest.mark.parametrize("step", [3, 9])  # mid-epoch (6 updates per epoch), mid-epoch of epoch 2
def test_resume_continues_the_grouped_order_exactly(tmp_path, step, one_thread):
    full, full_seen = train(tmp_path / "full", token_rows())
    source = tmp_path / "src" / f"checkpoint-{step}"
    shutil.copytree(tmp_path / "full" / f"checkpoint-{step}", source)
    resumed, resumed_seen = train(tmp_path / "resumed", token_rows(), resume=str(source), seed=99)
    assert resumed_seen == full_seen[2 * step:]
    keep = ("loss", "grad_norm", "learning_rate", "epoch", "step")
    assert [{k: e[k] for k in keep if k in e} for e in resumed.state.log_history if e["step"] > step][:-1] == \
        [{k: e[k] for k in keep if k in e} for e in full.state.log_history if e["step"] > step][:-1]


def test_without_lengths_it_is_one_clear_error(tmp_path):
    data = Dataset.from_dict({"text_ids": [[1, 2], [3]], "labels": [[1, 2], [3]]})
    with pytest.raises(ValueError, match=r"no `length_column_name`='length' column and no 'input_ids' input"):
        hf_lightning.Trainer(model=tiny_gpt2(), train_dataset=data, args=hf_lightning.TrainingArguments(
            output_dir=str(tmp_path), train_sampling_strategy="group_by_length", report_to="none"))

    class Stream(IterableDataset):
        def __iter__(self):
            yield {"input_ids": [1, 2]}

    with pytest.raises(ValueError, match="group_by_length' needs a map-style train dataset"):
        hf_lightning.Trainer(model=tiny_gpt2(), train_dataset=Stream(), args=hf_lightning.TrainingArguments(
            output_dir=str(tmp_path), train_sampling_strategy="group_by_length", max_steps=2, report_to="none"))
    with pytest.raises(ValueError, match="'batch_rebalance' is not supported"):
        hf_lightning.TrainingArguments(train_sampling_strategy="batch_rebalance")


def test_two_processes_train_on_their_shards_of_the_grouped_order(tmp_path):
    """2 gloo processes: each trains on accelerate's shard of HF's grouped order, epoch after epoch."""
    script = Path(__file__).parent / "scripts" / "ddp_grouped_order.py"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, cwd=tmp_path, capture_output=True,
                   timeout=600)
    lengths = token_rows(n=30)["length"]
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        expected = []
        for epoch in range(2):
            sampler = WindowBatchSampler(30, 2, 2, seed=7, world_size=2, rank=rank, lengths=lengths)
            sampler.set_epoch(epoch)
            expected += sampler.microbatches()
        assert seen == expected
