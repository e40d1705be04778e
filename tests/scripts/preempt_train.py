"""Training processes that signal themselves at chosen instants, for tests/test_preemption.py.

Usage: python preempt_train.py SPEC_JSON

SPEC_JSON (a file) holds:
  mode: "once"   one `train()` into `out` (resuming when `resume` is true; `evaluate()` with `evaluate`); with
                 `catch` the `TrainingPreempted` /
                 `KeyboardInterrupt` is caught and described in `result`, else it ends the process;
        "trials" (2 processes with `ddp`) for each of `trials` (each a dict with `triggers` and `save_async`): the
                 uninterrupted run (once per `save_async`), the signalled run (its `TrainingPreempted` caught), then
                 `resume_from_checkpoint=True`; rank 0 writes, per trial, where it stopped and whether the resumed
                 run's losses and weights equal the uninterrupted run's.
  triggers: [{"rank": 0, "phase": PHASE, "step": N, "signal": "SIGTERM", "count": 1}, ...]: on that rank, at the
      first moment of PHASE where `state.global_step == N`, send the signal `count` times to this process.
      PHASE: `step_begin` / `substep_end` / `pre_optimizer_step` / `step_end` (HF's events), `forward` (the model's
      forward in training), `eval` (the model's forward in an evaluation), `save` (the checkpoint of step N being
      written: the first `torch.save` of this process into it, on every rank, in the background thread with
      `save_async`), `setup` (Lightning's `setup` hook of the fit: after tokenisation and the data checks, before the
      resume is loaded; any step). Signal `RAISE` raises an `OSError` there instead.
  settings: TrainingArguments overrides (e.g. enable_jit_checkpoint, save_async, save_steps).
  ddp: 2 CPU processes (Lightning's DDP, gloo).
  slurm: run under Lightning's `SLURMEnvironment(auto_requeue=True)` (the SLURM_* variables set by the test).
"""

import json
import os
import signal
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from helpers import lm_dataset, tiny_gpt2  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import hf_lightning  # noqa: E402


class Signaller(TrainerCallback):
    """Sends the triggers' signals at their phase and step (see the module docstring)."""

    def __init__(self, triggers) -> None:
        self.triggers = [dict(t) for t in triggers]
        self.trainer = None
        self.saves: list[int] = []  # the steps of HF's `on_save` events

    def fire(self, phase: str, step: int) -> None:
        rank = self.trainer.lightning_trainer.global_rank if self.trainer.lightning_trainer is not None else 0
        for trigger in self.triggers:
            if trigger.get("fired") or trigger["rank"] != rank or trigger["phase"] != phase \
                    or trigger["step"] != step:
                continue
            trigger["fired"] = True
            if trigger["signal"] == "RAISE":  # a failing write (a full disk...) at this instant
                raise OSError(5, "Input/output error (simulated by the test's trigger)")
            for _ in range(trigger.get("count", 1)):
                os.kill(os.getpid(), getattr(signal, trigger["signal"]))

    def on_step_begin(self, args, state, control, **kwargs):
        self.fire("step_begin", state.global_step)

    def on_save(self, args, state, control, **kwargs):
        self.saves.append(state.global_step)

    def on_substep_end(self, args, state, control, **kwargs):
        self.fire("substep_end", state.global_step)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.fire("pre_optimizer_step", state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self.fire("step_end", state.global_step)

    def forward_hook(self, module, inputs) -> None:
        self.fire("forward" if module.training else "eval", self.trainer.state.global_step)


class SetupSignaller(pl.Callback):
    """The `setup` phase: Lightning's `setup` hook, before the fit loop installs its signal handlers."""

    def __init__(self, signaller: Signaller) -> None:
        self.signaller = signaller

    def setup(self, trainer, pl_module, stage) -> None:
        for trigger in self.signaller.triggers:
            if trigger["phase"] == "setup" and not trigger.get("fired"):
                trigger["fired"] = True
                os.kill(os.getpid(), getattr(signal, trigger["signal"]))


SIGNALLERS: list = []
_torch_save = torch.save


def _save(obj, f, *args, **kwargs):
    """`torch.save`, and the `save` phase of the signallers when `f` is in a checkpoint being written."""
    parent = os.path.basename(os.path.dirname(str(getattr(f, "name", f))))  # tmp-checkpoint-<step>-<run>
    if parent.startswith("tmp-checkpoint-"):
        for signaller in SIGNALLERS:
            signaller.fire("save", int(parent.split("-")[2]))
    return _torch_save(obj, f, *args, **kwargs)


def make_trainer(out: str, triggers=(), ddp: bool = False, slurm: bool = False, **overrides) -> hf_lightning.Trainer:
    settings = dict(output_dir=out, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=6,
                    learning_rate=1e-2, logging_steps=1,
                    save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=3, seed=5,
                    report_to="none", disable_tqdm=True, optim="adamw_torch", enable_jit_checkpoint=True)
    settings.update(overrides)
    signaller = Signaller(triggers)
    SIGNALLERS[:] = [signaller]
    model = tiny_gpt2(dropout=0.1)
    model.register_forward_pre_hook(signaller.forward_hook)
    more = {"devices": 2, "strategy": "ddp"} if ddp else {}
    if slurm:
        from lightning.fabric.plugins.environments import SLURMEnvironment

        more["plugins"] = [SLURMEnvironment(auto_requeue=True)]
    trainer = hf_lightning.Trainer(
        model=model, args=hf_lightning.TrainingArguments(**settings), train_dataset=lm_dataset(n=16),
        eval_dataset=lm_dataset(n=4, seed=1), callbacks=[signaller, SetupSignaller(signaller)],
        lightning_kwargs={"accelerator": "cpu", "logger": False, "enable_progress_bar": False, **more},
    )
    signaller.trainer = trainer
    return trainer


def losses(history) -> list:
    return [[e["step"], e["loss"], e["grad_norm"], e["learning_rate"], e["epoch"]] for e in history if "loss" in e]


def eval_losses(history) -> list:
    return [[e["step"], e["eval_loss"]] for e in history if "eval_loss" in e]


def once(spec: dict) -> None:
    trainer = make_trainer(spec["out"], spec.get("triggers", ()), spec.get("ddp", False), spec.get("slurm", False),
                           **spec.get("settings", {}))
    result = {"stopped": None}
    sigterm_before = signal.getsignal(signal.SIGTERM)
    try:
        if spec.get("evaluate"):
            trainer.evaluate()
        else:
            trainer.train(resume_from_checkpoint=True if spec.get("resume") else None)
    except hf_lightning.TrainingPreempted as stop:
        result["stopped"] = {"type": "TrainingPreempted", "code": stop.code, "step": stop.step,
                             "checkpoint": stop.checkpoint, "saved": stop.saved, "message": str(stop),
                             "signum": stop.signum, "is_system_exit": isinstance(stop, SystemExit)}
        if not spec.get("catch"):
            raise
    except KeyboardInterrupt:
        result["stopped"] = {"type": "KeyboardInterrupt", "traceback": traceback.format_exc()}
        if not spec.get("catch"):
            raise
    finally:
        result.update(global_step=trainer.state.global_step, losses=losses(trainer.state.log_history),
                      eval_losses=eval_losses(trainer.state.log_history), saves=SIGNALLERS[0].saves,
                      handlers_restored=signal.getsignal(signal.SIGTERM) is sigterm_before
                      and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        if trainer.lightning_trainer is None or trainer.lightning_trainer.is_global_zero:
            with open(spec["result"], "w") as f:
                json.dump(result, f)


def _weights(trainer) -> dict:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def trials(spec: dict) -> None:
    from hf_lightning.checkpoint.integrity import folder_problems
    from hf_lightning.checkpoint.find import check_checkpoint

    root, ddp = spec["root"], spec.get("ddp", False)
    references = {}
    results = []
    for index, trial in enumerate(spec["trials"]):
        save_async = trial["save_async"]
        if save_async not in references:
            reference = make_trainer(os.path.join(root, f"reference-{save_async}"), ddp=ddp, save_async=save_async)
            reference.train()
            references[save_async] = (losses(reference.state.log_history),
                                      eval_losses(reference.state.log_history), _weights(reference))
        out = os.path.join(root, f"trial-{index}")
        stopped = make_trainer(out, trial["triggers"], ddp=ddp, save_async=save_async)
        outcome = {"trial": trial, "stopped_at": None}
        try:
            stopped.train()
        except hf_lightning.TrainingPreempted as stop:
            outcome.update(stopped_at=stop.step, code=stop.code, checkpoint=os.path.basename(stop.checkpoint or ""))
        folders = sorted(n for n in os.listdir(out) if n.startswith("checkpoint-"))
        complete = True
        for name in folders:
            try:
                check_checkpoint(os.path.join(out, name))
                complete = complete and not folder_problems(os.path.join(out, name))
            except Exception:
                complete = False
        resumed = make_trainer(out, ddp=ddp, save_async=save_async)
        resumed.train(resume_from_checkpoint=True)
        want_losses, want_evals, want_weights = references[save_async]
        got = _weights(resumed)
        outcome.update(folders=folders, complete=complete,
                       losses_equal=losses(resumed.state.log_history) == want_losses,
                       evals_equal=eval_losses(resumed.state.log_history) == want_evals,
                       weights_equal=got.keys() == want_weights.keys()
                       and all(torch.equal(got[k], want_weights[k]) for k in got))
        results.append(outcome)
        if resumed.lightning_trainer.is_global_zero:
            with open(spec["result"], "w") as f:
                json.dump(results, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.save = _save  # the `save` phase (only in the script's own processes, not when a test imports it)
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    (trials if spec["mode"] == "trials" else once)(spec)
