"""`TrainingArguments` validation, HF defaults, conversion from `transformers.TrainingArguments`, and the facade's
argument checks. HF's own `TrainingArguments` / `Trainer` are the oracle for messages and derived values."""

from __future__ import annotations

import pytest
import transformers
from helpers import classification_dataset, tiny_bert

import hf_lightning
from hf_lightning.args.from_transformers import from_hf_training_arguments
from hf_lightning.args.to_lightning import OWNED_BY_HF_ARGS, lightning_trainer_kwargs

TrainingArguments = hf_lightning.TrainingArguments


def hf_error(**kwargs) -> str:
    with pytest.raises(ValueError) as info:
        transformers.TrainingArguments(output_dir="unused_hf_output", **kwargs)
    return str(info.value)


def our_error(**kwargs) -> str:
    with pytest.raises(ValueError) as info:
        TrainingArguments(**kwargs)
    return str(info.value)


# ----- HF's messages, word for word -----
@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param(dict(logging_steps=0), id="logging_steps=0"),
        pytest.param(dict(logging_steps=2.5), id="fractional-logging_steps"),
        pytest.param(dict(eval_strategy="steps", eval_steps=2.5), id="fractional-eval_steps"),
        pytest.param(dict(save_steps=7.5), id="fractional-save_steps"),
        pytest.param(
            dict(eval_strategy="steps", logging_strategy="no", logging_steps=0), id="eval-steps-without-interval"
        ),
        pytest.param(
            dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=3, save_steps=5),
            id="not-round-multiple",
        ),
        pytest.param(
            dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=0.25),
            id="ratio-not-multiple",
        ),
        pytest.param(
            dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=5), id="ratio-mixed"
        ),
        pytest.param(dict(warmup_steps=-1), id="negative-warmup"),
        pytest.param(dict(lr_scheduler_type="reduce_lr_on_plateau"), id="plateau-without-eval"),
    ],
)
def test_validation_messages_are_hfs(kwargs):
    expected = hf_error(**kwargs)
    message = our_error(**kwargs)
    assert expected.strip() in message


def test_strategy_mismatch_with_load_best_model_names_both_strategies():
    kwargs = dict(load_best_model_at_end=True, eval_strategy="steps", save_strategy="epoch")
    hf_first_line = hf_error(**kwargs).splitlines()[0]
    message = our_error(**kwargs)
    assert hf_first_line in message
    assert "Evaluation strategy: steps" in message and "Save strategy: epoch" in message


def test_save_strategy_best_needs_a_metric():
    message = our_error(save_strategy="best")
    assert "`args.metric_for_best_model` must be provided when using 'best' save_strategy" in message
    # HF reports the same text, from Trainer.__init__
    args = transformers.TrainingArguments(output_dir="unused_hf_output", save_strategy="best", report_to="none")
    with pytest.raises(ValueError, match="metric_for_best_model` must be provided"):
        transformers.Trainer(model=tiny_bert(), args=args)


@pytest.mark.parametrize(
    "kwargs, names",
    [
        (dict(eval_strategy="bogus"), ["eval_strategy", "'bogus'", "no, steps, epoch"]),
        (dict(logging_strategy="always"), ["logging_strategy", "'always'"]),
        (dict(save_strategy="sometimes"), ["save_strategy", "'sometimes'", "best"]),
        (dict(train_sampling_strategy="batch_rebalance"), ["train_sampling_strategy", "'batch_rebalance'", "random",
                                                           "group_by_length"]),
        (dict(optim="bogus"), ["optim", "'bogus'", "adamw_torch_fused", "adafactor"]),
        (dict(optim="lomo"), ["optim", "'lomo'", "fused_backward"]),  # valid for HF, refused here with the reason
        (dict(lr_scheduler_type="greedier"), ["lr_scheduler_type", "'greedier'", "linear"]),
        (dict(warmup_steps=-2), ["warmup_steps = -2"]),
        (dict(bf16=True, fp16=True), ["bf16", "fp16"]),
        (dict(per_device_train_batch_size=0), ["per_device_train_batch_size", "=0"]),
        (dict(per_device_eval_batch_size=-1), ["per_device_eval_batch_size", "=-1"]),
        (dict(gradient_accumulation_steps=0), ["gradient_accumulation_steps", "=0"]),
        (dict(save_steps=0), ["save_steps"]),
        (dict(include_for_metrics=["logits"]), ["include_for_metrics", "'logits'"]),
        (dict(report_to="bogus"), ["report_to", "'bogus'", "wandb", "mlflow"]),
        (dict(report_to="clearml"), ["report_to", "'clearml'", "ClearML", "lightning_kwargs"]),
        (dict(dataloader_prefetch_factor=2), ["dataloader_prefetch_factor", "dataloader_num_workers"]),
    ],
)
def test_errors_name_the_argument_and_value(kwargs, names):
    message = our_error(**kwargs)
    for name in names:
        assert name in message, (name, message)


def test_several_errors_are_reported_together():
    message = our_error(
        eval_strategy="bogus", optim="nope", warmup_steps=-1, per_device_train_batch_size=0, bf16=True, fp16=True,
        logging_steps=2.5,
    )
    for fragment in ("'bogus'", "'nope'", "warmup_steps = -1", "per_device_train_batch_size", "fp16",
                     "--logging_steps must be an integer if bigger than 1: 2.5"):
        assert fragment in message
    assert message.count("\n- ") >= 6


# ----- defaults HF fills in -----
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(eval_strategy="steps", logging_steps=7),
        dict(eval_strategy="steps", logging_steps=0.1),
        dict(eval_strategy="steps", eval_steps=0, logging_steps=3),
        dict(eval_strategy="steps", logging_steps=10.0, save_steps=20.0),
        dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=5, save_steps=10),
        dict(load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch", metric_for_best_model="acc"),
        dict(load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch", metric_for_best_model="e_loss"),
        dict(metric_for_best_model="f1"),
        dict(metric_for_best_model="loss", greater_is_better=True),
        dict(lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="epoch"),
        dict(),
    ],
)
def test_derived_defaults_equal_hfs(kwargs):
    hf = transformers.TrainingArguments(output_dir="unused_hf_output", **kwargs)
    ours = TrainingArguments(**kwargs)
    for name in ("eval_steps", "logging_steps", "save_steps", "metric_for_best_model", "greater_is_better", "do_eval"):
        hf_value, our_value = getattr(hf, name), getattr(ours, name)
        assert our_value == hf_value, name
        assert type(our_value) is type(hf_value), name  # integral floats become ints, ratios stay floats


def test_hf_defaults_of_unset_fields():
    ours, hf = TrainingArguments(), transformers.TrainingArguments(output_dir="unused_hf_output")
    for name in ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
                 "num_train_epochs", "max_steps", "warmup_steps", "logging_steps", "save_steps", "seed",
                 "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                 "label_smoothing_factor", "average_tokens_across_devices", "use_cache", "eval_delay"):
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.optim == hf.optim.value == "adamw_torch_fused"
    assert ours.lr_scheduler_type == hf.lr_scheduler_type.value == "linear"
    assert ours.eval_strategy == hf.eval_strategy.value and ours.save_strategy == hf.save_strategy.value
    assert ours.resolved_output_dir == "trainer_output"


def test_warmup_steps_resolution_equals_hf():
    for warmup in (0, 3, 3.7, 0.25, 0.1):
        ours, hf = TrainingArguments(warmup_steps=warmup), transformers.TrainingArguments(
            output_dir="unused_hf_output", warmup_steps=warmup
        )
        for max_steps in (1, 10, 42):
            assert ours.get_warmup_steps(max_steps) == hf.get_warmup_steps(max_steps), (warmup, max_steps)


# ----- conversion from transformers.TrainingArguments -----
def test_conversion_copies_supported_fields(tmp_path):
    settings = dict(
        learning_rate=3e-4, weight_decay=0.01, eval_strategy="steps", eval_steps=5, save_steps=10,
        logging_steps=5, lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 2},
        optim="sgd", gradient_accumulation_steps=3, warmup_steps=0.1, seed=3, data_seed=4,
        label_smoothing_factor=0.1, load_best_model_at_end=True, metric_for_best_model="accuracy",
        per_device_train_batch_size=2, max_grad_norm=0.3, use_cpu=True,
        train_sampling_strategy="sequential", include_for_metrics=["inputs"], run_name="run-x",
    )
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), **settings)
    ours = from_hf_training_arguments(hf)
    assert isinstance(ours, TrainingArguments)
    for name, value in settings.items():
        assert getattr(ours, name) == value, name
    assert ours.output_dir == str(tmp_path)
    assert ours.greater_is_better is True  # derived, as HF
    assert ours.dataloader_pin_memory is False  # HF forces it off with use_cpu
    # HF 5's new name `activation_checkpointing` is mirrored into the (deprecated) `gradient_checkpointing` we read;
    # the derived field is not reported as unsupported
    converted = from_hf_training_arguments(
        transformers.TrainingArguments(output_dir=str(tmp_path), activation_checkpointing=True)
    )
    assert converted.gradient_checkpointing is True


def test_conversion_accepts_hf_none_and_json_scheduler_kwargs(tmp_path):
    default = transformers.TrainingArguments(output_dir=str(tmp_path))
    assert default.lr_scheduler_kwargs is None and from_hf_training_arguments(default).lr_scheduler_kwargs == {}
    hf = transformers.TrainingArguments(
        output_dir=str(tmp_path), lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs='{"num_cycles": 3}'
    )
    assert from_hf_training_arguments(hf).lr_scheduler_kwargs == {"num_cycles": 3}
    assert TrainingArguments(lr_scheduler_kwargs=None).lr_scheduler_kwargs == {}


def test_conversion_lists_every_unsupported_field_in_one_error(tmp_path):
    hf = transformers.TrainingArguments(
        output_dir=str(tmp_path), parallelism_config=None, use_liger_kernel=True, save_on_each_node=True,
        dataloader_in_order=False, learning_rate=1e-3,
    )
    with pytest.raises(ValueError) as info:
        from_hf_training_arguments(hf)
    message = str(info.value)
    for fragment in ("`use_liger_kernel`=True", "`dataloader_in_order`=False", "`save_on_each_node`=True",
                     "liger_kernel.transformers", "shared file system"):
        assert fragment in message
    assert message.count("\n  * ") == 3  # one line per field, each saying what to do instead
    assert "learning_rate" not in message  # supported fields are never reported


def test_facade_converts_hf_arguments(tmp_path):
    hf = transformers.TrainingArguments(
        output_dir=str(tmp_path), learning_rate=1e-3, max_steps=2, save_strategy="no", report_to="none"
    )
    trainer = hf_lightning.Trainer(model=tiny_bert(), args=hf, train_dataset=classification_dataset(n=8))
    assert isinstance(trainer.args, TrainingArguments)
    assert trainer.args.learning_rate == 1e-3 and trainer.args.max_steps == 2
    with pytest.raises(ValueError, match="use_liger_kernel"):
        hf_lightning.Trainer(
            model=tiny_bert(), args=transformers.TrainingArguments(output_dir=str(tmp_path), use_liger_kernel=True)
        )


# ----- lightning_kwargs and Trainer-level checks -----
@pytest.mark.parametrize("option", sorted(OWNED_BY_HF_ARGS))
def test_lightning_kwargs_clash_names_the_hf_argument(option):
    with pytest.raises(ValueError) as info:
        hf_lightning.Trainer(
            model=tiny_bert(), args=TrainingArguments(output_dir="unused"), lightning_kwargs={option: 2}
        )
    message = str(info.value)
    assert option in message and OWNED_BY_HF_ARGS[option] in message


def test_a_misspelt_lightning_kwargs_key_is_one_error_at_construction_naming_it_and_the_option_meant(tmp_path):
    """Before: `lightning.Trainer`'s `TypeError: ... unexpected keyword argument 'acelerator'`, naming neither
    `lightning_kwargs` nor `accelerator`."""
    with pytest.raises(ValueError) as info:
        hf_lightning.Trainer(model=tiny_bert(), args=TrainingArguments(output_dir=str(tmp_path)),
                             lightning_kwargs={"acelerator": "cpu", "devices": 1})
    assert str(info.value).startswith("lightning_kwargs: 'acelerator' (did you mean 'accelerator'?) is not a "
                                      "lightning.Trainer option;"), str(info.value)
    with pytest.raises(ValueError) as info:
        hf_lightning.Trainer(model=tiny_bert(), args=TrainingArguments(output_dir=str(tmp_path)),
                             lightning_kwargs={"precison": "32", "zzz_qqq": 1})
    assert str(info.value).startswith("lightning_kwargs: 'precison' (did you mean 'precision'?), 'zzz_qqq' are not "
                                      "lightning.Trainer options;"), str(info.value)


def test_lightning_kwargs_clashes_are_reported_together_and_others_pass_through():
    with pytest.raises(ValueError) as info:
        lightning_trainer_kwargs(TrainingArguments(), {"accumulate_grad_batches": 4, "gradient_clip_val": 1.0})
    message = str(info.value)
    assert "accumulate_grad_batches (use TrainingArguments.gradient_accumulation_steps)" in message
    assert "gradient_clip_val (use TrainingArguments.max_grad_norm)" in message
    kwargs = lightning_trainer_kwargs(TrainingArguments(bf16=True), {"devices": 1, "logger": False})
    assert kwargs["devices"] == 1 and kwargs["logger"] is False and kwargs["precision"] == "bf16-mixed"
    assert kwargs["use_distributed_sampler"] is False and kwargs["enable_checkpointing"] is False


def test_eval_strategy_without_eval_dataset_raises_hfs_error():
    hf_args = transformers.TrainingArguments(output_dir="unused_hf_output", eval_strategy="steps", report_to="none")
    with pytest.raises(ValueError) as hf_info:
        transformers.Trainer(model=tiny_bert(), args=hf_args, train_dataset=classification_dataset(n=8))
    with pytest.raises(ValueError) as info:
        hf_lightning.Trainer(
            model=tiny_bert(), args=TrainingArguments(eval_strategy="steps"), train_dataset=classification_dataset(n=8)
        )
    tail = (
        "but you didn't pass an `eval_dataset` to `Trainer`. Either set `args.eval_strategy` to `no` or pass an "
        "`eval_dataset`."
    )
    assert tail in str(hf_info.value)
    # HF formats the enum it holds (`IntervalStrategy.STEPS`); ours holds the same (hf_lightning/args/enums.py)
    assert str(info.value) == str(hf_info.value).rstrip()  # HF ends its message with a space


def test_trainer_requires_model_or_model_init():
    with pytest.raises(ValueError, match="`model` or `model_init`"):
        hf_lightning.Trainer(args=TrainingArguments())


def test_a_mistyped_keyword_keeps_hfs_error_and_says_did_you_mean():
    """transformers' TypeError text comes first (code matching it still works), then the CLI's "did you mean"."""
    with pytest.raises(TypeError) as hf_error:
        transformers.TrainingArguments(output_dri="x")
    with pytest.raises(TypeError) as ours:
        TrainingArguments(output_dri="x", lerning_rate=1.0)
    message = str(ours.value)
    assert message.startswith(str(hf_error.value))
    assert "'output_dri' (did you mean 'output_dir'?), 'lerning_rate' (did you mean 'learning_rate'?)" in message
    with pytest.raises(TypeError, match=r"'predict_with_generat' \(did you mean 'predict_with_generate'\?\)"):
        hf_lightning.Seq2SeqTrainingArguments(predict_with_generat=True)
    with pytest.raises(TypeError, match=r"'zzzz' \(no field of that name\)"):
        TrainingArguments(zzzz=1)
