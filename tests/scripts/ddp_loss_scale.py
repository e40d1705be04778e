"""Train a tiny BERT classifier (its `forward` takes `**kwargs` but ignores `num_items_in_batch`) with either trainer,
then write `log_history.json` and the final weights (`final/model.safetensors`) under OUT_DIR (rank 0).

Run by tests/test_ddp_loss_scale.py under `torchrun --nproc_per_node 2` (one launch per trainer), and imported by it
for the single-process oracle with the same global batch.
Usage: python ddp_loss_scale.py {hf,ours} OUT_DIR PER_DEVICE_BATCH
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from helpers import classification_dataset, tiny_bert  # noqa: E402

# plain SGD without clipping: a gradient twice too large gives a visibly different update (AdamW is almost
# scale-invariant, and clipping would hide the factor whenever both norms are clipped)
SETTINGS = dict(learning_rate=0.05, optim="sgd", max_grad_norm=0.0, max_steps=4, logging_steps=1, seed=11,
                save_strategy="no", report_to="none", disable_tqdm=True, dataloader_drop_last=True)


def train(side: str, out_dir: str, per_device_batch: int) -> None:
    """One run of `side` ("hf": `transformers.Trainer`, "ours": `hf_lightning.Trainer`) on this process group."""
    if side == "hf":
        import transformers as lib

        extra = {"use_cpu": True, "ddp_backend": "gloo"} if int(os.environ.get("WORLD_SIZE", "1")) > 1 else {
            "use_cpu": True}
        kwargs = {}
    else:
        import hf_lightning as lib

        extra = {"ddp_backend": "gloo"} if int(os.environ.get("WORLD_SIZE", "1")) > 1 else {}
        kwargs = {"lightning_kwargs": {"accelerator": "cpu", "logger": False, "enable_model_summary": False}}
    args = lib.TrainingArguments(output_dir=out_dir, per_device_train_batch_size=per_device_batch, **SETTINGS,
                                 **extra)
    trainer = lib.Trainer(model=tiny_bert(seed=4), args=args, train_dataset=classification_dataset(64, seed=2),
                          **kwargs)
    trainer.train()
    trainer.save_model(os.path.join(out_dir, "final"))
    if trainer.is_world_process_zero():
        with open(os.path.join(out_dir, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f)


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2], int(sys.argv[3]))
