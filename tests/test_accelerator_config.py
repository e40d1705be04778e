"""`accelerator_config` loader and accumulation fields with accelerate's meaning (issue 31, item 1).

Oracles: accelerate's own `BatchSamplerShard` / `prepare_data_loader` (what HF's Trainer hands each process, built
here for any process index without starting processes), and `transformers.Trainer` on the same arguments.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import transformers
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader
from helpers import CPU_QUIET, lm_dataset, stable_log, tiny_gpt2
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

import hf_lightning
from hf_lightning.data.datamodule import TransformerDataModule
from hf_lightning.data.sampling import shard_batches, split_batch_size


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("even", [True, False])
def test_shards_are_accelerates(split, even):
    """Every rank's batches, for every size, batch, process count and drop_last, equal accelerate's shard."""
    for n, batch, world, drop_last in itertools.product(range(1, 15), (2, 4, 6), (2, 3), (False, True)):
        if split and batch % world:
            continue
        for rank in range(world):
            want = list(BatchSamplerShard(BatchSampler(SequentialSampler(range(n)), batch, drop_last), world, rank,
                                          split_batches=split, even_batches=even))
            per_process = split_batch_size(batch, world, "per_device_train_batch_size") if split else batch
            got = shard_batches(list(range(n)), per_process, world, rank, drop_last, even)
            assert got == want, (n, batch, world, drop_last, rank)


class _Rank(TransformerDataModule):
    """The data module as process `rank` of `world` sees it (the loaders only read `_world()`)."""

    def __init__(self, world: int, rank: int, **kwargs) -> None:
        self._as = (world, rank)
        super().__init__(**kwargs)

    def _world(self) -> tuple[int, int]:
        return self._as


def _ours(world, rank, data, **config):
    args = hf_lightning.TrainingArguments(output_dir="unused", per_device_train_batch_size=4,
                                          per_device_eval_batch_size=4, data_seed=5, report_to="none",
                                          accelerator_config=config)
    return _Rank(world, rank, train_dataset=data, eval_dataset=data, args=args)


def _accelerates(loader, world, rank, **config):
    prepared = prepare_data_loader(loader, num_processes=world, process_index=rank, put_on_device=False,
                                   use_seedable_sampler=True, data_seed=5, **config)
    prepared.set_epoch(0)
    return prepared


def test_split_batches_loaders_are_hfs_per_process():
    """`split_batches=True`: each process reads its part of every batch of `per_device_*_batch_size` in HF's seeded
    order, and the loaders report the batch of all processes as `total_batch_size`; a batch the processes do not
    divide is accelerate's error, naming the argument."""
    data = lm_dataset(n=10)
    for rank in (0, 1):
        ours = _ours(2, rank, data, split_batches=True)
        train, evaluation = ours.get_train_dataloader(), ours.get_eval_dataloader()
        want = _accelerates(DataLoader(range(10), batch_size=4, sampler=RandomSampler(range(10))), 2, rank,
                            split_batches=True)
        assert list(train.batch_sampler) == [batch.tolist() for batch in want]
        assert train.total_batch_size == evaluation.total_batch_size == want.total_batch_size == 4
        assert evaluation.batch_size == 2  # contiguous blocks of half batches: the same chunks as accelerate's
    with pytest.raises(ValueError) as theirs:
        prepare_data_loader(DataLoader(range(10), batch_size=3), num_processes=2, process_index=0,
                            split_batches=True)
    ours = _ours(2, 0, data, split_batches=True)
    ours.args.per_device_train_batch_size = 3
    with pytest.raises(ValueError) as info:
        ours.get_train_dataloader()
    assert str(theirs.value) in str(info.value) and "per_device_train_batch_size" in str(info.value)


def test_even_batches_false_leaves_the_tail_unpadded_and_refuses_uneven_training():
    """`even_batches=False`: the last batch is not completed with samples from the start (accelerate's shard); an
    epoch that would give one process fewer batches (whose all-reduce would then wait forever) is refused."""
    data = lm_dataset(n=14)  # 4 batches of 4, 4, 4, 2: even over 2 processes, the last one short
    for rank in (0, 1):
        got = list(_ours(2, rank, data, even_batches=False).get_train_dataloader().batch_sampler)
        want = _accelerates(DataLoader(range(14), batch_size=4, sampler=RandomSampler(range(14))), 2, rank,
                            even_batches=False)
        assert got == [batch.tolist() for batch in want]
    assert len(got[-1]) == 2  # rank 1's tail: 2 rows, not padded to 4
    with pytest.raises(ValueError, match=r"even_batches': False\}: the epoch's 3 training batches do not split"):
        _ours(2, 0, lm_dataset(n=10), even_batches=False).get_train_dataloader()


def _run(kind: str, tmp_path, model, memory: bool = False) -> tuple[list[dict], list[list[str]]]:
    """A short run on non-default `accelerator_config` settings and `eval_use_gather_object=True` (with `memory`:
    `skip_memory_metrics=False`, one update): its log entries, and the memory metric keys of `train()`, its summary
    entry, `evaluate()` and `predict()`."""
    config = {"split_batches": True, "even_batches": False, "non_blocking": True, "use_seedable_sampler": False,
              "gradient_accumulation_kwargs": {"sync_each_batch": True, "sync_with_dataloader": True}}
    args = dict(output_dir=str(tmp_path / kind), per_device_train_batch_size=4, gradient_accumulation_steps=3,
                max_steps=1 if memory else 2, logging_steps=1, save_strategy="no", seed=7, report_to="none",
                disable_tqdm=True, eval_strategy="steps", eval_steps=2, accelerator_config=config,
                skip_memory_metrics=not memory, eval_use_gather_object=True)
    data = {"model": copy.deepcopy(model), "train_dataset": lm_dataset(n=24), "eval_dataset": lm_dataset(n=6)}
    if kind == "hf":
        trainer = transformers.Trainer(**data, args=transformers.TrainingArguments(**args, use_cpu=True))
    else:
        trainer = hf_lightning.Trainer(**data, args=hf_lightning.TrainingArguments(**args), lightning_kwargs=CPU_QUIET)
    trained = trainer.train().metrics
    summary = trainer.state.log_history[-1]
    if not memory:
        return stable_log(trainer), []
    evaluated, predicted = trainer.evaluate(), trainer.predict(lm_dataset(n=4)).metrics
    assert isinstance(trained["train_mem_cpu_alloc_delta"], int) and trained["before_init_mem_cpu"] > 0
    return [], [sorted(k for k in d if "_mem_" in k) for d in (trained, summary, evaluated, predicted)]


def test_accelerator_settings_train_as_hf(tmp_path):
    """One process: HF's Trainer and ours on the same non-default `accelerator_config` settings (and
    `eval_use_gather_object=True`) log the same losses and metrics."""
    model = tiny_gpt2()
    model.loss_type = "ForCausalLM"  # HF counts the shifted labels then (test_train_parity.gpt2_hf_counts_correctly)
    (ours, _), (theirs, _) = _run("ours", tmp_path, model), _run("hf", tmp_path, model)
    assert [sorted(e) for e in ours] == [sorted(e) for e in theirs] and any("eval_loss" in e for e in ours)
    for a, b in zip(ours, theirs):
        assert a == pytest.approx(b, rel=1e-5)


def test_memory_metrics_are_hfs(tmp_path):
    """`skip_memory_metrics=False` adds HF's memory metric keys (its `TrainerMemoryTracker`, the init stage's in
    the first of them) to the train summary, `evaluate()` and `predict()` as HF's Trainer does."""
    model = tiny_gpt2()
    (_, ours), (_, theirs) = _run("ours", tmp_path, model, memory=True), _run("hf", tmp_path, model, memory=True)
    assert ours == theirs
    assert "init_mem_cpu_alloc_delta" in ours[0] and "test_mem_cpu_peaked_delta" in ours[3]


class _CountReductions(transformers.TrainerCallback):
    """Counts DDP's bucket all-reduces (a comm hook on the real `DistributedDataParallel` Lightning wrapped)."""

    def __init__(self) -> None:
        self.reductions = 0
        self.trainer = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.lightning_trainer.strategy.model.register_comm_hook(None, self._hook)

    def _hook(self, state, bucket):
        self.reductions += 1
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future


@pytest.mark.parametrize("sync_each_batch", [False, True])
def test_sync_each_batch_reduces_every_micro_batch_under_ddp(tmp_path, sync_each_batch):
    """DDP (one process, a real process group): 3 micro-batches per update reduce once per update, or on every
    micro-batch with `sync_each_batch=True` (HF's loop then enters no `no_sync`)."""
    counter = _CountReductions()
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=3, max_steps=2,
        save_strategy="no", report_to="none", disable_tqdm=True, ddp_find_unused_parameters=False,
        accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": sync_each_batch}})
    counter.trainer = hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=lm_dataset(n=12),
                                           callbacks=[counter],
                                           lightning_kwargs={**CPU_QUIET, "strategy": "ddp", "devices": 1})
    counter.trainer.train()
    per_update = 3 if sync_each_batch else 1
    buckets = counter.reductions // (2 * per_update)
    assert buckets >= 1 and counter.reductions == buckets * 2 * per_update


def test_gather_object_under_several_processes_is_refused_when_loaders_are_built():
    args = hf_lightning.TrainingArguments(output_dir="unused", eval_use_gather_object=True, report_to="none")
    with pytest.raises(ValueError, match="eval_use_gather_object=True under 2 processes"):
        _Rank(2, 0, train_dataset=lm_dataset(n=8), args=args).get_train_dataloader()
    assert len(_Rank(1, 0, train_dataset=lm_dataset(n=8), args=args).get_train_dataloader()) == 1


def test_dispatch_batches_reads_the_same_batches_in_one_process(tmp_path):
    """`dispatch_batches=True` (HF's accelerator-config tests set it): in one process rank 0 reads every batch either
    way, so the loader yields the default's batches and `accelerator.dispatch_batches` reports the value (several
    processes: tests/test_dispatch_batches.py)."""
    data = lm_dataset(n=10)
    dispatched = _ours(1, 0, data, dispatch_batches=True)
    batches = [batch["input_ids"].tolist() for batch in dispatched.get_train_dataloader()]
    assert batches == [batch["input_ids"].tolist() for batch in _ours(1, 0, data).get_train_dataloader()]
    assert len(batches) == 3
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), report_to="none",
                                          accelerator_config={"dispatch_batches": True})
    trainer = hf_lightning.Trainer(model=tiny_gpt2(), args=args, train_dataset=data)
    assert trainer.accelerator.dispatch_batches is True


def test_unseeded_sampler_trains_in_hfs_order(tmp_path, one_thread):
    """`use_seedable_sampler=False`: each epoch's order is torch's `RandomSampler`'s, drawn from the global generator
    when the epoch starts (after the epoch before drew its dropout), as HF's; the same batches and losses as HF."""
    from test_length_grouping import PARITY, _RecordingHF, tiny_llama, token_rows, tokenizer, train

    settings = {**PARITY, "train_sampling_strategy": "random", "num_train_epochs": 2, "save_steps": 100,
                "include_num_input_tokens_seen": False, "accelerator_config": {"use_seedable_sampler": False}}
    tok = tokenizer()
    _RecordingHF.seen = []
    hf = _RecordingHF(model=tiny_llama(), train_dataset=token_rows(), processing_class=tok,
                      data_collator=transformers.DataCollatorForSeq2Seq(tok, padding=True),
                      args=transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True, **settings))
    hf.train()
    ours, seen = train(tmp_path / "ours", token_rows(), model=tiny_llama(), **settings)
    assert len(seen) == 24 and seen == _RecordingHF.seen
    seeded = torch.randperm(24, generator=torch.Generator().manual_seed(7)).tolist()
    assert sum(seen[:12], []) != seeded and seen[12:] != seen[:12]  # not the seedable order; each epoch anew
    got, want = ([(e["step"], e["loss"]) for e in t.state.log_history if "loss" in e] for t in (ours, hf))
    assert [s for s, _ in got] == [s for s, _ in want] and len(got) == 12
    assert [loss for _, loss in got] == pytest.approx([loss for _, loss in want], rel=1e-5)


def test_split_batches_with_resume_keep_global_batch_is_refused():
    with pytest.raises(ValueError, match=r"`resume_keep_global_batch`=True with `accelerator_config=\{'split_batches'"):
        hf_lightning.TrainingArguments(output_dir="unused", resume_keep_global_batch=True,
                                       accelerator_config={"split_batches": True})


def test_accelerator_members_read_the_config_as_hfs(tmp_path):
    """HF's accelerator-config tests read `split_batches`, `use_seedable_sampler` and `gradient_state.plugin_kwargs`
    (the accumulation kwargs HF's Trainer gives accelerate) on `trainer.accelerator`."""
    seen = {}
    for config in ({}, {"split_batches": True, "use_seedable_sampler": False,
                        "gradient_accumulation_kwargs": {"sync_each_batch": True}}):
        for kind, trainer_cls, args_cls, extra in (
                ("hf", transformers.Trainer, transformers.TrainingArguments, {"use_cpu": True}),
                ("ours", hf_lightning.Trainer, hf_lightning.TrainingArguments, {})):
            args = args_cls(output_dir=str(tmp_path / kind), report_to="none", accelerator_config=copy.deepcopy(config),
                            **extra)
            accelerator = trainer_cls(model=tiny_gpt2(), args=args, train_dataset=lm_dataset(n=8)).accelerator
            seen[kind] = (accelerator.split_batches, accelerator.use_seedable_sampler,
                          accelerator.gradient_state.plugin_kwargs, accelerator.gradient_state.sync_gradients)
        assert seen["ours"] == seen["hf"], config
    assert seen["ours"][2] == {"num_steps": 1, "sync_each_batch": True}
