"""Which `transformers.Trainer` methods a `hf_lightning.Trainer` subclass may override, and the construction check.

Every method of `transformers.Trainer` / `Seq2SeqTrainer` (transformers 5.24; `tests/test_overrides.py` keeps the
tables complete against the installed class) is in exactly one table:

- `ROUTED`: the Lightning pieces call the trainer's method where HF's loop calls it, with HF's signature, so an
  override (pasted from a `transformers.Trainer` subclass) runs at HF's points and `super()` reaches the built-in;
- `CALLED_BY_USER`: neither HF's loop nor ours calls it; the user's code does, so an override is the user's own;
- `HUB_ONLY`: HF calls it only when the Hub is asked for (`push_to_hub=True`), which hf_lightning refuses (no Hub
  access): an override is accepted and, as in an HF run without the Hub, never called;
- `REFUSED`: HF internals with no counterpart in a Lightning run; overriding one raises at construction, with what
  to override instead.

`STRATEGY_REFUSED` adds the overrides a strategy cannot honour (DeepSpeed builds the optimizer / scheduler its
config defines and ignores the ones from `configure_optimizers`, so HF's `create_optimizer` / `create_scheduler`
overrides would be ignored, by HF too). `check_overrides` raises one error naming every refused override.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "CALLED_BY_USER", "HUB_ONLY", "METRIC_SOURCES", "REFUSED", "ROUTED", "check_overrides", "deepspeed_refusals",
    "overridden_methods", "refused_overrides",
]

ROUTED: dict[str, str] = {
    "compute_loss": "every micro-batch's loss (through training_step) and every evaluation batch's "
                    "(through prediction_step)",
    "training_step": "once per micro-batch of each update, doing its own backward (TransformerModule.training_step)",
    "prediction_step": "once per evaluation / prediction batch (TransformerModule.validation_step / predict_step)",
    "compute_loss_context_manager": "around compute_loss in training_step and prediction_step",
    "autocast_smart_context_manager": "by compute_loss_context_manager",
    "_prepare_inputs": "by training_step and prediction_step",
    "_prepare_input": "by _prepare_inputs",
    "_prepare_context_parallel_inputs": "by training_step and prediction_step",
    "_get_num_items_in_batch": "once per update (its window of micro-batches) and per evaluation batch",
    "_get_learning_rate": "after each optimizer step, for the logged learning_rate",
    "create_optimizer_and_scheduler": "once per train(), instead of create_optimizer + create_scheduler (HF 5's "
                                      "train() never calls it: README 'Subclassing the Trainer')",
    "create_optimizer": "once per train() (TransformerModule.configure_optimizers)",
    "create_scheduler": "once per train(), after create_optimizer",
    "get_decay_parameter_names": "by create_optimizer",
    "get_optimizer_cls_and_kwargs": "by create_optimizer",
    "get_train_dataloader": "once per train(); its batches are the micro-batches grouped into updates",
    "get_eval_dataloader": "once per evaluated dataset of every evaluation",
    "get_test_dataloader": "once per predict()",
    "_get_dataloader": "by get_train_dataloader / get_eval_dataloader / get_test_dataloader",
    "_get_train_sampler": "by get_train_dataloader",
    "_get_eval_sampler": "by get_eval_dataloader and get_test_dataloader",
    "num_examples": "for the training header and train_samples_per_second",
    "evaluation_loop": "by evaluate() and predict() when overridden (HF's bodies around it: so at every evaluation "
                       "during train() too); callable on any dataloader (trainer/eval_loop.py)",
    "evaluate": "for every evaluation during train() too (through _evaluate), as HF",
    "_evaluate": "at every evaluation during train()",
    "_maybe_log_save_evaluate": "after every update and at every epoch end",
    "log": "for every log entry: training loss, evaluation metrics, the train summary",
    "floating_point_ops": "once per micro-batch, for total_flos",
    "save_model": "for the model files of every checkpoint (with _internal_call=True, into the checkpoint folder "
                  "being written) and by the user",
    "_save": "by save_model (so for every checkpoint's model files too, into the temporary folder renamed once "
             "complete), on the global-zero process only, with the gathered full weights as state_dict under FSDP / "
             "ZeRO-3 (None otherwise); the built-in writes save_pretrained's files, the processing class and "
             "training_args.bin",
    "_load_from_checkpoint": "once per resumed train(), for the model weights, after the checkpoint folder is "
                             "verified (HF's call: one argument; under FSDP with the sharded model as `model`); not "
                             "under DeepSpeed, as HF (the engine's checkpoint)",
    "_load_optimizer_and_scheduler": "once per train(), with the resumed checkpoint folder (None for a fresh run), "
                                     "after the optimizer, scheduler and scaler states are restored from it (so the "
                                     "built-in does nothing more); TRL's GRPO / RLOO read their own files there",
    "_load_best_model": "at the end of train() with load_best_model_at_end, after the train summary is logged and the "
                        "best checkpoint's files are verified",
    "call_model_init": "by train() when a model_init is given",
    "_save_checkpoint": "at every checkpoint save during train(), with HF's (model, trial), after the update's "
                        "evaluation and before on_save; the base writes the checkpoint (crash-safe, with its manifest)",
    "_set_signature_columns_if_needed": "when the first loader is built, before `_signature_columns` is read for "
                                        "remove_unused_columns",
}
"""HF methods the Lightning pieces call through the trainer, and where."""

METRIC_SOURCES = frozenset({"evaluate", "_evaluate", "_maybe_log_save_evaluate"})
"""Overrides that may produce metrics of their own during training: with one of them, a `metric_for_best_model` the
built-in evaluation cannot produce is not refused at construction (the override may add it; as in HF, a missing key
then raises at the first evaluation)."""

CALLED_BY_USER: dict[str, str] = {
    name: "called by your code only; HF's loop and ours never call it"
    for name in (
        "train", "predict", "end", "add_callback", "pop_callback", "remove_callback", "is_local_process_zero",
        "is_world_process_zero", "log_metrics", "metrics_format", "save_metrics", "save_state", "create_model_card",
        "hyperparameter_search", "push_to_hub", "get_learning_rates", "get_num_trainable_parameters",
        "get_optimizer_group",
    )
}
"""HF methods that only user code calls: an override changes nothing but the user's own calls."""

HUB_ONLY: dict[str, str] = {
    "_push_from_checkpoint": "HF calls it after a checkpoint save only with push_to_hub=True, which hf_lightning "
                             "refuses (no Hub access): never called, as in an HF run without the Hub",
}
"""HF methods HF calls only when the Hub is asked for: an override is accepted (sentence-transformers has one)."""

_LOOP = ("HF's own training loop; hf_lightning runs Lightning's fit loop (one Lightning batch per update). Override "
         "training_step, compute_loss or get_train_dataloader, or use a TrainerCallback")
_WRAP = ("model wrapping and placement belong to the Lightning strategy; pass `lightning_kwargs` (strategy, devices, "
         "precision)")
_SAVE = ("checkpoints are written by HFTrainerFlow's CheckpointSaver; override save_model or _save (called for "
         "each checkpoint's model files) or use TrainerCallback.on_save")
_LOAD = ("resume and best-model loading are checkpoint/restore.py and checkpoint/best.py; override "
         "_load_from_checkpoint (the model weights at resume) or _load_best_model (load_best_model_at_end) instead")
_COLUMNS = ("column removal is TransformerDataModule's; set remove_unused_columns=False and drop columns in your "
            "collator or get_train_dataloader")
_PARALLEL = "tensor, context and sequence parallelism are not supported; hf_lightning's built-ins never call it"
_HP = "internal to HF's hyperparameter_search"

REFUSED: dict[str, str] = {
    "_validate_args": "HF's argument checks; hf_lightning validates its arguments itself (args/validation.py)",
    "_build_accelerator_args": "there is no accelerate Accelerator: " + _WRAP,
    "create_accelerator_and_postprocess": "there is no accelerate Accelerator: " + _WRAP,
    "_inner_training_loop": _LOOP,
    "_init_training_state": _LOOP,
    "_prepare_for_training": _LOOP,
    "_run_epoch": _LOOP,
    "_finalize_training": _LOOP,
    "set_initial_training_values": _LOOP,
    "get_batch_samples": "each update's micro-batches are one Lightning batch (TransformerDataModule); override "
                         "_get_num_items_in_batch for the token count, get_train_dataloader for the micro-batches",
    "get_total_train_batch_size": "the step budget is computed by hf_lightning.plan from the arguments",
    "_update_auto_batch_size": "auto_find_batch_size is handled by the arguments' translation, not by this method",
    "_track_num_input_tokens": "include_num_input_tokens_seen is counted by hf_lightning itself",
    "_defer_fsdp_gradient_reduction": _WRAP,
    "_sync_replicated_trainable_parameters": _WRAP,
    "_wrap_model": _WRAP,
    "_move_model_to_device": _WRAP,
    "_mixed_mesh_grad_norm": "gradient clipping is TransformerModule.on_before_optimizer_step (max_grad_norm)",
    "_has_mixed_mesh_grads": "gradient clipping is TransformerModule.on_before_optimizer_step (max_grad_norm)",
    "_clip_grad_norm": "gradient clipping is TransformerModule.on_before_optimizer_step (max_grad_norm)",
    "_get_grad_norm": "gradient clipping is TransformerModule.on_before_optimizer_step (max_grad_norm)",
    "_determine_best_metric": "best-model tracking is checkpoint/best.py; set metric_for_best_model and "
                              "greater_is_better",
    "store_flos": "total_flos is stored by HFTrainerFlow; override floating_point_ops to count differently",
    "_get_output_dir": _SAVE,
    "_save_rng_state": _SAVE,
    "_save_optimizer_and_scheduler": _SAVE,
    "_save_scaler": _SAVE,
    "_load_rng_state": _LOAD,
    "_load_scaler": _LOAD,
    "_load_callback_state": _LOAD,
    "_issue_warnings_after_load": _LOAD,
    "_remove_unused_columns": _COLUMNS,
    "_get_collator_with_removed_columns": _COLUMNS,
    "get_sp_size": _PARALLEL,
    "get_cp_size": _PARALLEL,
    "get_tp_size": _PARALLEL,
    "init_hf_repo": "there is no Hugging Face Hub access (push_to_hub is refused)",
    "_finish_current_push": "there is no Hugging Face Hub access (push_to_hub is refused)",
    "_hp_search_setup": _HP,
    "_report_to_hp_search": _HP,
    "_tune_save_checkpoint": _HP,
    # Seq2SeqTrainer
    "load_generation_config": "Seq2SeqTrainingArguments.generation_config is loaded by seq2seq/gen_kwargs.py",
    "_pad_tensors_to_max_len": "generated ids are padded by hf_lightning's prediction_step (seq2seq/prompts.py); "
                               "override prediction_step",
}
"""HF methods whose override cannot be honoured (HF internals without a counterpart), with what to do instead."""

_DEEPSPEED_OPTIMIZER = ("the DeepSpeed config defines an `optimizer`: DeepSpeed builds it and ignores the one from "
                        "configure_optimizers (HF ignores this override too). Remove `optimizer` from the DeepSpeed "
                        "config to use the override")
_DEEPSPEED_SCHEDULER = ("the DeepSpeed config defines a `scheduler`: DeepSpeed builds it and ignores the one from "
                        "configure_optimizers (HF ignores this override too). Remove `scheduler` from the DeepSpeed "
                        "config to use the override")


def deepspeed_refusals(config: Mapping[str, object] | None) -> dict[str, str]:
    """The overrides a DeepSpeed run with this config cannot honour (none without a config)."""
    refused: dict[str, str] = {}
    if not config:
        return refused
    if "optimizer" in config:
        for name in ("create_optimizer", "get_decay_parameter_names", "get_optimizer_cls_and_kwargs",
                     "create_optimizer_and_scheduler"):
            refused[name] = _DEEPSPEED_OPTIMIZER
    if "scheduler" in config:
        for name in ("create_scheduler", "create_optimizer_and_scheduler"):
            refused.setdefault(name, _DEEPSPEED_SCHEDULER)
    return refused


def overridden_methods(cls: type, own_packages: tuple[str, ...] = ("hf_lightning",)) -> list[str]:
    """Names defined by the user's classes in `cls`'s MRO (every class outside `own_packages` and `object`)."""
    names: dict[str, None] = {}
    for klass in cls.__mro__:
        if klass is object or klass.__module__.split(".")[0] in own_packages:
            continue
        for name in vars(klass):
            if not (name.startswith("__") and name.endswith("__")):
                names.setdefault(name)
    return list(names)


def refused_overrides(names: Iterable[str], strategy_refusals: Mapping[str, str] | None = None) -> dict[str, str]:
    """The names among `names` that cannot be honoured, with why (the strategy's reason wins)."""
    strategy_refusals = strategy_refusals or {}
    return {name: strategy_refusals.get(name, REFUSED.get(name, "")) for name in names
            if name in REFUSED or name in strategy_refusals}


def check_overrides(cls: type, strategy_refusals: Mapping[str, str] | None = None) -> None:
    """Raise one error naming every override of `cls` that hf_lightning cannot honour.

    Raises:
        TypeError: an override of a `REFUSED` method, or one the strategy cannot honour (each named, with why).
    """
    refused = refused_overrides(overridden_methods(cls), strategy_refusals)
    if refused:
        lines = "\n".join(f"  - {name}: {why}." for name, why in refused.items())
        raise TypeError(
            f"{cls.__name__} overrides transformers.Trainer method(s) that hf_lightning cannot honour (nothing is "
            f"silently ignored):\n{lines}\nSee README 'Subclassing the Trainer' for the methods that are honoured."
        )
