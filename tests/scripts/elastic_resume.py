"""Elastic resume scenarios (tests/test_resume_elastic.py): many runs per launch, one launch per number of processes.

Usage (PHASE, in this order, each reading the checkpoints of the phases before it from OUT):
  python elastic_resume.py one OUT
      One process: the uninterrupted runs (ours at global batch 4 and 8, transformers.Trainer at 4), saving every
      update, whose checkpoints the later phases resume.
  python -m torch.distributed.run --standalone --nproc_per_node 2 elastic_resume.py two OUT
      Two processes (gloo): resumes 1 -> 2 (per-device batch kept, global batch kept, accumulation 2, inside epochs
      0 and 1), the uninterrupted 2-process DDP and FSDP2 runs, a run with `dispatch_batches=True` and a 1 -> 2 resume
      into one, DDP -> FSDP2, FSDP2 -> DDP, transformers.Trainer's
      checkpoint into FSDP2, and transformers.Trainer's own 1 -> 2 resume.
  python -m torch.distributed.run --standalone --nproc_per_node 3 elastic_resume.py three OUT
      Three processes: resumes 2 -> 3 inside epochs 0 and 1.
  python elastic_resume.py last OUT
      One process again: resumes 2 -> 1 (per-device batch kept, `resume_keep_global_batch`), FSDP2 2 -> 1, and of the
      dispatched run.

Every run trains a tiny GPT-2 on 24 rows whose first token names the row, for 2 epochs, and writes, per process,
`OUT/<scenario>/rows_<rank>.json` (the rows of each update, from a `compute_loss` override), `log.json` (rank 0: the
log history) and `optimizer.pt` (rank 0: the gathered `exp_avg` / `exp_avg_sq` / `step` by parameter name, at the
start of the update after step CAPTURE_AT[scenario]).
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import transformers  # noqa: E402
from helpers import tiny_gpt2  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import hf_lightning  # noqa: E402

ROWS = 24
LENGTH = 6
SETTINGS = dict(num_train_epochs=2, learning_rate=1e-2, warmup_steps=1, logging_steps=1, save_strategy="steps",
                save_steps=1, seed=3, report_to="none", disable_tqdm=True, optim="adamw_torch", max_grad_norm=1.0,
                save_total_limit=None)


def dataset():
    """Row `r` is `[r + 3, ...]`: its first token names it (labels = inputs, no padding)."""
    from datasets import Dataset

    ids = [[r + 3] + [(r * 7 + j * 5) % 60 + 3 for j in range(1, LENGTH)] for r in range(ROWS)]
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * LENGTH] * ROWS, "labels": ids})


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def gathered_optimizer_state(model, optimizer) -> dict:
    """`{name: {exp_avg, exp_avg_sq, step}}` as full tensors (a collective under FSDP2: every rank calls it)."""
    optimizer = getattr(optimizer, "optimizer", optimizer)
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            entry = {}
            for key in ("exp_avg", "exp_avg_sq", "step"):
                value = state.get(key)
                if value is None:
                    continue
                if hasattr(value, "full_tensor"):
                    value = value.full_tensor()
                entry[key] = value.detach().cpu().clone().float()
            out[names[id(p)].replace("_fsdp_wrapped_module.", "")] = entry
    return out


def fsdp1_optimizer_state(root, optimizer) -> dict:
    """`gathered_optimizer_state` under FSDP1: torch's full optimizer state dict of the root (names from the
    LightningModule, `model.` first)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    optimizer = getattr(optimizer, "optimizer", optimizer)
    full = get_optimizer_state_dict(root, optimizer, options=StateDictOptions(full_state_dict=True))
    return {name.removeprefix("model."): {k: v.detach().cpu().clone().float() for k, v in state.items()}
            for name, state in full["state"].items()}


class Recorder(TrainerCallback):
    """Captures the gathered optimizer state at the start of the update after `capture_at` updates."""

    def __init__(self, folder: str, capture_at: int | None) -> None:
        self.folder, self.capture_at = folder, capture_at

    trainer = None

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.capture_at is not None and state.global_step == self.capture_at:
            lightning = getattr(self.trainer, "lightning_trainer", None)
            if lightning is not None and type(lightning.strategy).__name__.endswith("FSDPStrategy"):
                captured = fsdp1_optimizer_state(lightning.strategy.model, optimizer)
            else:
                captured = gathered_optimizer_state(model, optimizer)
            if rank() == 0:
                torch.save(captured, os.path.join(self.folder, "optimizer.pt"))
            self.capture_at = None


def row_logging(base):
    class RowLogging(base):
        """Logs the rows of each micro-batch with the update they belong to."""

        rows: list

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            self.rows.append([self.state.global_step + 1, [int(t) - 3 for t in inputs["input_ids"][:, 0]]])
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    return RowLogging


def make_trainer(folder: str, hf: bool, strategy: str, devices: int, overrides: dict):
    """Our Trainer (`devices` CPU processes, DDP or FSDP2) or transformers.Trainer, logging its rows."""
    settings = {**SETTINGS, "per_device_train_batch_size": 4, **overrides}
    model = tiny_gpt2(seed=0)
    model.loss_type = "ForCausalLM"
    if hf:
        return row_logging(transformers.Trainer)(
            model=model, args=transformers.TrainingArguments(output_dir=os.path.join(folder, "out"), use_cpu=True,
                                                             **settings),
            train_dataset=dataset())
    lightning = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False, "devices": devices}
    if strategy == "fsdp2":
        settings["fsdp"] = "full_shard auto_wrap"
    elif strategy == "fsdp1":
        settings.update(fsdp="full_shard auto_wrap", fsdp_config={"version": 1})
    elif devices > 1:
        lightning["strategy"] = "ddp"
    return row_logging(hf_lightning.Trainer)(
        model=model, args=hf_lightning.TrainingArguments(output_dir=os.path.join(folder, "out"), **settings),
        train_dataset=dataset(), lightning_kwargs=lightning)


def run(out: str, name: str, *, resume: str | None = None, hf: bool = False, capture_at: int | None = None,
        strategy: str = "ddp", devices: int = 1, **overrides) -> None:
    """One run, writing OUT/<name>/rows_<rank>.json, log.json and optimizer.pt (see the module docstring)."""
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    rows: list = []
    trainer = None
    try:  # an error (e.g. an argument this version lacks) is this scenario's result, not the launch's end
        trainer = make_trainer(folder, hf, strategy, devices, overrides)
        trainer.rows = rows
        recorder = Recorder(folder, capture_at)
        recorder.trainer = trainer
        trainer.add_callback(recorder)
        trainer.train(resume_from_checkpoint=resume)
        error = None
    except Exception as err:  # noqa: BLE001 - the test reads which
        error = f"{type(err).__name__}: {err}"
    with open(os.path.join(folder, f"rows_{rank()}.json"), "w") as f:
        json.dump(rows, f)
    state = trainer.state if trainer is not None else None  # the Trainer replaces its state object in train()
    if rank() == 0:
        with open(os.path.join(folder, "log.json"), "w") as f:
            json.dump({"log": state.log_history if state else [], "global_step": state.global_step if state else 0,
                       "error": error}, f)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def ckpt(out: str, name: str, step: int) -> str:
    return os.path.join(out, name, "out", f"checkpoint-{step}")


def main(phase: str, out: str) -> None:
    torch.set_num_threads(1)
    if phase == "one":
        run(out, "u1", capture_at=None)  # batch 4: 6 updates per epoch
        run(out, "u1_g8", gradient_accumulation_steps=2)  # global batch 8: 3 per epoch
        run(out, "hf_u1", hf=True, capture_at=1)
    elif phase == "two":
        two = {"devices": 2}
        run(out, "u2", capture_at=1, **two)  # global batch 8: 3 updates per epoch
        run(out, "u2_fsdp2", capture_at=1, strategy="fsdp2", **two)
        dispatched = {"accelerator_config": {"dispatch_batches": True}, **two}  # rank 0 reads every batch
        run(out, "u2_dispatch", **dispatched)
        run(out, "r12_dispatch", resume=ckpt(out, "u1", 1), **dispatched)
        run(out, "r12", resume=ckpt(out, "u1", 1), **two)  # inside epoch 0: 4 of 24 rows done
        run(out, "r12_e1", resume=ckpt(out, "u1", 8), **two)  # inside epoch 1: 8 of 24 rows done
        run(out, "r12_global", resume=ckpt(out, "u1_g8", 1), resume_keep_global_batch=True, **two)
        run(out, "r12_accum2", resume=ckpt(out, "u1", 3), per_device_train_batch_size=2,
            gradient_accumulation_steps=2, **two)
        run(out, "ddp_to_fsdp2", resume=ckpt(out, "u2", 1), capture_at=1, strategy="fsdp2", **two)
        run(out, "fsdp2_to_ddp", resume=ckpt(out, "u2_fsdp2", 1), capture_at=1, **two)
        run(out, "hf_to_fsdp2", resume=ckpt(out, "hf_u1", 1), capture_at=1, strategy="fsdp2",
            per_device_train_batch_size=2, **two)  # global batch 4 kept: transformers.Trainer's checkpoint
        run(out, "hf_r12", resume=ckpt(out, "hf_u1", 1), hf=True)  # transformers.Trainer's own 1 -> 2
        run(out, "u2_fsdp1", capture_at=1, strategy="fsdp1", **two)  # torch runs FSDP1 on CPU with gloo
        run(out, "fsdp1_to_ddp", resume=ckpt(out, "u2_fsdp1", 1), capture_at=1, **two)
        run(out, "ddp_to_fsdp1", resume=ckpt(out, "u2", 1), capture_at=1, strategy="fsdp1", **two)
    elif phase == "three":
        three = {"devices": 3}
        run(out, "r23", resume=ckpt(out, "u2", 1), **three)  # 8 of 24 rows done
        run(out, "r23_e1", resume=ckpt(out, "u2", 4), **three)
    elif phase == "last":
        run(out, "r21", resume=ckpt(out, "u2", 1))
        run(out, "r21_e1", resume=ckpt(out, "u2", 5))
        run(out, "r21_global", resume=ckpt(out, "u2", 1), resume_keep_global_batch=True)
        run(out, "fsdp2_21", resume=ckpt(out, "u2_fsdp2", 1), capture_at=1)
        run(out, "r21_dispatch", resume=ckpt(out, "u2_dispatch", 1))
    else:
        raise SystemExit(f"unknown phase {phase!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
