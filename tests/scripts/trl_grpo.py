"""TRL's `GRPOTrainer` / `RLOOTrainer` (generation by `model.generate`, no vLLM) on a tiny local Llama, on
hf_lightning or on the real transformers.Trainer, with what each update generated, scored and learned recorded.

    python trl_grpo.py '<json spec>'          (or a path to a JSON file)

Spec: `base` ("ours": `hf_lightning.use_as_transformers_trainer()` before importing trl; "hf": transformers' own),
optional `policy` (the tiny policy's folder, written by the caller; else written here), `mode` and its keys:

- `parity`: `root`, `kinds` (of `ni1`, `ni2`: GRPO with num_iterations 1 / 2, `rloo`: `RLOOTrainer` with
  num_iterations 2; gradient_accumulation_steps 2), `resume` (each kind
  again from `<root>/<kind>/checkpoint-1` into `<root>/<kind>-resumed`). Prints `RESULT <json>` on global zero: per
  run the log history, the per-update records (completions, rewards, advantages), the checkpoint folders.
- `preempt` (ours): `root`, `kind`, `instants` (a list of `{"phase", "step"}`: a SIGTERM sent to this process there),
  `kill` (one such instant for a SIGKILL), `result` (a JSON file). The uninterrupted run, then for every instant a run
  stopped by SIGTERM there and resumed (in this process) from the checkpoint it wrote; the results are written to
  `result`; then a run with a checkpoint at every update is killed by SIGKILL at `kill` (this process dies).
- `resume_last` (ours): `root`, `kind`, `folder` (the killed run's output_dir), `result`: the run resumed from the last
  complete checkpoint there, its records written to `result`.

Phases: `generate` (inside the reward function, while the update's generation batch is scored: during generation),
`substep` (between the micro-batches of an update: between two slices of one buffer), `pre_optimizer_step` (in the
update, gradients ready), `step_end` (between updates: between iterations over a buffer with num_iterations 2).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL pings the hub at every construction otherwise
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_raw = sys.argv[1]
spec = json.loads(Path(_raw).read_text() if _raw.endswith(".json") else _raw)
if spec["base"] == "ours":
    import hf_lightning

    hf_lightning.use_as_transformers_trainer(lightning_kwargs=spec.get("lightning_kwargs") or {"logger": False})

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from gen_helpers import WORDS, tiny_llama, word_tokenizer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

MAX_STEPS = 4
VOLATILE = ("step_time", "runtime", "per_second")


class Instant:
    """Where to send a signal to this process: `phase` at update `step` (1-based: the update running)."""

    def __init__(self, phase: str | None = None, step: int = 0, signum: int = signal.SIGTERM) -> None:
        self.phase, self.step, self.signum, self.fired = phase, step, signum, False

    def reached(self, phase: str, step: int) -> None:
        if not self.fired and phase == self.phase and step == self.step:
            self.fired = True
            os.kill(os.getpid(), self.signum)


class Recorder(TrainerCallback):
    """After every update: the completions, rewards and advantages of the generation the update trained on (TRL's
    `_logs`, the last generation batch), so both bases' records can be compared update by update."""

    def __init__(self, instant: Instant) -> None:
        self.instant = instant
        self.trainer = None
        self.records: list[dict] = []

    def on_substep_end(self, args, state, control, **kwargs):
        self.instant.reached("substep", state.global_step + 1)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.instant.reached("pre_optimizer_step", state.global_step + 1)

    def on_step_end(self, args, state, control, **kwargs):
        logs = self.trainer._logs
        self.records.append({"step": state.global_step, "completions": list(logs["completion"]),
                             "rewards": {k: list(v) for k, v in logs["rewards"].items()},
                             "advantages": list(logs["advantages"]), "inner_step": self.trainer._step})
        self.instant.reached("step_end", state.global_step)


def make_reward(instant: Instant, recorder: Recorder):
    def reward_w1(completions, **kwargs):
        """+1 per `w1`, -0.1 per word: learnable by a tiny model within a few updates."""
        instant.reached("generate", recorder.trainer.state.global_step + 1 if recorder.trainer else 0)
        return [float(c.split().count("w1")) - 0.1 * len(c.split()) for c in completions]
    return reward_w1


def model_folder(root: Path) -> str:
    """The tiny policy saved once (TRL builds the reference model from the policy's path, as HF does)."""
    if spec.get("policy"):  # written by the test (several processes: transformers' save_pretrained under
        return spec["policy"]  # torchrun writes the weights on the main process only)
    folder = root / "policy"
    if not (folder / "config.json").is_file():
        tiny_llama(seed=0).save_pretrained(folder)
        word_tokenizer().save_pretrained(folder)
    return str(folder)


def build(kind: str, output_dir: str, root: Path, instant: Instant, **extra):
    if kind == "rloo":  # RLOOTrainer: the same generation buffer, its own advantages and loss
        from trl import RLOOConfig as GRPOConfig
        from trl import RLOOTrainer as GRPOTrainer
    else:
        from trl import GRPOConfig, GRPOTrainer

    rng = random.Random(1)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4))) for _ in range(16)]
    args = GRPOConfig(
        output_dir=output_dir, max_steps=MAX_STEPS, per_device_train_batch_size=4, num_generations=4,
        gradient_accumulation_steps=2, num_iterations=1 if kind == "ni1" else 2, learning_rate=1e-2, beta=0.1,
        max_completion_length=6, logging_steps=1, save_steps=1, seed=3, report_to="none", disable_tqdm=True,
        bf16=False, use_cpu=True, dataloader_num_workers=0, **extra,
    )
    recorder = Recorder(instant)
    trainer = GRPOTrainer(model=model_folder(root), reward_funcs=make_reward(instant, recorder), args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=word_tokenizer(),
                          callbacks=[recorder])
    recorder.trainer = trainer
    if spec["base"] == "ours":
        assert isinstance(trainer, hf_lightning.Trainer), type(trainer).__mro__
    else:
        assert type(trainer).__mro__[-2].__module__ == "transformers.trainer", type(trainer).__mro__
    return trainer, recorder


def run(kind: str, output_dir: str, root: Path, resume: str | None = None, instant: Instant | None = None,
        **extra) -> dict:
    trainer, recorder = build(kind, output_dir, root, instant or Instant(), **extra)
    trainer.train(resume_from_checkpoint=resume)
    return {"log": trainer.state.log_history, "records": recorder.records,
            "checkpoints": sorted(p.name for p in Path(output_dir).glob("checkpoint-*")),
            "zero": trainer.is_world_process_zero()}


def run_or_error(*args, **kwargs) -> dict:
    try:
        return run(*args, **kwargs)
    except Exception:
        return {"error": traceback.format_exc()[-4000:], "zero": True}


def parity() -> None:
    root = Path(spec["root"])
    results = {}
    for kind in spec["kinds"]:
        results[kind] = run_or_error(kind, str(root / kind), root)
        if spec.get("resume"):
            results[kind + "-resumed"] = run_or_error(kind, str(root / f"{kind}-resumed"), root,
                                                      str(root / kind / "checkpoint-1"))
    if all(result.pop("zero", True) for result in results.values()):
        print("RESULT " + json.dumps(results, default=float), flush=True)


def preempt() -> None:
    """The uninterrupted run, every SIGTERM instant stopped and resumed in this process, then the SIGKILL run."""
    root, kind = Path(spec["root"]), spec["kind"]
    out: dict = {"reference": run(kind, str(root / "reference"), root, enable_jit_checkpoint=True,
                                  save_strategy="no"), "stops": []}
    for i, where in enumerate(spec["instants"]):
        folder = str(root / f"stop{i}")
        instant = Instant(where["phase"], where["step"])
        try:
            run(kind, folder, root, instant=instant, enable_jit_checkpoint=True, save_strategy="no")
            stop = {"instant": where, "error": "the run was not stopped"}
        except hf_lightning.TrainingPreempted as stopped:
            checkpoints = sorted(Path(folder).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
            resumed = run(kind, folder, root, resume=str(checkpoints[-1]), enable_jit_checkpoint=True,
                          save_strategy="no")
            stop = {"instant": where, "stopped": str(stopped), "checkpoint": checkpoints[-1].name,
                    "resumed": resumed}
        out["stops"].append(stop)
    Path(spec["result"]).write_text(json.dumps(out, default=float))
    where = spec["kill"]
    run(kind, str(root / "killed"), root, instant=Instant(where["phase"], where["step"], signal.SIGKILL))
    raise SystemExit("the SIGKILL instant was never reached")


def resume_last() -> None:
    root, kind, folder = Path(spec["root"]), spec["kind"], Path(spec["folder"])
    from hf_lightning.checkpoint.find import check_checkpoint

    complete = []
    for path in sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
        try:
            check_checkpoint(str(path), 1, 0)
            complete.append(path)
        except (ValueError, FileNotFoundError):
            pass
    resumed = run(kind, str(folder), root, resume=str(complete[-1]))
    Path(spec["result"]).write_text(json.dumps({"checkpoint": complete[-1].name, "resumed": resumed}, default=float))


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"parity": parity, "preempt": preempt, "resume_last": resume_last}[spec["mode"]]()
