"""Data loading: the window sampler against accelerate and the real HF Trainer, O(1) skipping, column removal,
the default collator, iterable datasets and `dataloader_drop_last`."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import transformers
from accelerate.data_loader import BatchSamplerShard
from datasets import Dataset
from torch import nn
from torch.utils.data import BatchSampler
from torch.utils.data import Dataset as TorchDataset

import hf_lightning
from hf_lightning import TrainingArguments, TransformerDataModule
from hf_lightning.data.collate import default_collator
from hf_lightning.data.sampling import WindowBatchSampler, epoch_order, shard_batches
from helpers import VOCAB, RecordingDataset, classification_dataset, tiny_bert

LIGHTNING_KWARGS = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False}


class TinyClassifier(nn.Module):
    """A plain module with an explicit signature: an unexpected input key makes `forward` raise a TypeError."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.emb(input_ids).mean(dim=1))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def our_trainer(model, dataset, tmp_path, **kwargs) -> hf_lightning.Trainer:
    kwargs.setdefault("save_strategy", "no")
    collate_kwargs = {k: kwargs.pop(k) for k in ("processing_class", "data_collator") if k in kwargs}
    args = TrainingArguments(output_dir=str(tmp_path / "ours"), **kwargs)
    return hf_lightning.Trainer(
        model=model, args=args, train_dataset=dataset, lightning_kwargs=dict(LIGHTNING_KWARGS), **collate_kwargs
    )


# ----- the window sampler -----
def test_shard_batches_equals_accelerate_batch_sampler_shard():
    for n, batch_size, world, drop_last in itertools.product(range(0, 27), (1, 2, 3, 4), (2, 3, 4), (False, True)):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(n)).tolist()
        for rank in range(world):
            expected = list(
                BatchSamplerShard(
                    BatchSampler(order, batch_size, drop_last), num_processes=world, process_index=rank,
                    split_batches=False, even_batches=True,
                )
            )
            assert shard_batches(order, batch_size, world, rank, drop_last) == expected, (n, batch_size, world, rank)
        # one process: accelerate does not shard at all, the plain batches come through (no padding of the tail)
        assert shard_batches(order, batch_size, 1, 0, drop_last) == list(BatchSampler(order, batch_size, drop_last))


def test_every_rank_gets_the_same_number_of_batches_and_len_is_exact():
    for n, world, ga in itertools.product((5, 16, 23), (1, 2, 3), (1, 3)):
        samplers = [WindowBatchSampler(n, 2, ga, seed=1, world_size=world, rank=r) for r in range(world)]
        lengths = {len(list(s)) for s in samplers}
        assert lengths == {len(samplers[0])}, (n, world, ga)
        assert samplers[0].num_microbatches() == len(samplers[0].microbatches())


def test_epoch_order_is_randperm_with_seed_plus_epoch():
    sampler = WindowBatchSampler(num_samples=23, batch_size=4, accumulation=2, seed=17)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        flat = [i for window in sampler for i in window]
        assert flat == torch.randperm(23, generator=torch.Generator().manual_seed(17 + epoch)).tolist()
        assert flat == epoch_order(23, 17, epoch, shuffle=True)
    assert epoch_order(5, 17, 3, shuffle=False) == [0, 1, 2, 3, 4]
    sampler = WindowBatchSampler(num_samples=10, batch_size=4, accumulation=2, seed=0, shuffle=False)
    assert list(sampler) == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9]]  # windows of GA micro-batches, the last one short


@pytest.mark.parametrize("seed, data_seed", [(42, None), (3, 11)])
def test_epoch_order_equals_the_real_hf_trainer(seed, data_seed, tmp_path):
    n, batch_size = 23, 4
    dataset = Dataset.from_dict({"idx": list(range(n))})
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=batch_size, seed=seed, data_seed=data_seed,
        remove_unused_columns=False, use_cpu=True, report_to="none",
    )
    hf = transformers.Trainer(
        model=TinyClassifier(), args=args, train_dataset=dataset,
        data_collator=lambda rows: {"idx": torch.tensor([r["idx"] for r in rows])},
    )
    loader = hf.get_train_dataloader()
    ours = WindowBatchSampler(n, batch_size, accumulation=2, seed=data_seed if data_seed is not None else seed)
    for epoch in range(3):
        loader.set_epoch(epoch)  # what HF's training loop does every epoch
        hf_order = [i for batch in loader for i in batch["idx"].tolist()]
        ours.set_epoch(epoch)
        assert [i for window in ours for i in window] == hf_order, epoch


def test_set_epoch_reaches_the_sampler_in_a_lightning_fit(tmp_path):
    """Lightning calls `set_epoch` on `loader.sampler` / `loader.batch_sampler.sampler` only: every epoch of a real
    fit must draw its own permutation (regression: every epoch repeated epoch 0)."""
    data = RecordingDataset(classification_dataset(n=12))
    trainer = our_trainer(tiny_bert(), data, tmp_path, per_device_train_batch_size=4, num_train_epochs=3, seed=5)
    trainer.train()
    expected = [torch.randperm(12, generator=torch.Generator().manual_seed(5 + e)).tolist() for e in range(3)]
    assert data.seen == expected[0] + expected[1] + expected[2]


def test_skipping_windows_yields_the_tail_without_reading_skipped_items():
    args = TrainingArguments(per_device_train_batch_size=2, gradient_accumulation_steps=3, seed=5)
    data = RecordingDataset(classification_dataset(n=40))  # 20 micro-batches of 2 -> 7 windows of 3,3,3,3,3,3,2 micro-batches
    dm = TransformerDataModule(train_dataset=data, args=args)
    windows = dm.train_dataloader()
    assert len(windows) == 7
    windows.set_epoch(2)
    sampler = dm.get_train_dataloader().batch_sampler
    sampler.set_epoch(2)
    full = list(sampler)  # the epoch's micro-batches
    data.seen.clear()
    windows.skip = 5
    materialised = [window.materialize() for window in windows]
    # only the samples of windows 5 and 6 were read, in order: nothing of the skipped windows was touched
    assert data.seen == [i for micro in full[15:] for i in micro]
    assert [len(w) for w in materialised] == [3, 2]  # micro-batches per window (the last window of the epoch is short)
    assert all(micro["input_ids"].shape[0] == 2 for w in materialised for micro in w)
    # the skip applies to one iteration only
    data.seen.clear()
    assert len([w.materialize() for w in windows]) == 7 and len(data.seen) == 40


def test_skipping_is_constant_time_in_the_skipped_windows():
    sampler = WindowBatchSampler(num_samples=50_000, batch_size=1, accumulation=1, seed=0, shuffle=False)
    sampler.skip_windows = 49_998
    assert list(sampler) == [[49_998], [49_999]]


# ----- columns -----
def test_remove_unused_columns_drops_extra_columns_like_hf(tmp_path):
    data = classification_dataset(n=8).add_column("idx", list(range(8))).add_column("text", ["x"] * 8)
    model = TinyClassifier()
    trainer = our_trainer(model, data, tmp_path, per_device_train_batch_size=4, max_steps=2)
    trainer.train()  # `idx` would reach forward() and raise a TypeError if it were not removed
    assert trainer.state.global_step == 2
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none")
    hf = transformers.Trainer(model=model, args=hf_args, train_dataset=data)
    hf_columns = hf.get_train_dataloader().dataset.column_names
    assert trainer.get_train_dataloader().dataset.column_names == hf_columns == ["input_ids", "attention_mask", "label"]
    assert trainer.train_dataset is data and hf.train_dataset is data  # the dataset itself stays as given


def test_remove_unused_columns_false_keeps_columns(tmp_path):
    data = classification_dataset(n=8).add_column("idx", list(range(8)))
    trainer = our_trainer(TinyClassifier(), data, tmp_path, max_steps=1, remove_unused_columns=False)
    with pytest.raises(TypeError, match="idx"):
        trainer.train()


def test_remove_unused_columns_filters_torch_dataset_items(tmp_path):
    class ExtraKeys(TorchDataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {**classification_dataset(n=8)[i], "idx": i}

    trainer = our_trainer(TinyClassifier(), ExtraKeys(), tmp_path, per_device_train_batch_size=4, max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2


def test_no_matching_column_raises_listing_the_columns(tmp_path):
    data = Dataset.from_dict({"text": ["a b", "c d"], "score": [1, 0]})
    trainer = our_trainer(TinyClassifier(), data, tmp_path, max_steps=1)
    with pytest.raises(ValueError) as info:
        trainer.train()
    message = str(info.value)
    assert "No columns in the training dataset match the model's forward method signature" in message
    for name in ("text", "score", "input_ids", "remove_unused_columns=False"):
        assert name in message


# ----- collators -----
def word_level_tokenizer() -> transformers.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]")


def test_default_collator_pads_with_the_tokenizer_like_hf(tmp_path):
    tokenizer = word_level_tokenizer()
    texts = [" ".join(f"w{(i * 7 + j) % 60 + 2}" for j in range(3 + i % 5)) for i in range(12)]
    data = Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(12)]})
    data = data.map(lambda row: tokenizer(row["text"]), remove_columns=["text"])
    assert len({len(ids) for ids in data["input_ids"]}) > 1  # variable lengths: only a padding collator works

    assert isinstance(default_collator(tokenizer), transformers.DataCollatorWithPadding)
    assert default_collator(None) is transformers.default_data_collator
    hf = transformers.Trainer(
        model=tiny_bert(), processing_class=tokenizer,
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none"),
    )
    trainer = our_trainer(
        tiny_bert(), data, tmp_path, per_device_train_batch_size=4, max_steps=3, processing_class=tokenizer
    )
    assert type(trainer.datamodule.data_collator) is type(hf.data_collator) is transformers.DataCollatorWithPadding
    assert trainer.datamodule.data_collator.tokenizer is tokenizer
    trainer.train()
    assert trainer.state.global_step == 3


# ----- iterable datasets -----
def test_iterable_dataset_trains_for_max_steps_like_hf(tmp_path):
    """5 micro-batches per pass, max_steps=12: the shuffled iterable is re-read 3 times, reshuffled every pass
    (`set_epoch`); logged epochs (passes + fraction of `max_steps * GA`) and losses equal HF's."""
    model, rows = tiny_bert(), classification_dataset(n=20)

    def stream():
        return rows.to_iterable_dataset(num_shards=4).shuffle(seed=5, buffer_size=8)

    common = dict(
        per_device_train_batch_size=4, max_steps=12, logging_steps=1, learning_rate=1e-3, seed=0,
        optim="adamw_torch", save_strategy="no",
    )
    hf_args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, report_to="none", **common)
    hf = transformers.Trainer(model=copy.deepcopy(model), args=hf_args, train_dataset=stream())
    hf.train()
    ours = hf_lightning.Trainer(
        model=copy.deepcopy(model), args=TrainingArguments(output_dir=str(tmp_path / "ours"), **common),
        train_dataset=stream(), lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    ours.train()
    hf_logs = [e for e in hf.state.log_history if "loss" in e]
    our_logs = [e for e in ours.state.log_history if "loss" in e]
    assert ours.state.global_step == hf.state.global_step == 12
    assert [e["epoch"] for e in our_logs] == pytest.approx([e["epoch"] for e in hf_logs])
    assert [e["loss"] for e in our_logs] == pytest.approx([e["loss"] for e in hf_logs], rel=1e-5)
    assert [e["epoch"] for e in our_logs][4:6] == pytest.approx([5 / 12, 1 + 1 / 12])


def test_iterable_dataset_short_last_window_of_a_pass_makes_its_own_update(tmp_path):
    """Documents a difference: with GA=2 and 5 micro-batches per pass, our windows per pass are 2,2,1 (a window
    never crosses an epoch boundary, as for sized data). HF never steps on the lone 5th micro-batch: its gradient
    stays accumulated and joins the first update of the next pass (3 micro-batches, logged with it)."""
    from lightning.pytorch.callbacks import Callback

    class WindowSizes(Callback):
        def __init__(self) -> None:
            self.sizes: list[int] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.sizes.append(len(batch))

    recorder = WindowSizes()
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=5,
        logging_steps=1, save_strategy="no",
    )
    trainer = hf_lightning.Trainer(
        model=tiny_bert(), args=args, train_dataset=classification_dataset(n=20).to_iterable_dataset(),
        callbacks=[recorder], lightning_kwargs=dict(LIGHTNING_KWARGS),
    )
    trainer.train()
    assert recorder.sizes == [2, 2, 1, 2, 2]
    epochs = [e["epoch"] for e in trainer.state.log_history if "loss" in e]
    assert epochs == pytest.approx([2 / 10, 4 / 10, 5 / 10, 1 + 2 / 10, 1 + 4 / 10])


def test_iterable_dataset_without_max_steps_raises_hfs_error(tmp_path):
    data = classification_dataset(n=8).to_iterable_dataset()
    with pytest.raises(ValueError, match="max_steps has to be specified"):
        transformers.Trainer(
            model=tiny_bert(), train_dataset=data,
            args=transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none"),
        )
    with pytest.raises(ValueError, match="does not implement __len__.*max_steps has to be specified"):
        our_trainer(tiny_bert(), data, tmp_path)

    # the Lightning-native path (no facade) reports it when fitting
    import lightning.pytorch as pl

    from hf_lightning import HFTrainerFlow, TransformerModule

    args = TrainingArguments(output_dir=str(tmp_path / "native"), save_strategy="no")
    trainer = pl.Trainer(
        callbacks=[HFTrainerFlow(args)], max_epochs=-1, enable_checkpointing=False, default_root_dir=str(tmp_path),
        **LIGHTNING_KWARGS,
    )
    with pytest.raises(ValueError, match="max_steps"):
        trainer.fit(
            TransformerModule(tiny_bert(), args), datamodule=TransformerDataModule(train_dataset=data, args=args)
        )


# ----- dataloader_drop_last -----
def test_drop_last_micro_batch_counts_equal_hf(tmp_path):
    for n, batch_size, drop_last in itertools.product((7, 8, 10, 13), (2, 4), (False, True)):
        hf_args = transformers.TrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=batch_size, dataloader_drop_last=drop_last,
            use_cpu=True, report_to="none",
        )
        data = classification_dataset(n=n)
        hf_len = len(transformers.Trainer(model=tiny_bert(), args=hf_args, train_dataset=data).get_train_dataloader())
        our_args = TrainingArguments(per_device_train_batch_size=batch_size, dataloader_drop_last=drop_last)
        ours = TransformerDataModule(train_dataset=data, args=our_args)
        assert ours.num_train_microbatches() == hf_len, (n, batch_size, drop_last)


def test_drop_last_training_never_sees_the_dropped_samples_and_matches_hf_order(tmp_path):
    common = dict(per_device_train_batch_size=4, num_train_epochs=2, dataloader_drop_last=True, seed=1)
    hf_data, our_data = RecordingDataset(classification_dataset(n=10)), RecordingDataset(classification_dataset(n=10))
    hf_args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), use_cpu=True, report_to="none", save_strategy="no", **common
    )
    hf = transformers.Trainer(model=tiny_bert(), args=hf_args, train_dataset=hf_data)
    hf.train()
    ours = our_trainer(tiny_bert(), our_data, tmp_path, **common)
    ours.train()
    assert ours.state.global_step == hf.state.global_step == 4  # 2 full batches per epoch, the 2 leftovers dropped
    assert len(our_data.seen) == 16
    assert our_data.seen == hf_data.seen


def test_eval_shards_cover_the_dataset_once_and_are_never_empty():
    """Contiguous eval shards: every row once, in order; cut at batch boundaries when every process gets a batch,
    per sample otherwise (Lightning refuses an empty loader on one process); with fewer rows than processes, a
    process left without a row reads one padding row, marked `padding_only` (its outputs are dropped)."""
    from torch.utils.data import DataLoader

    from hf_lightning.data.datamodule import ContiguousShardSampler
    from hf_lightning.module.eval_run import busiest_rank_batches

    for n in range(1, 41):
        for world in (1, 2, 3):
            for batch_size in (1, 3, 8):
                samplers = [ContiguousShardSampler(n, world, rank, batch_size) for rank in range(world)]
                shards = [list(sampler) for sampler in samplers]
                real = [shard for shard, sampler in zip(shards, samplers) if not sampler.padding_only]
                assert [i for shard in real for i in shard] == list(range(n))
                assert all(shards), (n, world, batch_size, shards)
                assert [s.padding_only for s in samplers] == [rank >= n for rank in range(world)]
                assert all(shard == [0] for shard, s in zip(shards, samplers) if s.padding_only)
                if -(-n // batch_size) >= world:
                    assert all(shard[0] % batch_size == 0 for shard in shards)
                # what every rank computes alone: the busiest rank's batch count, the one Lightning's loaders give
                loaders = [DataLoader(range(n), batch_size=batch_size, sampler=s) for s in samplers]
                assert busiest_rank_batches(loaders[-1]) == max(len(loader) for loader in loaders)
                drop = [DataLoader(range(n), batch_size=batch_size, sampler=s, drop_last=True) for s in samplers]
                assert busiest_rank_batches(drop[0]) == max(len(loader) for loader in drop)
    assert busiest_rank_batches(DataLoader(range(5), batch_size=2)) is None  # not our sharding: nothing to even out


def test_split_by_node_shards_a_datasets_stream_and_refuses_a_torch_one():
    """Under DDP an iterable train set is split by node: a `datasets` stream is, a torch one is refused by name."""
    import datasets
    import torch

    from hf_lightning.data.sampling import split_by_node

    stream = datasets.Dataset.from_dict({"x": list(range(8))}).to_iterable_dataset(num_shards=2)
    parts = [[row["x"] for row in split_by_node(stream, world=2, rank=rank)] for rank in (0, 1)]
    assert sorted(parts[0] + parts[1]) == list(range(8)) and parts[0] and parts[1]

    class Plain(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueError, match="torch IterableDataset cannot be sharded"):
        split_by_node(Plain(), world=2, rank=0)


# ----- a label column remove_unused_columns would drop -----
def test_a_label_column_with_another_name_is_one_error_before_training(tmp_path):
    """`label_id` is not a forward argument, so `remove_unused_columns` drops it and HF fails at the first update
    ("The model did not return a loss ... inputs input_ids,attention_mask", a 93-line traceback). Ours names the
    dropped columns and the model's arguments when `train()` starts, before Lightning builds anything."""
    data = classification_dataset(16).rename_column("label", "label_id")
    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = hf_lightning.Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), max_steps=2,
                                                                      report_to="none"),
                                   train_dataset=data, lightning_kwargs=LIGHTNING_KWARGS)
    with pytest.raises(ValueError) as info:
        trainer.train()
    message = str(info.value)
    assert "remove_unused_columns drops ['label_id']" in message
    assert "its arguments: ['input_ids', 'attention_mask', 'token_type_ids'" in message
    assert "dataset.rename_column('label_id', 'labels')" in message
    assert trainer.lightning_trainer is None and not any(tmp_path.iterdir())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_dropped_label_column_is_refused_by_the_lightning_pieces_too(tmp_path):
    import lightning.pytorch as pl

    from hf_lightning import HFTrainerFlow, TransformerModule

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, report_to="none")
    data = TransformerDataModule(train_dataset=classification_dataset(16).rename_column("label", "label_id"),
                                 args=args)
    trainer = pl.Trainer(callbacks=[HFTrainerFlow(args)], max_epochs=-1, num_sanity_val_steps=0, logger=False,
                         use_distributed_sampler=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match=r"remove_unused_columns drops \['label_id'\]"):
        trainer.fit(TransformerModule(tiny_bert(), args), datamodule=data)
    assert trainer.global_step == 0


def test_missing_labels_is_only_judged_where_nothing_else_can_make_labels():
    from transformers import default_data_collator

    from hf_lightning.data.collate import missing_labels_problem

    allowed = ["input_ids", "attention_mask", "labels", "label", "label_ids"]
    assert missing_labels_problem(["input_ids", "label_id"], allowed, ["labels"], default_data_collator)
    assert missing_labels_problem(["input_ids", "label"], allowed, ["labels"], default_data_collator) is None
    assert missing_labels_problem(["input_ids"], allowed, ["labels"], default_data_collator) is None  # nothing dropped
    assert missing_labels_problem(["input_ids", "label_id"], allowed, [], default_data_collator) is None
    # another collator may build labels itself (DataCollatorForLanguageModeling from input_ids): not judged
    assert missing_labels_problem(["input_ids", "text"], allowed, ["labels"], lambda features: features) is None


def test_a_compute_loss_override_may_train_without_a_label_column(tmp_path):
    class NoLabels(hf_lightning.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs.pop("labels", None)
            out = model(**inputs)
            return out.logits.pow(2).mean()

    data = classification_dataset(16).rename_column("label", "label_id")
    trainer = NoLabels(model=tiny_bert(), args=TrainingArguments(output_dir=str(tmp_path), max_steps=1,
                                                                 report_to="none", save_strategy="no"),
                       train_dataset=data, lightning_kwargs=LIGHTNING_KWARGS)
    assert trainer.train().global_step == 1
