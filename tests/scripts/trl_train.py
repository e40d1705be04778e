"""TRL runs (`SFTTrainer`, `DPOTrainer`) on a tiny local Llama, on hf_lightning or on the real transformers.Trainer.

    python trl_train.py '<json spec>'

The spec: `base` ("ours": `hf_lightning.use_as_transformers_trainer()` before importing trl; "hf": transformers'
own), `root` (each run writes to `<root>/<kind>`), `kinds` (of sft, sft_packing, sft_eval, sft_peft, dpo), and
optional `args` (settings of every run), `resume` (each kind again, resumed from `<root>/<kind>/checkpoint-3` into `<root>/<kind>-resumed`),
`lightning_kwargs` (ours only). Prints one line `RESULT <json>` on the global-zero process: per kind (and resumed
kind) the log history, the checkpoint folders written, whether TRL's model card was written, or the error. Run by
tests/test_trl_parity.py, once per base, so each process has one `transformers.Trainer` (the swap is process-wide).
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL pings the hub at every construction otherwise
os.environ.setdefault("HF_HUB_OFFLINE", "1")

spec = json.loads(sys.argv[1])
if spec["base"] == "ours":
    import hf_lightning

    hf_lightning.use_as_transformers_trainer(lightning_kwargs=spec.get("lightning_kwargs") or {"logger": False})

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datasets import Dataset  # noqa: E402
from gen_helpers import WORDS, tiny_llama, word_tokenizer  # noqa: E402


def sentences(n: int, seed: int, low: int = 3, high: int = 12) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) for _ in range(n)]


def common_args(kind: str, output_dir: str) -> dict:
    """Small, deterministic settings; TRL's own defaults otherwise (bf16 is TRL's default, off here: CPU parity;
    gradient checkpointing, TRL's default, stays on for the plain run)."""
    args = dict(
        output_dir=output_dir, max_steps=6, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1, save_steps=3,
        save_strategy="steps", seed=3, report_to="none", disable_tqdm=True, bf16=False, use_cpu=True,
        gradient_checkpointing=False, max_length=24, dataloader_num_workers=0,
    )
    if kind == "sft":  # TRL's default: activation (gradient) checkpointing on
        args.pop("gradient_checkpointing")
    if kind == "sft_eval":
        args.update(eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4)
    if kind == "sft_packing":
        args.update(packing=True, max_length=16)
    if kind == "sft_peft":
        args.update(learning_rate=5e-3)
    args.update(spec.get("args") or {})  # the spec's own settings win
    return args


def run(kind: str, output_dir: str, resume_from_checkpoint: str | None = None) -> dict:
    tokenizer = word_tokenizer()
    model = tiny_llama(seed=0)
    if kind == "dpo":  # TRL builds the reference model from the policy's path (as HF does: a folder here)
        folder = os.path.join(output_dir + "-model")
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        model = folder
        from trl import DPOConfig, DPOTrainer

        rng = random.Random(5)
        prompts = sentences(24, seed=1, low=2, high=5)
        train = Dataset.from_dict({
            "prompt": prompts,
            "chosen": [" ".join(reversed(p.split())) for p in prompts],
            "rejected": [" ".join(rng.choice(WORDS) for _ in range(3)) for _ in prompts],
        })
        trainer = DPOTrainer(model=model, args=DPOConfig(**common_args(kind, output_dir)), train_dataset=train,
                             processing_class=tokenizer)
    else:
        from trl import SFTConfig, SFTTrainer

        extra = {}
        if kind == "sft_eval":
            extra["eval_dataset"] = Dataset.from_dict({"text": sentences(10, seed=9)})
        if kind == "sft_peft":
            from peft import LoraConfig

            extra["peft_config"] = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                              target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        trainer = SFTTrainer(model=model, args=SFTConfig(**common_args(kind, output_dir)),
                             train_dataset=Dataset.from_dict({"text": sentences(48, seed=2)}),
                             processing_class=tokenizer, **extra)
    if spec["base"] == "ours":
        import hf_lightning

        assert isinstance(trainer, hf_lightning.Trainer), type(trainer).__mro__
    else:
        assert type(trainer).__mro__[-2].__module__ == "transformers.trainer", type(trainer).__mro__
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    out = Path(output_dir)
    return {"log": trainer.state.log_history, "checkpoints": sorted(p.name for p in out.glob("checkpoint-*")),
            "card": (out / "README.md").is_file(), "zero": trainer.is_world_process_zero()}


def run_or_error(kind: str, output_dir: str, resume_from_checkpoint: str | None = None) -> dict:
    """The run's result, or its error (one kind's failure does not hide the others')."""
    try:
        return run(kind, output_dir, resume_from_checkpoint)
    except Exception:
        return {"error": traceback.format_exc()[-4000:], "zero": True}


if __name__ == "__main__":
    results = {}
    for kind in spec["kinds"]:
        results[kind] = run_or_error(kind, os.path.join(spec["root"], kind))
        if spec.get("resume"):
            results[kind + "-resumed"] = run_or_error(kind, os.path.join(spec["root"], kind + "-resumed"),
                                                      os.path.join(spec["root"], kind, "checkpoint-3"))
    if all(result.pop("zero", True) for result in results.values()):
        print("RESULT " + json.dumps(results, default=float), flush=True)
