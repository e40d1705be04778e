"""What a `Trainer` run tells an HF user, against what `transformers.Trainer` tells for the same run: the records of
HF's `transformers.trainer` logger (training header, evaluation headers, checkpoint saves, "Training completed",
"Loading best model", the final cleanup; on resume "Loading model from" and the resume lines) and the log dicts
printed to stdout (`PrinterCallback`) or above HF's progress bar (`ProgressCallback`), the same lines with the paths
and the timings (which legitimately differ) masked."""

from __future__ import annotations

import contextlib
import io
import logging
import re

import transformers

import hf_lightning
from helpers import classification_dataset, tiny_bert

ARGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2,
            eval_strategy="steps", eval_steps=3, save_steps=3, save_total_limit=1, load_best_model_at_end=True,
            log_level="info", report_to="none", seed=4)
TIMING_KEYS = ("runtime", "per_second")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "transformers.trainer":
            self.lines.append(record.getMessage())


def mask(text: str, folder: str) -> str:
    text = text.replace(folder, "<out>") if folder else text
    timing = "|".join(TIMING_KEYS)
    text = re.sub(rf"'(\w*(?:{timing})\w*)': '[^']*'", r"'\1': <t>", text)
    return re.sub(r"\(score: [0-9.e-]+\)", "(score: <s>)", text)


def run(trainer_cls, args_cls, folder, resume=None, epochs=2, **extra):
    records = Records()
    logging.getLogger("transformers").addHandler(records)
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        args = args_cls(output_dir=folder, **{**ARGS, "num_train_epochs": epochs, **extra.pop("args", {})})
        model = tiny_bert()
        model.accepts_loss_kwargs = False  # HF's BERT loss would be GA times too large (README "Differences")
        trainer = trainer_cls(model=model, args=args, train_dataset=classification_dataset(n=24),
                              eval_dataset=classification_dataset(n=8, seed=1), **extra)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            trainer.train(resume_from_checkpoint=resume)
    finally:
        logging.getLogger("transformers").removeHandler(records)
        transformers.logging.set_verbosity_warning()
    return [mask(line, folder) for line in records.lines], mask(stdout.getvalue(), folder), stderr.getvalue()


def hf_run(folder, **kwargs):
    return run(transformers.Trainer, transformers.TrainingArguments, folder,
               args={"use_cpu": True, "disable_tqdm": kwargs.pop("disable_tqdm", True), **kwargs.pop("args", {})},
               **kwargs)


def our_run(folder, **kwargs):
    return run(hf_lightning.Trainer, hf_lightning.TrainingArguments, folder,
               args={"disable_tqdm": kwargs.pop("disable_tqdm", True), **kwargs.pop("args", {})},
               lightning_kwargs={"accelerator": "cpu", "logger": False}, **kwargs)


def test_training_resume_and_best_model_messages_are_hfs(tmp_path):
    hf_lines, hf_out, _ = hf_run(str(tmp_path / "hf"))
    our_lines, our_out, _ = our_run(str(tmp_path / "ours"))
    assert our_lines == hf_lines
    assert our_lines[:9] == [
        "***** Running training *****", "  Num examples = 24", "  Num Epochs = 2", "  Num update steps per epoch = 3",
        "  Instantaneous batch size per device = 4",
        "  Total train batch size (w. parallel, distributed & accumulation) = 8", "  Gradient Accumulation steps = 2",
        "  Total optimization steps = 6", "  Number of trainable parameters = 22,434",
    ]
    assert "Loading best model from <out>/checkpoint-3 (score: <s>)." in our_lines
    assert "Deleting older checkpoint [<out>/checkpoint-6] due to args.save_total_limit" in our_lines
    assert our_out == hf_out  # the log dicts, as HF's PrinterCallback prints them
    assert our_out.count("{'loss': ") == 3 and our_out.count("{'eval_loss': ") == 2

    # resuming the run for a third epoch from its kept checkpoint
    hf_lines, hf_out, _ = hf_run(str(tmp_path / "hf"), resume=str(tmp_path / "hf" / "checkpoint-3"), epochs=3)
    our_lines, our_out, _ = our_run(str(tmp_path / "ours"), resume=str(tmp_path / "ours" / "checkpoint-3"), epochs=3)
    assert our_lines == hf_lines
    assert our_lines[0] == "Loading model from <out>/checkpoint-3."
    assert our_lines[10:12] == [
        "  Resuming training from checkpoint with epoch 1 and global step 3",
        "  Fast-forwarding the dataloader past 1 epochs and 0 batches to resume from the exact training state.",
    ]
    assert our_out == hf_out


def test_max_steps_with_epochs_logs_hfs_override_line(tmp_path):
    """`max_steps` with `num_train_epochs` (HF's default 3 included): HF says at construction which one wins."""
    hf_lines, _, _ = hf_run(str(tmp_path / "hf"), args={"max_steps": 2, "save_strategy": "no", "eval_strategy": "no",
                                                       "load_best_model_at_end": False})
    our_lines, _, _ = our_run(str(tmp_path / "ours"), args={"max_steps": 2, "save_strategy": "no",
                                                            "eval_strategy": "no", "load_best_model_at_end": False})
    assert our_lines == hf_lines
    assert our_lines[0] == "max_steps is given, it will override any value given in num_train_epochs"


def test_progress_bar_over_the_updates_with_the_log_dicts_above_it(tmp_path):
    """`disable_tqdm=False`: HF's progress bar counts the updates (no Lightning bar, no `v_num`), and each log dict is
    written above it."""
    _, hf_out, hf_err = hf_run(str(tmp_path / "hf"), disable_tqdm=False)
    _, our_out, our_err = our_run(str(tmp_path / "ours"), disable_tqdm=False)
    assert "6/6" in hf_err and "6/6" in our_err
    assert "v_num" not in our_err + our_out and "Epoch 0" not in our_err  # Lightning's bar is off
    written = [line for line in (our_err + our_out).splitlines() if line.startswith("{'")]
    hf_written = [line for line in (hf_err + hf_out).splitlines() if line.startswith("{'")]
    assert [mask(line, "") for line in written] == [mask(line, "") for line in hf_written]


def test_a_pretrained_model_in_eval_mode_trains_without_lightnings_eval_mode_warning(tmp_path, recwarn):
    """`from_pretrained` returns a model in eval mode; hf_lightning switches it to train mode before Lightning checks
    (HF trains with dropout on), so Lightning's "modules in eval mode" warning does not mislead."""
    model = tiny_bert()
    model.save_pretrained(tmp_path / "pretrained")
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "pretrained")
    assert not loaded.training
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1, report_to="none",
                                          save_strategy="no", disable_tqdm=True)
    with contextlib.redirect_stdout(io.StringIO()):
        hf_lightning.Trainer(model=loaded, args=args, train_dataset=classification_dataset(n=8),
                             lightning_kwargs={"accelerator": "cpu", "logger": False}).train()
    assert not [w for w in recwarn if "eval mode" in str(w.message)]
