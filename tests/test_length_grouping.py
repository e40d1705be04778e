"""`train_sampling_strategy="group_by_length"` and `length_column_name`, against HF's `LengthGroupedSampler`,
accelerate's sharding and `transformers.Trainer` (the oracles).

Each epoch's order is what `LengthGroupedSampler(batch * GA, lengths)` draws from torch's global generator at that
point of HF's run (a 3-epoch run with dropout trains on HF's batches with HF's losses and weights), and each process
gets the batches accelerate's `BatchSamplerShard` hands it; the length column is read before `remove_unused_columns`
drops it; a resumed run continues the grouped order exactly, and one resumed from HF's checkpoint trains as HF's
resumed run.
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
from helpers import VOCAB, tiny_gpt2
from torch.utils.data import BatchSampler, IterableDataset
from transformers import DataCollatorForSeq2Seq, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.trainer_pt_utils import LengthGroupedSampler

import hf_lightning
from hf_lightning.data.sampling import GroupingDraw, WindowBatchSampler

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


def varied_lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 40) for _ in range(n)]


def hf_fresh_order(lengths, group, seed) -> list[int]:
    """The first epoch of HF's fresh run: its sampler draws from torch's global generator, seeded with `seed` by
    `Trainer.__init__`, after the DataLoader iterator drew one int64 (its base seed)."""
    generator = torch.Generator().manual_seed(seed)
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    return list(LengthGroupedSampler(group, lengths=lengths, generator=generator))


@pytest.mark.parametrize("n, batch, accumulation", [(100, 4, 1), (203, 4, 2), (37, 8, 3), (5, 2, 1)])
def test_each_iteration_draws_as_hfs_length_grouped_sampler_from_the_global_generator(n, batch, accumulation):
    lengths = varied_lengths(n)
    sampler = WindowBatchSampler(n, batch, accumulation, seed=11, lengths=lengths)
    torch.manual_seed(11)
    ours = [[i for window in sampler for i in window] for _ in range(3)]
    ours_after = torch.get_rng_state()
    torch.manual_seed(11)
    hf = LengthGroupedSampler(batch * accumulation, lengths=lengths)  # no generator: the global one, as in Trainer
    assert ours == [list(hf) for _ in range(3)]
    assert torch.equal(ours_after, torch.get_rng_state())  # the generator moved on as HF's did
    # the longest sample comes first (an out-of-memory error happens at once), batches are grouped by length
    assert lengths[ours[0][0]] == max(lengths)


def test_a_restored_draw_gives_its_epochs_order_once():
    lengths = varied_lengths(40)
    sampler = WindowBatchSampler(40, 2, 2, seed=0, lengths=lengths)
    sampler.set_epoch(1)
    torch.manual_seed(3)
    first = list(sampler)
    draw = sampler.grouping_draw
    assert draw is not None and draw.epoch == 1
    for epoch, same in ((1, True), (2, False)):  # only for the epoch it was drawn in
        resumed = WindowBatchSampler(40, 2, 2, seed=0, lengths=lengths)
        resumed.set_epoch(epoch)
        resumed.restore_grouping_draw(draw)
        torch.manual_seed(99)
        assert (list(resumed) == first) is same
        assert list(resumed) != first  # used once: the next iteration draws again


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [50, 53])
def test_each_process_gets_accelerates_shard_of_the_grouped_order(n, drop_last):
    lengths, batch, world = varied_lengths(n, seed=1), 4, 2
    torch.manual_seed(5)
    order = list(LengthGroupedSampler(batch * 2, lengths=lengths))
    for rank in range(world):
        sampler = WindowBatchSampler(n, batch, 2, seed=5, drop_last=drop_last, world_size=world, rank=rank,
                                     lengths=lengths)
        torch.manual_seed(5)
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


def train(output_dir, data, resume=None, seed=0, lightning_kwargs=None, dropout=0.0, model=None, **overrides):
    settings = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2,
                    learning_rate=1e-2, logging_steps=1, save_steps=3, seed=7, report_to="none", disable_tqdm=True,
                    train_sampling_strategy="group_by_length")
    tok = tokenizer()
    trainer = RecordingTrainer(
        model=model if model is not None else tiny_gpt2(dropout=dropout, seed=seed),
        args=hf_lightning.TrainingArguments(output_dir=str(output_dir), **{**settings, **overrides}),
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


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with attention dropout (GPT-2 would do, but transformers 5.24 counts its labels' first
    position in `num_items_in_batch`: README "Differences"; Llama's count is right on both sides)."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.1, pad_token_id=0, bos_token_id=1,
        eos_token_id=2,
    ))


# 3 epochs of 6 updates; attention dropout and `include_num_input_tokens_seen` on; a checkpoint every 4 updates (8:
# inside the second epoch, 16: inside the third)
PARITY = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=3, learning_rate=1e-2,
              logging_steps=1, save_steps=4, seed=7, report_to="none", disable_tqdm=True,
              train_sampling_strategy="group_by_length", include_num_input_tokens_seen=True)


def hf_train(output_dir, resume=None):
    """`transformers.Trainer` on the run `train(..., model=tiny_llama(), **PARITY)` makes; returns it and its
    batches."""
    tok = tokenizer()
    _RecordingHF.seen = []
    hf = _RecordingHF(model=tiny_llama(),
                      args=transformers.TrainingArguments(output_dir=str(output_dir), use_cpu=True, **PARITY),
                      train_dataset=token_rows(), data_collator=DataCollatorForSeq2Seq(tok, padding=True),
                      processing_class=tok)
    hf.train(resume_from_checkpoint=resume)
    return hf, list(_RecordingHF.seen)


def losses(trainer) -> list[tuple[int, float, float]]:
    return [(e["step"], e["loss"], e["grad_norm"]) for e in trainer.state.log_history if "loss" in e]


def assert_same_run(ours, hf, exact: bool = False) -> None:
    """The same logged losses and grad norms, `num_input_tokens_seen` and final weights; against HF within the
    parity tests' float tolerance (the sums of a window's gradients are not taken in HF's order, test_train_parity),
    `exact` between two runs of ours."""
    got, want = losses(ours), losses(hf)
    assert [step for step, *_ in got] == [step for step, *_ in want] and len(want) == 18
    if exact:
        assert got == want
    for (step, loss, norm), (_, hf_loss, hf_norm) in zip(got, want):
        assert (loss, norm) == (pytest.approx(hf_loss, rel=1e-5), pytest.approx(hf_norm, rel=1e-5)), step
    atol = 0 if exact else 2e-5
    assert ours.state.num_input_tokens_seen == hf.state.num_input_tokens_seen
    for name, tensor in hf.model.state_dict().items():
        torch.testing.assert_close(ours.model.state_dict()[name], tensor, rtol=0, atol=atol, msg=name)


def test_every_epoch_trains_in_hfs_order_with_hfs_losses(tmp_path, one_thread):
    """Issue 22 item 13: a fresh 3-epoch `group_by_length` run with dropout sees HF's micro-batches in HF's order in
    every epoch (HF draws each epoch's permutation from the global generator, after the epoch before drew its
    dropout), with HF's losses, weights and `num_input_tokens_seen`."""
    hf, hf_seen = hf_train(tmp_path / "hf")
    ours, seen = train(tmp_path / "ours", token_rows(), model=tiny_llama(), **PARITY)
    assert len(seen) == 36 and seen == hf_seen
    assert sorted(sum(seen[12:24], [])) == list(range(24))  # an epoch is every row once
    assert seen[12:24] != seen[:12]  # each epoch is drawn anew
    assert_same_run(ours, hf)


def test_resumed_from_hfs_checkpoint_trains_as_hfs_resumed_run(tmp_path, one_thread):
    """HF resumes inside an epoch by drawing that epoch's order anew from the generator as it is then (another order
    than its uninterrupted run's); from HF's checkpoint, which has no saved draw, hf_lightning does the same."""
    hf, hf_seen = hf_train(tmp_path / "hf")
    checkpoint = str(tmp_path / "hf" / "checkpoint-8")
    hf_resumed, hf_resumed_seen = hf_train(tmp_path / "hf_resumed", resume=checkpoint)
    assert hf_resumed_seen != hf_seen[16:]  # HF's resumed run is not its uninterrupted one
    ours, seen = train(tmp_path / "ours", token_rows(), resume=checkpoint, model=tiny_llama(), **PARITY)
    assert seen == hf_resumed_seen and len(seen) == 20
    assert_same_run(ours, hf_resumed)


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
    assert seen[0] == hf_fresh_order(claimed, 4, 7)[:2]
    measured, _ = train(tmp_path / "measured", token_rows().remove_columns("length"), max_steps=1)
    assert measured.datamodule.train_lengths == token_rows()["length"]


def test_grouped_batches_are_less_padded_than_random_ones(tmp_path, one_thread):
    _, grouped_seen = train(tmp_path / "g", token_rows(n=48))
    lengths = token_rows(n=48)["length"]

    def padding(batches):
        return sum(max(lengths[r] for r in b) * len(b) - sum(lengths[r] for r in b) for b in batches)

    _, random_seen = train(tmp_path / "r", token_rows(n=48), train_sampling_strategy="random")
    assert padding(grouped_seen) < padding(random_seen) / 2


@pytest.mark.parametrize("step", [8, 16])  # inside the second epoch, inside the third
def test_resume_continues_every_epochs_grouped_order_exactly(tmp_path, step, one_thread):
    """A run resumed inside an epoch continues that epoch's order (the checkpoint keeps the generator state it was
    drawn from) and draws the next ones as the uninterrupted run: the same batches, losses and weights."""
    full, full_seen = train(tmp_path / "full", token_rows(), model=tiny_llama(), **PARITY)
    source = tmp_path / "src" / f"checkpoint-{step}"
    shutil.copytree(tmp_path / "full" / f"checkpoint-{step}", source)
    resumed, resumed_seen = train(tmp_path / "resumed", token_rows(), resume=str(source), model=tiny_llama(seed=99),
                                  **PARITY)
    assert resumed_seen == full_seen[2 * step:]
    assert_same_run(resumed, full, exact=True)


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
    """2 gloo processes: each trains on accelerate's shard of one grouped order per epoch, rank 0's draw (with
    dropout the processes' generators could differ after the first epoch; their shards would then overlap)."""
    script = Path(__file__).parent / "scripts" / "ddp_grouped_order.py"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, cwd=tmp_path, capture_output=True,
                   timeout=600)
    lengths = token_rows(n=30)["length"]
    draws = [torch.load(tmp_path / f"draws{rank}.pt") for rank in range(2)]
    assert len(draws[0]) == 2 and all(torch.equal(a, b) for a, b in zip(*draws))
    fresh = torch.Generator().manual_seed(7)
    torch.empty((), dtype=torch.int64).random_(generator=fresh)  # HF's fresh run: the loader's base seed first
    assert torch.equal(draws[0][0], fresh.get_state())
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        expected = []
        for epoch, state in enumerate(draws[0]):
            sampler = WindowBatchSampler(30, 2, 2, seed=7, world_size=2, rank=rank, lengths=lengths)
            sampler.grouping_draw = GroupingDraw(epoch, state, 30, 4)
            expected += sampler.microbatches(epoch)
        assert seen == expected
