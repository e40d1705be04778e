"""End-to-end cadence parity: `hf_lightning.Trainer` against the real `transformers.Trainer` (the oracle).

Both trainers get the same tiny BERT weights, data, seed and arguments. Their `state.log_history` must hold the same
entries at the same steps, with the same keys in the same order, and the same values (1e-5) for the loss, learning
rate, grad norm, epoch, eval loss, train loss and FLOPs (runtime and throughput keys are excluded). Checkpoint folder
names must match too.

The HF side runs with `model_accepts_loss_kwargs = False`: a BERT classifier in transformers 5 takes `**kwargs` but
ignores `num_items_in_batch`, so HF would log GA-times too large losses (a deliberate difference, see README); without
the flag HF divides by the real window length, which is what we compute for equal-sized micro-batches.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch
import transformers

import hf_lightning
from helpers import classification_dataset, tiny_bert

SKIPPED_SUFFIXES = ("_runtime", "_per_second")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs single-threaded (see conftest.one_thread)."""


def _eval_data(eval_dataset: Any) -> Any:
    return classification_dataset(16, seed=1) if eval_dataset == "default" else eval_dataset


def _train_data(n: int, iterable: bool) -> Any:
    data = classification_dataset(n)
    return data.to_iterable_dataset() if iterable else data


def _args(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"use_cpu": True, "disable_tqdm": True, "report_to": "none", "learning_rate": 1e-3,
            "per_device_train_batch_size": 4, **kwargs}


def run_hf(tmp_path, n: int = 36, eval_dataset: Any = "default", callbacks=(), trainer_class=None, iterable=False,
           **kwargs):
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), **_args(kwargs))
    trainer_class = trainer_class or transformers.Trainer
    trainer = trainer_class(
        model=tiny_bert(), args=args, train_dataset=_train_data(n, iterable),
        eval_dataset=_eval_data(eval_dataset), callbacks=list(callbacks),
    )
    trainer.model_accepts_loss_kwargs = False
    trainer.train()
    return trainer


def run_ours(tmp_path, n: int = 36, eval_dataset: Any = "default", callbacks=(), trainer_class=None, iterable=False,
             **kwargs):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "ours"), **_args(kwargs))
    trainer_class = trainer_class or hf_lightning.Trainer
    trainer = trainer_class(
        model=tiny_bert(), args=args, train_dataset=_train_data(n, iterable),
        eval_dataset=_eval_data(eval_dataset), callbacks=list(callbacks),
    )
    trainer.train()
    return trainer


def assert_same_history(hf_history: list[dict], our_history: list[dict]) -> None:
    """Same entries, steps, keys (in order) and values; runtime / throughput values are not compared."""
    assert [e["step"] for e in our_history] == [e["step"] for e in hf_history]
    for hf_entry, our_entry in zip(hf_history, our_history):
        assert list(our_entry) == list(hf_entry), (our_entry, hf_entry)
        for key, expected in hf_entry.items():
            if key.endswith(SKIPPED_SUFFIXES):
                continue
            if isinstance(expected, float) and math.isnan(expected):
                assert math.isnan(our_entry[key]), (key, our_entry)
            else:
                assert our_entry[key] == pytest.approx(expected, rel=1e-5, abs=1e-7), (key, hf_entry["step"])


def checkpoint_names(folder) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.startswith("checkpoint-")) if os.path.isdir(folder) else []


def assert_parity(tmp_path, **kwargs) -> tuple[Any, Any]:
    hf_trainer, our_trainer = run_hf(tmp_path, **kwargs), run_ours(tmp_path, **kwargs)
    assert_same_history(hf_trainer.state.log_history, our_trainer.state.log_history)
    assert checkpoint_names(tmp_path / "ours") == checkpoint_names(tmp_path / "hf")
    return hf_trainer, our_trainer


# ----- cadence cells -----
def test_short_last_window_fractional_epochs_forced_final_eval_and_save(tmp_path):
    """9 micro-batches per epoch with GA=2 (a 1-batch last window), 2.5 epochs (13 updates, stops mid-epoch):
    logs every 2, evaluates every 3, saves every 4, plus the forced evaluation and save at step 13 and no final log."""
    hf_trainer, ours = assert_parity(
        tmp_path, gradient_accumulation_steps=2, num_train_epochs=2.5, logging_steps=2, eval_strategy="steps",
        eval_steps=3, save_strategy="steps", save_steps=4,
    )
    assert checkpoint_names(tmp_path / "ours") == ["checkpoint-12", "checkpoint-13", "checkpoint-4", "checkpoint-8"]
    assert ours.state.log_history[-1]["total_flos"] > 0
    assert [e["step"] for e in ours.state.log_history if "eval_loss" in e] == [3, 6, 9, 12, 13]


def test_max_steps_first_step_eval_delay_eval_on_start_warmup(tmp_path):
    """max_steps wins over epochs; logging_first_step; eval_delay skips early evaluations; eval_on_start logs at 0."""
    _, ours = assert_parity(
        tmp_path, max_steps=7, num_train_epochs=1, logging_first_step=True, logging_steps=3, eval_strategy="steps",
        eval_steps=2, eval_delay=4, eval_on_start=True, warmup_steps=2, max_grad_norm=0.0, save_strategy="no",
    )
    history = ours.state.log_history
    assert [e["step"] for e in history if "eval_loss" in e] == [0, 4, 6, 7]
    assert history[1]["learning_rate"] == 0.0  # warmup: the first update used lambda(0) = 0


def test_epoch_strategies_ga3_partial_last_epoch(tmp_path):
    """10 micro-batches per epoch with GA=3 (windows 3, 3, 3, 1), 1.5 epochs: epoch-end log / eval / save, including
    the partial last epoch."""
    assert_parity(
        tmp_path, n=40, gradient_accumulation_steps=3, num_train_epochs=1.5, logging_strategy="epoch",
        eval_strategy="epoch", save_strategy="epoch",
    )
    assert checkpoint_names(tmp_path / "ours") == ["checkpoint-4", "checkpoint-6"]


def test_fractional_intervals_and_best_strategy(tmp_path):
    """Float intervals resolved against max_steps; `save_strategy="best"` saves only on a new best eval_loss."""
    assert_parity(
        tmp_path, n=48, num_train_epochs=2, logging_steps=0.1, eval_strategy="steps", eval_steps=0.25,
        save_strategy="best", metric_for_best_model="loss",
    )


@pytest.mark.parametrize("limit", [1, 2])
def test_best_model_tracking_and_rotation(tmp_path, limit):
    """Best metric at every evaluation, the best pointer at save time, rotation keeping the best, the
    `save_total_limit=1` end-of-training cleanup, and the best model loaded at the end."""
    hf_trainer, ours = assert_parity(
        tmp_path, n=32, num_train_epochs=2, logging_steps=2, eval_strategy="steps", eval_steps=2, save_steps=2,
        save_total_limit=limit, load_best_model_at_end=True, metric_for_best_model="loss",
    )
    assert hf_trainer.state.best_model_checkpoint is not None
    best = os.path.basename(hf_trainer.state.best_model_checkpoint)
    assert os.path.basename(ours.state.best_model_checkpoint) == best == "checkpoint-2"
    assert checkpoint_names(tmp_path / "ours") == (["checkpoint-2"] if limit == 1 else ["checkpoint-16", best])
    assert ours.state.best_metric == pytest.approx(hf_trainer.state.best_metric, rel=1e-6)
    for name, tensor in hf_trainer.model.state_dict().items():
        torch.testing.assert_close(ours.model.state_dict()[name], tensor, rtol=1e-4, atol=1e-5)


def test_eval_dataset_dict_logs_one_entry_per_dataset(tmp_path):
    eval_sets = {"alpha": classification_dataset(8, seed=2), "beta": classification_dataset(12, seed=3)}
    _, ours = assert_parity(
        tmp_path, n=16, eval_dataset=eval_sets, max_steps=4, logging_steps=2, eval_strategy="steps", eval_steps=2,
        save_strategy="no",
    )
    eval_entries = [e for e in ours.state.log_history if "step" in e and any(k.startswith("eval_") for k in e)]
    assert [next(iter(e)) for e in eval_entries] == ["eval_alpha_loss", "eval_beta_loss"] * 2


def test_unsized_train_data_epochs_are_passes(tmp_path):
    """An IterableDataset (5 batches per pass) with max_steps=12: `epoch` counts passes plus (batch+1)/(max_steps*GA)
    ([probe2]), and the epoch-end pass runs at the end of every pass."""
    _, ours = assert_parity(tmp_path, n=20, iterable=True, max_steps=12, logging_strategy="epoch",
                            eval_strategy="steps", eval_steps=5, save_strategy="no")
    epochs = [e["epoch"] for e in ours.state.log_history if "loss" in e]
    assert epochs == pytest.approx([5 / 12, 1 + 5 / 12, 2 + 2 / 12])


def test_hand_built_lightning_trainer_gets_the_same_history(tmp_path):
    """The Lightning-native path (flow callback + module + datamodule in a plain `lightning.Trainer`, with its default
    sanity check and epoch-end validation left on) logs exactly what the facade logs."""
    import lightning.pytorch as pl

    kwargs = dict(gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2, eval_strategy="steps",
                  eval_steps=3, save_strategy="no")
    facade = run_ours(tmp_path, **kwargs)
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path / "native"), use_cpu=True, report_to="none", learning_rate=1e-3,
        per_device_train_batch_size=4, **kwargs,
    )
    datamodule = hf_lightning.TransformerDataModule(
        train_dataset=classification_dataset(36), eval_dataset=classification_dataset(16, seed=1), args=args
    )
    flow = hf_lightning.HFTrainerFlow(args)
    trainer = pl.Trainer(callbacks=[flow], accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, use_distributed_sampler=False, default_root_dir=str(tmp_path))
    transformers.set_seed(args.seed)
    trainer.fit(hf_lightning.TransformerModule(tiny_bert(), args), datamodule=datamodule)
    assert_same_history(facade.state.log_history, flow.state.log_history)


# ----- progress bar -----
def test_progress_bar_shows_logged_loss_and_evaluation_progress(tmp_path):
    """The train bar counts updates and shows the last logged `loss`; every evaluation opens Lightning's val bar."""
    from lightning.pytorch.callbacks import TQDMProgressBar

    class CountingBar(TQDMProgressBar):
        def __init__(self) -> None:
            super().__init__()
            self.val_bars = 0

        def init_validation_tqdm(self):
            self.val_bars += 1
            return super().init_validation_tqdm()

    bar = CountingBar()
    args = hf_lightning.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, disable_tqdm=False, report_to="none", per_device_train_batch_size=4,
        gradient_accumulation_steps=2, max_steps=7, logging_steps=2, eval_strategy="steps", eval_steps=3,
        eval_on_start=True, save_strategy="no",
    )
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(36),
                                   eval_dataset=classification_dataset(16, seed=1), callbacks=[bar])
    trainer.train()
    lightning_trainer = trainer.lightning_trainer
    assert lightning_trainer.progress_bar_callback is bar
    assert bar.train_progress_bar.total == 5  # 9 micro-batches with GA=2: 5 updates per epoch
    last_loss = [e["loss"] for e in trainer.state.log_history if "loss" in e][-1]
    assert lightning_trainer.progress_bar_metrics["loss"] == pytest.approx(last_loss)
    assert bar.val_bars == 4  # eval_on_start, steps 3 and 6, and the final one at 7


# ----- logging_nan_inf_filter -----
class _NanOnCall:
    """Makes the loss value of chosen training micro-batches NaN (the gradient stays finite)."""

    nan_calls = (2, 5)

    def nan_after(self, loss: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        if model.training:
            self.train_calls = getattr(self, "train_calls", 0) + 1
            if self.train_calls in self.nan_calls:
                return loss + torch.tensor(float("nan"))
        return loss


class NanHFTrainer(_NanOnCall, transformers.Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return self.nan_after(loss, model)


class NanModule(_NanOnCall, hf_lightning.TransformerModule):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return self.nan_after(loss, model) if not return_outputs else loss


class NanTrainer(hf_lightning.Trainer):
    module_class = NanModule


@pytest.mark.parametrize("nan_filter", [True, False])
def test_logging_nan_inf_filter(tmp_path, nan_filter):
    """A non-finite step loss is replaced by the running mean of the window (or kept when the filter is off)."""
    kwargs = dict(n=32, max_steps=8, logging_steps=3, save_strategy="no", eval_dataset=None,
                  logging_nan_inf_filter=nan_filter)
    hf_trainer = run_hf(tmp_path, trainer_class=NanHFTrainer, **kwargs)
    ours = run_ours(tmp_path, trainer_class=NanTrainer, **kwargs)
    assert_same_history(hf_trainer.state.log_history, ours.state.log_history)
    losses = [e["loss"] for e in ours.state.log_history if "loss" in e]
    assert all(math.isfinite(v) for v in losses) == nan_filter


def test_logging_nan_inf_filter_per_micro_batch_with_accumulation(tmp_path):
    """HF filters each micro-batch loss of a window, not the window's sum: same history with GA=2."""
    kwargs = dict(n=32, max_steps=4, logging_steps=2, save_strategy="no", eval_dataset=None,
                  gradient_accumulation_steps=2)
    hf_trainer = run_hf(tmp_path, trainer_class=NanHFTrainer, **kwargs)
    ours = run_ours(tmp_path, trainer_class=NanTrainer, **kwargs)
    assert_same_history(hf_trainer.state.log_history, ours.state.log_history)


# ----- TrainerControl set by HF callbacks -----
class ScriptedControl(transformers.TrainerCallback):
    """Raises control flags at given steps from `on_step_end` (and optionally `on_epoch_end`)."""

    def __init__(self, at_step: dict[int, tuple[str, ...]], at_epoch_end: tuple[str, ...] = ()) -> None:
        self.at_step, self.at_epoch_end = at_step, at_epoch_end

    def on_step_end(self, args, state, control, **kwargs):
        for flag in self.at_step.get(state.global_step, ()):
            setattr(control, flag, True)

    def on_epoch_end(self, args, state, control, **kwargs):
        for flag in self.at_epoch_end:
            setattr(control, flag, True)


def test_control_flags_set_by_callbacks_are_honoured(tmp_path):
    """Log / evaluate / save at arbitrary steps, an epoch cut short, then a stop request: same history, same folders.

    With `eval_strategy="epoch"`, the callback's evaluation at the last step of an epoch runs twice there (step pass
    and epoch pass), as in HF.
    """
    script = {2: ("should_evaluate",), 3: ("should_save", "should_log"), 4: ("should_epoch_stop",),
              7: ("should_log", "should_evaluate"), 9: ("should_training_stop", "should_evaluate")}
    _, ours = assert_parity(
        tmp_path, n=40, gradient_accumulation_steps=2, num_train_epochs=4, logging_strategy="no",
        eval_strategy="epoch", save_strategy="no", callbacks=[ScriptedControl(script)],
    )
    assert ours.state.global_step == 9
    assert checkpoint_names(tmp_path / "ours") == ["checkpoint-3"]


def test_stop_requested_from_on_epoch_end(tmp_path):
    _, ours = assert_parity(
        tmp_path, n=16, num_train_epochs=5, logging_steps=1, save_strategy="no", eval_dataset=None,
        callbacks=[ScriptedControl({}, at_epoch_end=("should_training_stop",))],
    )
    assert ours.state.global_step == 4


# ----- invalid combinations -----
def test_eval_strategy_steps_without_eval_dataset_raises(tmp_path):
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path), eval_strategy="steps", eval_steps=2)
    with pytest.raises(ValueError, match="eval_strategy"):
        hf_lightning.Trainer(model=tiny_bert(), args=args, train_dataset=classification_dataset(8))


def test_logging_steps_zero_raises():
    with pytest.raises(ValueError, match="logging_steps"):
        hf_lightning.TrainingArguments(logging_steps=0)


@pytest.mark.parametrize("name", ["logging_steps", "eval_steps", "save_steps"])
def test_fractional_step_value_above_one_raises(name):
    strategy = {"logging_steps": "logging_strategy", "eval_steps": "eval_strategy", "save_steps": "save_strategy"}
    with pytest.raises(ValueError, match=f"{name} must be an integer if bigger than 1: 2.5"):
        hf_lightning.TrainingArguments(**{name: 2.5, strategy[name]: "steps"})
