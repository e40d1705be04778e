"""TRL's preference and reward trainers (`DPOTrainer`, `KTOTrainer`, `RewardTrainer`) on a tiny local Llama, on
hf_lightning or on the real transformers.Trainer.

    python trl_preference.py '<json spec>'

The spec: `base` ("ours": `hf_lightning.use_as_transformers_trainer()` before importing trl; "hf": transformers'
own), `root` (each run writes to `<root>/<kind>`), `kinds` (of `KINDS`). Prints one line `RESULT <json>`: per kind
the log history (training and evaluation), the checkpoint folders written, whether TRL's model card was written, or
the error. Run by tests/test_trl_preference.py once per base (the swap is process-wide).

Every kind evaluates (TRL's `prediction_step` / `evaluate` overrides and its eval metrics), saves twice, then
predicts on its eval set (the metrics are returned). `dpo` precomputes the reference log-probabilities (TRL's
`_precompute_ref_logps`: a DataLoader through `accelerator.prepare`); `kto` computes its KL term from mismatched
pairs (TRL's `_get_train_sampler` override, which defers to HF's on transformers >= 5.2); `reward` trains a
sequence-classification head with TRL's `center_rewards_coefficient`; `dpo_best` keeps the best checkpoint by TRL's
`rewards/margins` (`load_best_model_at_end`, `save_total_limit=1`); `kto_resumed` resumes `kto` from its
checkpoint-2 (run `kto` first).

Under torchrun (2 gloo processes: the test's 2-process variant) every process runs the kinds in turn (each from its own
copy of the policy, written before the process group exists) and the
global-zero one reports; a kind's error ends the run (the other process would otherwise wait in a collective that this
one never enters), and DPO computes its reference log-probabilities at each step (see `build`).
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

KINDS = ("dpo", "dpo_best", "kto", "kto_resumed", "reward")
DISTRIBUTED = int(os.environ.get("WORLD_SIZE", "1")) > 1
"""Under torchrun (tests/test_trl_preference.py's 2-process variant)."""

spec = json.loads(sys.argv[1])
if spec["base"] == "ours":
    import hf_lightning

    hf_lightning.use_as_transformers_trainer(lightning_kwargs={"logger": False})

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datasets import Dataset  # noqa: E402
from gen_helpers import EOS, PAD, VOCAB, WORDS, tiny_llama, word_tokenizer  # noqa: E402


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(n)]


def reverse(text: str) -> str:
    return " ".join(reversed(text.split()))


def noise(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(3))


def preference_rows(n: int, seed: int) -> Dataset:
    """Prompt, chosen (the prompt reversed), rejected (random words)."""
    rng = random.Random(seed + 100)
    rows = prompts(n, seed)
    return Dataset.from_dict({"prompt": rows, "chosen": [reverse(p) for p in rows],
                              "rejected": [noise(rng) for _ in rows]})


def unpaired_rows(n: int, seed: int) -> Dataset:
    """KTO's unpaired format: prompt, completion, label (desirable: the reversed prompt; undesirable: noise)."""
    rng = random.Random(seed + 100)
    rows = prompts(n, seed)
    return Dataset.from_dict({"prompt": rows,
                              "completion": [reverse(p) if i % 2 == 0 else noise(rng) for i, p in enumerate(rows)],
                              "label": [i % 2 == 0 for i in range(n)]})


def common_args(output_dir: str) -> dict:
    """Small, deterministic settings (bf16, TRL's default, off: CPU parity)."""
    return dict(
        output_dir=output_dir, max_steps=4, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1, save_steps=2, save_strategy="steps",
        eval_strategy="steps", eval_steps=2, seed=3, report_to="none", disable_tqdm=True, bf16=False, use_cpu=True,
        gradient_checkpointing=False, max_length=24, dataloader_num_workers=0,
    )


def save_policy() -> str:
    """The tiny Llama saved to a folder of this process's own: TRL builds the policy and its reference model from
    the path. Called before any process group exists: then `save_pretrained` writes on every process (with one, only
    on the main process, and the others would have to wait for it in a collective)."""
    folder = os.path.join(spec["root"], f"policy-{os.environ.get('RANK', '0')}")
    tiny_llama(seed=0).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def build(kind: str, output_dir: str):
    tokenizer = word_tokenizer()
    if kind == "dpo_best":
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**common_args(output_dir), load_best_model_at_end=True, save_total_limit=1,
                         metric_for_best_model="rewards/margins")
        return DPOTrainer(model=POLICY, args=args, train_dataset=preference_rows(24, 1),
                          eval_dataset=preference_rows(8, 2), processing_class=tokenizer)
    if kind == "dpo":
        from trl import DPOConfig, DPOTrainer

        # On 2 processes TRL's precompute fails on HF's Trainer itself (trl 1.16 `_precompute_ref_logps`): the
        # in-memory dataset has no cache folder, so `_get_cache_file_path` names a random file in a per-process
        # temporary folder; the main process writes its own, the other cannot find it (FileNotFoundError). There
        # the reference log-probabilities are computed at each step instead.
        args = DPOConfig(**common_args(output_dir), precompute_ref_log_probs=not DISTRIBUTED)
        return DPOTrainer(model=POLICY, args=args, train_dataset=preference_rows(24, 1),
                          eval_dataset=preference_rows(8, 2), processing_class=tokenizer)
    if kind in ("kto", "kto_resumed"):
        from trl import KTOConfig, KTOTrainer

        return KTOTrainer(model=POLICY, args=KTOConfig(**common_args(output_dir)),
                          train_dataset=unpaired_rows(24, 1), eval_dataset=unpaired_rows(8, 2),
                          processing_class=tokenizer)
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=PAD,
                         eos_token_id=EOS, num_labels=1)
    args = RewardConfig(**common_args(output_dir), center_rewards_coefficient=0.01)
    return RewardTrainer(model=LlamaForSequenceClassification(config), args=args,
                         train_dataset=preference_rows(24, 1), eval_dataset=preference_rows(8, 2),
                         processing_class=tokenizer)


def run(kind: str, output_dir: str) -> dict:
    trainer = build(kind, output_dir)
    if spec["base"] == "ours":
        import hf_lightning

        assert isinstance(trainer, hf_lightning.Trainer), type(trainer).__mro__
    else:
        assert type(trainer).__mro__[-2].__module__ == "transformers.trainer", type(trainer).__mro__
    resume = os.path.join(spec["root"], "kto", "checkpoint-2") if kind == "kto_resumed" else None
    trainer.train(resume_from_checkpoint=resume)
    out = Path(output_dir)
    return {"log": trainer.state.log_history, "predict": trainer.predict(trainer.eval_dataset).metrics,
            "checkpoints": sorted(p.name for p in out.glob("checkpoint-*")), "card": (out / "README.md").is_file()}


if __name__ == "__main__":
    POLICY = save_policy()
    results = {}
    for kind in spec["kinds"]:
        try:
            results[kind] = run(kind, os.path.join(spec["root"], kind))
        except Exception:  # one kind's failure does not hide the others'
            if DISTRIBUTED:  # ... but under torchrun the other process would wait for this one in a collective
                raise
            results[kind] = {"error": traceback.format_exc()[-4000:]}
    if os.environ.get("RANK", "0") == "0":  # under torchrun: the global-zero process reports
        print("RESULT " + json.dumps(results, default=float), flush=True)
