"""Training processes for tests/test_faults.py: killed at a chosen file-system operation, holding the lock, or
writing to a small disk.

Usage:
  python fault_train.py run OUT_DIR KILL_AT RESULT_JSON [MAX_STEPS]
      Train a tiny GPT-2 (save every update, save_total_limit=2) into OUT_DIR, resuming from its latest checkpoint
      when there is one. With KILL_AT > 0 the process SIGKILLs itself just before its KILL_AT-th file-system
      operation on OUT_DIR (mkdir, open for writing, fsync, rename, unlink, rmdir: every step of a save and of a
      rotation), so a kill lands at a chosen, reproducible moment; KILL_AT `OPERATION:TEXT:N` kills before the N-th
      OPERATION whose paths contain TEXT (e.g. `replace:deleting-checkpoint:1`, the first rotation rename). Writes
      RESULT_JSON when it finishes: the number of operations, the final global step, and the step it resumed from.
  python fault_train.py hold OUT_DIR READY GO
      Train, and after taking the output-directory lock create READY and wait until GO exists (a run that holds
      the lock for as long as the test needs).
  python fault_train.py disk OUT_DIR RESULT_JSON
      Train with a save every update until the disk is full; writes the error's type, errno and message.

With FAULT_DDP=1 in the environment, training runs on 2 CPU processes (DDP, gloo).
"""

import builtins
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from helpers import lm_dataset, tiny_gpt2  # noqa: E402

import hf_lightning  # noqa: E402

MAX_STEPS = 8


def make_trainer(out_dir: str, callbacks=(), max_steps: int = MAX_STEPS, **overrides) -> hf_lightning.Trainer:
    settings = dict(output_dir=out_dir, per_device_train_batch_size=2, max_steps=max_steps, learning_rate=1e-2,
                    logging_steps=1, save_strategy="steps", save_steps=1, save_total_limit=2, seed=5,
                    report_to="none", disable_tqdm=True, optim="adamw_torch")
    settings.update(overrides)
    ddp = {"devices": 2, "strategy": "ddp"} if os.environ.get("FAULT_DDP") == "1" else {}
    return hf_lightning.Trainer(
        model=tiny_gpt2(dropout=0.1), args=hf_lightning.TrainingArguments(**settings),
        train_dataset=lm_dataset(n=16), callbacks=list(callbacks),
        lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False, **ddp},
    )


class OperationCounter:
    """Counts file-system operations under one folder; SIGKILLs the process before operation number `kill_at`,
    after appending `<operation> <path>` to the file named by $FAULT_KILL_LOG (for the test's summary)."""

    def __init__(self, root: str, kill_at: str) -> None:
        self.root = os.path.realpath(root)
        operation, _, rest = kill_at.rpartition(":") if ":" in kill_at else ("", "", kill_at)
        self.kill_at = int(rest)
        self.operation, _, self.text = operation.partition(":")
        self.count = 0
        self.matching = 0

    def _touch(self, name: str, *paths, relative: bool = False) -> None:
        # `relative`: a name relative to a directory descriptor (shutil.rmtree): only this folder is removed here
        inside = [p for p in paths if isinstance(p, (str, os.PathLike)) and os.path.realpath(p).startswith(self.root)]
        if paths and not inside and not relative:
            return
        self.count += 1
        if self.operation:
            if name != self.operation or (self.text and not any(self.text in os.fspath(p) for p in paths)):
                return
            self.matching += 1
        if (self.matching if self.operation else self.count) == self.kill_at:
            log = os.environ.get("FAULT_KILL_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(" ".join([name, *(os.fspath(p) for p in paths)]) + "\n")
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        def wrap(name, real, nargs):
            def wrapped(*args, **kwargs):
                self._touch(name, *args[:nargs], relative=kwargs.get("dir_fd") is not None)
                return real(*args, **kwargs)
            return wrapped

        for name, nargs in (("replace", 2), ("rename", 2), ("unlink", 1), ("rmdir", 1), ("mkdir", 1)):
            setattr(os, name, wrap(name, getattr(os, name), nargs))
        real_fsync = os.fsync
        os.fsync = lambda fd: (self._touch("fsync"), real_fsync(fd))[1]
        real_open = builtins.open

        def open_(file, mode="r", *args, **kwargs):
            if any(flag in mode for flag in "wax+"):
                self._touch("open-for-writing", file)
            return real_open(file, mode, *args, **kwargs)

        builtins.open = open_


def run(out_dir: str, kill_at: str, result_json: str, max_steps: int = MAX_STEPS) -> None:
    from hf_lightning.checkpoint.find import last_checkpoint

    counter = OperationCounter(out_dir, kill_at)
    counter.install()
    resume = last_checkpoint(out_dir)
    trainer = make_trainer(out_dir, max_steps=max_steps)
    trainer.train(resume_from_checkpoint=True if resume else None)
    with open(result_json, "w") as f:
        json.dump({"operations": counter.count, "global_step": trainer.state.global_step,
                   "resumed_from": resume}, f)


def hold(out_dir: str, ready: str, go: str) -> None:
    from transformers import TrainerCallback

    class Wait(TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            open(ready, "w").close()
            while not os.path.exists(go):
                time.sleep(0.05)

    make_trainer(out_dir, [Wait()], max_steps=2).train()


def disk(out_dir: str, result_json: str) -> None:
    trainer = make_trainer(out_dir, save_total_limit=None, max_steps=50)
    try:
        trainer.train()
        outcome = {"error": None}
    except Exception as err:  # the test checks the type and message
        outcome = {"error": type(err).__name__, "errno": getattr(err, "errno", None), "message": str(err),
                   "step": trainer.state.global_step}
    with open(result_json, "w") as f:
        json.dump(outcome, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode = sys.argv[1]
    if mode == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], *(int(a) for a in sys.argv[5:6]))
    elif mode == "hold":
        hold(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        disk(sys.argv[2], sys.argv[3])
