"""`accelerator_config={"dispatch_batches": True}` on 2 processes, in ONE `torchrun --nproc_per_node 2` launch.

1. The loader rule: for several geometries (full rounds, a short last round that divides or not, one row, drop_last,
   split_batches, a resumed epoch, a stream) every process's batches from accelerate's own `DataLoaderDispatcher`
   (`prepare_data_loader(..., dispatch_batches=True)`, `skip_first_batches`) and from hf_lightning's
   `DispatchLoader`, over two epochs, with `len()`.
2. Runs: `transformers.Trainer` and `hf_lightning.Trainer` train the same tiny GPT-2 (dropout on) with dispatched
   batches whose last round of each epoch is short, and evaluate every epoch; then the same rows as a stream
   (`datasets.IterableDataset`: HF's default dispatches it), 6 updates.

Writes OUT_DIR/rank<r>.json (the loaders' batches and lengths per geometry, both sides) and, on rank 0, each
trainer's log history and final weights (OUT_DIR/<side>[-stream]/final).
Usage: python -m torch.distributed.run --nproc_per_node 2 dispatch_twins.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from helpers import lm_dataset, tiny_gpt2  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

GEOMETRIES = {  # name: (rows, batch size, drop_last, split_batches, steps skipped)
    "full": (16, 4, False, False, 0),
    "short-divides": (14, 4, False, False, 0),
    "short-completed": (13, 4, False, False, 0),
    "one-batch-left": (10, 4, False, False, 0),
    "one-row-left": (9, 4, False, False, 0),
    "drop-last": (13, 4, True, False, 0),
    "split": (13, 4, False, True, 0),
    "resumed": (13, 4, False, False, 1),
    "resumed-drop-last": (13, 4, True, False, 1),
    "stream": (13, 4, False, False, 0),
    "stream-resumed": (13, 4, False, False, 1),
}


def _rows(n: int) -> list[dict]:
    return [{"x": torch.tensor([i, 100 + i])} for i in range(n)]


class _Stream(torch.utils.data.IterableDataset):
    """The same rows as a stream (no length): only rank 0 reads it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(_rows(self.n))


def _batches(loader, epochs: int = 2) -> list[list[list[int]]]:
    out = []
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        out.append([batch["x"][:, 0].tolist() for batch in loader])
    return out


def loader_rule(rank: int) -> dict:
    from accelerate.data_loader import prepare_data_loader, skip_first_batches

    from hf_lightning.data.dispatch import DispatchLoader
    from hf_lightning.data.windows import start_after

    seen = {}
    for name, (rows, batch, drop_last, split, skip) in GEOMETRIES.items():
        data = (lambda: _Stream(rows)) if name.startswith("stream") else (lambda: _rows(rows))  # noqa: B023
        theirs = prepare_data_loader(DataLoader(data(), batch_size=batch, drop_last=drop_last),
                                     num_processes=2, process_index=rank, dispatch_batches=True,
                                     split_batches=split, put_on_device=True)
        ours = DispatchLoader(DataLoader(data(), batch_size=batch, drop_last=drop_last), 2, rank,
                              split_batches=split, drop_last=drop_last)
        if skip:  # one resumed epoch: accelerate reads and drops, ours starts after the skipped steps
            theirs_batches = [[b["x"][:, 0].tolist() for b in skip_first_batches(theirs, skip)]]
            ours_batches = [[b["x"][:, 0].tolist() for b in start_after(ours, skip)]]
        else:
            theirs_batches, ours_batches = _batches(theirs), _batches(ours)
        lengths = [len(theirs), len(ours)] if not name.startswith("stream") else []
        # (accelerate's `total_batch_size` reads `dataset.batch_size`, which a map-style dataset has not)
        seen[name] = {"theirs": theirs_batches, "ours": ours_batches, "len": lengths,
                      "total_batch_size": ours.total_batch_size}
    return seen


def train(side: str, out_dir: str, stream: bool = False) -> None:
    """One run of `side` on the process group; `stream`: the rows as a `datasets.IterableDataset` (HF dispatches a
    stream by default), 6 updates, so the second pass is cut short."""
    length = {"max_steps": 6, "eval_strategy": "steps", "eval_steps": 3} if stream else {
        "num_train_epochs": 2, "eval_strategy": "epoch"}
    name = f"{side}-stream" if stream else side
    settings = dict(output_dir=os.path.join(out_dir, name), per_device_train_batch_size=4, logging_steps=1,
                    per_device_eval_batch_size=4, save_strategy="no", seed=5, learning_rate=1e-3, report_to="none",
                    disable_tqdm=True, ddp_backend="gloo", accelerator_config={"dispatch_batches": True}, **length)
    if side == "hf":
        import transformers as lib

        extra, kwargs = {"use_cpu": True}, {}
    else:
        import hf_lightning as lib

        extra = {}
        kwargs = {"lightning_kwargs": {"accelerator": "cpu", "logger": False, "enable_model_summary": False}}
    model = tiny_gpt2(dropout=0.1, seed=3)
    # HF counts the shifted labels then (test_train_parity.gpt2_hf_counts_correctly), so its loss is the oracle's
    model.loss_type = "ForCausalLM"
    # 26 rows in batches of 4: 7 batches, so each epoch ends with a round of one 2-row batch, one row per process;
    # the rows are padded to one length (accelerate joins a round's batches) with different label counts
    rows = lm_dataset(26, seed=2)
    trainer = lib.Trainer(model=model, args=lib.TrainingArguments(**settings, **extra),
                          train_dataset=rows.to_iterable_dataset() if stream else rows,
                          eval_dataset=lm_dataset(16, seed=4), **kwargs)
    trainer.train()
    trainer.save_model(os.path.join(out_dir, name, "final"))
    if trainer.is_world_process_zero():
        with open(os.path.join(out_dir, name, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f)
    if side == "ours" and not stream:
        loader = trainer.get_train_dataloader()
        with open(os.path.join(out_dir, f"ours-loader{trainer.args.process_index}.json"), "w") as f:
            json.dump({"type": type(loader).__name__, "len": len(loader), "total": loader.total_batch_size}, f)


if __name__ == "__main__":
    from accelerate import PartialState

    out = sys.argv[1]
    PartialState(cpu=True, backend="gloo")
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(loader_rule(rank), f)
    for stream in (False, True):
        train("hf", out, stream)
        train("ours", out, stream)
