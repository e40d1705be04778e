"""Lock-step evaluation without processes: which strategies need it, how many padding steps a short rank runs, which
outputs are dropped; and tied weights in a gathered state dict saved as one process saves them.

The 2-process runs that prove the whole path (FSDP2 on gloo) are in tests/test_sharded_eval.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import tiny_gpt2
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from hf_lightning import TrainingArguments
from hf_lightning.checkpoint.distributed import alias_tied_weights, tied_parameter_names
from hf_lightning.data.sampling import ContiguousShardSampler
from hf_lightning.module.eval_run import EvalAccumulator
from hf_lightning.module.evaluation import EvalSettings, EvalStep
from hf_lightning.parallel.lockstep import forwards_are_collective, needs_lockstep_forwards, strategy_kind


def test_the_rule_pairs_forwards_where_each_forward_is_a_collective() -> None:
    """FSDP1, FSDP2 and ZeRO-3 on several processes; not DDP, ZeRO-1/2 or one process; any FSDP2-sharded model."""
    assert forwards_are_collective("fsdp2", 2) and forwards_are_collective("fsdp1", 8)
    assert forwards_are_collective("deepspeed", 2, zero_stage=3)
    assert not forwards_are_collective("deepspeed", 2, zero_stage=2)
    assert not forwards_are_collective("deepspeed", 2, zero_stage=1)
    assert not forwards_are_collective("other", 2)  # DDP: a local forward
    assert forwards_are_collective("other", 2, params_sharded=True)  # fully_shard applied by a user's own code
    for kind in ("fsdp2", "fsdp1", "deepspeed", "other"):
        assert not forwards_are_collective(kind, 1, zero_stage=3, params_sharded=True)  # nobody to wait for


def test_lightning_strategies_are_read_as_their_family() -> None:
    model = tiny_gpt2()
    assert strategy_kind(ModelParallelStrategy()) == "fsdp2"
    assert strategy_kind(FSDPStrategy()) == "fsdp1"
    assert strategy_kind(DDPStrategy()) == "other"
    assert needs_lockstep_forwards(ModelParallelStrategy(), 2, model)
    assert needs_lockstep_forwards(FSDPStrategy(), 2, model)
    assert not needs_lockstep_forwards(DDPStrategy(), 2, model)
    assert not needs_lockstep_forwards(SingleDeviceStrategy(torch.device("cpu")), 1, model)
    assert not needs_lockstep_forwards(ModelParallelStrategy(), 1, model)
    deepspeed = pytest.importorskip("deepspeed")
    del deepspeed
    from lightning.pytorch.strategies import DeepSpeedStrategy

    assert needs_lockstep_forwards(DeepSpeedStrategy(stage=3), 2, model)
    assert not needs_lockstep_forwards(DeepSpeedStrategy(stage=2), 2, model)


def _rows(n: int) -> Any:
    return list(range(n))  # a map-style dataset of row indices


def _accumulator(loader: DataLoader, pad_step: Any, world_size: int = 2) -> EvalAccumulator:
    args = TrainingArguments(output_dir="unused", report_to="none", per_device_eval_batch_size=loader.batch_size or 1)
    return EvalAccumulator(EvalSettings(args=args, label_names=["labels"]), prediction_loss_only=False,
                           is_prediction=True, world_size=world_size, loader=loader, pad_step=pad_step)


def _step(batch: dict[str, torch.Tensor]) -> EvalStep:
    return EvalStep(loss=None, logits=batch["x"].float(), labels=None)


def _batches(loader: DataLoader) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.as_tensor(b)} for b in loader]


def test_the_short_rank_repeats_its_first_batch_until_it_ran_as_many_steps_as_the_busiest() -> None:
    """9 rows in batches of 2 on 2 ranks: rank 0 has 3 batches, rank 1 2; rank 1 runs one padding step on its first
    batch, rank 0 none; the padding step's outputs are not recorded."""
    ran: list[list[int]] = []
    per_rank = {}
    for rank in (0, 1):
        loader = DataLoader(_rows(9), batch_size=2, sampler=ContiguousShardSampler(9, 2, rank, 2))
        accumulator = _accumulator(loader, lambda batch: ran.append(batch["x"].tolist()))
        for batch in _batches(loader):
            accumulator.add(batch, _step(batch))
        per_rank[rank] = (accumulator.pad_to_busiest_rank(), accumulator.steps, len(accumulator.preds))
    assert per_rank == {0: (0, 3, 3), 1: (1, 3, 2)}
    assert ran == [[6, 7]]  # rank 1's first batch


def test_a_rank_without_rows_reads_one_padding_row_and_drops_its_outputs() -> None:
    """One row on 2 ranks: rank 1 reads row 0 as padding (so it runs the loop and joins the gather), nothing of it is
    kept, and it owes no further step; without a pad step (DDP) the row is dropped all the same."""
    loader = DataLoader(_rows(1), batch_size=4, sampler=ContiguousShardSampler(1, 2, 1, 4))
    for pad_step in (lambda batch: pytest.fail("no step is owed"), None):
        accumulator = _accumulator(loader, pad_step)
        for batch in _batches(loader):
            accumulator.add(batch, _step(batch))
        assert accumulator.pad_to_busiest_rank() == 0
        assert (accumulator.steps, accumulator.num_samples, accumulator.preds) == (1, 0, [])


def test_one_process_never_pads() -> None:
    loader = DataLoader(_rows(9), batch_size=2, sampler=ContiguousShardSampler(9, 1, 0, 2))
    accumulator = _accumulator(loader, lambda batch: pytest.fail("one process pads nothing"), world_size=1)
    batch = {"x": torch.tensor([0, 1])}
    accumulator.add(batch, _step(batch))
    assert accumulator.pad_to_busiest_rank() == 0


def test_a_gathered_state_dict_saves_tied_weights_once_as_the_model_itself(tmp_path: Path) -> None:
    """A gathered full state dict holds one tensor per name; aliased back, `save_pretrained` writes what it writes for
    the model itself (GPT-2: 28 tensors, no `lm_head.weight`); untied weights stay two tensors."""
    model = tiny_gpt2()
    assert tied_parameter_names(model) == {"lm_head.weight": "transformer.wte.weight"}
    model.save_pretrained(tmp_path / "own")
    gathered = {k: v.clone() for k, v in model.state_dict().items()}  # what a gather returns: separate copies
    model.save_pretrained(tmp_path / "aliased", state_dict=alias_tied_weights(gathered, model))
    own, aliased = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("own", "aliased"))
    assert aliased.keys() == own.keys() and "lm_head.weight" not in aliased

    # FSDP1 without `use_orig_params` leaves plain tensors where the parameters were: the model's tie map names them
    hidden = tiny_gpt2()
    weight = hidden.lm_head.weight.detach()
    del hidden.lm_head._parameters["weight"]
    hidden.lm_head.weight = weight
    assert tied_parameter_names(hidden) == {"lm_head.weight": "transformer.wte.weight"}

    model.config.tie_word_embeddings = False
    untied = type(model)(model.config)
    assert tied_parameter_names(untied) == {}
    copies = {k: v.clone() for k, v in untied.state_dict().items()}
    assert alias_tied_weights(dict(copies), untied).keys() == copies.keys()
    assert "lm_head.weight" in copies
