"""Every `transformers.TrainingArguments` / `Seq2SeqTrainingArguments` field exists on ours with HF's name, type and
default, and every command line HF's `HfArgumentParser` accepts parses into ours the same way.

The command line is generated from HF's own parser (one valid, non-default value per field), so a field HF adds in a
later release makes these tests fail until it is added here too.
"""

from __future__ import annotations

import dataclasses
import enum
import json

import pytest
import transformers
from transformers import HfArgumentParser

import hf_lightning
from hf_lightning.args.support import DEFAULT_DIFFERENCES, OURS, UNSUPPORTED
from hf_lightning.seq2seq import Seq2SeqTrainingArguments

HF_CLASSES = [(transformers.TrainingArguments, hf_lightning.TrainingArguments),
              (transformers.Seq2SeqTrainingArguments, Seq2SeqTrainingArguments)]

# Values HF's parser would accept but that are no value of the field (or that need a companion field to be valid).
VALUES = {
    "include_for_metrics": ["inputs"],
    "label_names": ["labels"],
    "optim_target_modules": ["q_proj"],
    "debug": ["underflow_overflow"],
    "report_to": ["csv"],
    "lr_scheduler_type": ["cosine"],
    "optim": ["adamw_torch"],
    "lr_scheduler_kwargs": ['{"num_cycles": 2}'],
    "eval_steps": ["4"],
    "save_steps": ["8"],
    "logging_steps": ["4"],
    "output_dir": ["out_dir"],
}
# HF's own parser cannot build these from text either (HF: a `ParallelismConfig` object; `dict[str, bool]`).
NOT_FROM_TEXT = {"parallelism_config", "liger_kernel_config"}


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


def _plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _actions(parser) -> dict:
    return {a.dest: a for a in parser._actions if a.dest != "help" and a.option_strings[0] == f"--{a.dest}"}


def _argv_for(action) -> list[str]:
    """`--name value...`: a valid value other than the default, chosen from HF's parser action."""
    name = action.dest
    if name in VALUES:
        return [f"--{name}", *VALUES[name]]
    if action.choices:
        return [f"--{name}", next(str(c) for c in action.choices if str(c) != str(_plain(action.default)))]
    if action.nargs == "?" and action.const is True:  # booleans (and HF's bare `--fsdp`)
        return [f"--{name}", "false"] if action.default is True else [f"--{name}"]
    if getattr(action.type, "__name__", "") == "string_to_bool":  # `bool | None` fields take a value
        return [f"--{name}", "true"]
    if action.type is int:
        return [f"--{name}", "3"]
    if action.type is float:
        return [f"--{name}", "0.5"]
    return [f"--{name}", "some_value"]


@pytest.mark.parametrize("hf_cls, our_cls", HF_CLASSES, ids=["TrainingArguments", "Seq2SeqTrainingArguments"])
def test_every_hf_field_exists_with_hfs_default(hf_cls, our_cls):
    ours = {f.name: f for f in dataclasses.fields(our_cls) if f.init}
    for f in dataclasses.fields(hf_cls):
        assert f.init and f.name in ours, f"{our_cls.__name__} lacks HF's field {f.name!r}"
        expected = DEFAULT_DIFFERENCES.get(f.name, _default(f))
        assert _default(ours[f.name]) == expected, f.name
    # and nothing of our own but the documented fields (README "Our arguments")
    assert set(ours) == {f.name for f in dataclasses.fields(hf_cls)} | set(OURS)
    # the one deliberate difference is what the README documents
    assert DEFAULT_DIFFERENCES == {"report_to": "tensorboard"}


@pytest.mark.parametrize("hf_cls, our_cls", HF_CLASSES, ids=["TrainingArguments", "Seq2SeqTrainingArguments"])
def test_hf_argument_parser_builds_the_same_options(hf_cls, our_cls):
    """Same option strings, arity, bare-flag constants and value types; choices where HF's are a `Literal`/enum."""
    hf, ours = _actions(HfArgumentParser(hf_cls)), _actions(HfArgumentParser(our_cls))
    assert set(hf) | set(OURS) == set(ours)
    for name, action in hf.items():
        mine = ours[name]
        assert mine.option_strings == action.option_strings, name
        assert (mine.nargs, mine.const, mine.default if name not in DEFAULT_DIFFERENCES else None) == (
            action.nargs, action.const, _plain(action.default) if name not in DEFAULT_DIFFERENCES else None), name
        if action.choices and mine.choices is not None:
            assert [str(c) for c in mine.choices] == [str(c) for c in action.choices], name
        elif action.choices:  # HF's enum; ours a plain string checked by our validation (optim, lr_scheduler_type)
            assert mine.type is str, name
        elif action.type in (int, float, str) or getattr(action.type, "__name__", "") == "string_to_bool":
            assert mine.type is action.type, name


def test_a_command_line_with_every_hf_field_parses_into_both():
    parser_hf = HfArgumentParser(transformers.Seq2SeqTrainingArguments)
    parser_ours = HfArgumentParser(Seq2SeqTrainingArguments)
    argv = [token for name, action in _actions(parser_hf).items() if name not in NOT_FROM_TEXT
            for token in _argv_for(action)]
    assert len([t for t in argv if t.startswith("--")]) == len(dataclasses.fields(Seq2SeqTrainingArguments)) - 2 - len(OURS)
    hf_values, hf_rest = parser_hf.parse_known_args(argv)
    our_values, our_rest = parser_ours.parse_known_args(argv)
    assert hf_rest == our_rest == []
    for name, value in vars(hf_values).items():
        assert getattr(our_values, name) == _plain(value), name
    # building our arguments from it: one error naming every unsupported field (the rest are valid values)
    with pytest.raises(ValueError) as info:
        parser_ours.parse_args_into_dataclasses(argv)
    message = str(info.value)
    assert message.count("not supported by hf_lightning") == 1
    named = {name for name in UNSUPPORTED if f"`{name}`=" in message}
    assert named == set(UNSUPPORTED) - NOT_FROM_TEXT


@pytest.mark.parametrize("name", sorted(set(UNSUPPORTED) - NOT_FROM_TEXT))
def test_each_unsupported_field_set_on_the_command_line_is_refused_with_what_to_do(name):
    action = _actions(HfArgumentParser(hf_lightning.TrainingArguments))[name]
    with pytest.raises(ValueError) as info:
        HfArgumentParser(hf_lightning.TrainingArguments).parse_args_into_dataclasses(_argv_for(action))
    message = str(info.value)
    # a command-line `accelerator_config` is a JSON file path (HF's reading): a missing file is named as such
    what = "No such file or directory" if name == "accelerator_config" else UNSUPPORTED[name][:40]
    assert f"`{name}`=" in message and what in message


SCRIPT_LINE = ["--output_dir", "out", "--do_train", "--do_eval", "--do_predict", "--eval_strategy", "steps",
               "--eval_steps", "5", "--logging_steps", "5", "--per_device_train_batch_size", "4", "--learning_rate",
               "2e-5", "--num_train_epochs", "2", "--report_to", "none", "--log_level", "info", "--seed", "7",
               "--gradient_checkpointing", "--load_best_model_at_end", "--save_steps", "10",
               "--metric_for_best_model", "accuracy", "--lr_scheduler_type", "cosine", "--warmup_steps", "0.1"]


def test_a_typical_script_line_gives_hfs_values():
    """A run_glue-style command line: every value our arguments hold equals HF's after both `__post_init__`s."""
    (hf,) = HfArgumentParser(transformers.TrainingArguments).parse_args_into_dataclasses(SCRIPT_LINE)
    with pytest.warns(FutureWarning, match="gradient_checkpointing"):  # HF's deprecation warning, as HF
        (ours,) = HfArgumentParser(hf_lightning.TrainingArguments).parse_args_into_dataclasses(SCRIPT_LINE)
    differ = {"report_to", "lr_scheduler_kwargs", "accelerator_config"}  # see below
    for f in dataclasses.fields(hf):
        if f.name not in differ:
            assert getattr(ours, f.name) == _plain(getattr(hf, f.name)), f.name
    assert ours.do_train and ours.do_eval and ours.do_predict and ours.activation_checkpointing
    assert ours.report_to == hf.report_to == []
    assert ours.lr_scheduler_kwargs == {} and hf.lr_scheduler_kwargs is None  # we keep a dict (optim.py reads it)
    assert ours.accelerator_config.to_dict() == hf.accelerator_config.to_dict()  # HF's AcceleratorConfig defaults


def _field_docstrings(cls) -> dict[str, str]:
    """The attribute docstring under each field (what `hf-lightning fit --help` prints), from the source."""
    import ast
    import inspect
    import textwrap

    docs = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def test_cli_parser_takes_every_field_with_its_description():
    """The CLI's `args` section (jsonargparse) handles every field's type and shows every field's docstring."""
    import jsonargparse

    import hf_lightning.cli.lightning_cli  # noqa: F401  (turns on attribute-docstring parsing, as the CLI does)

    docs = _field_docstrings(Seq2SeqTrainingArguments)
    names = [f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)]
    assert set(docs) == set(names), set(names) - set(docs)
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(Seq2SeqTrainingArguments, "args", instantiate=False)
    text = " ".join(parser.format_help().split())
    for name in names:
        assert f"--args.{name} " in text, name
        assert docs[name][:40] in text, name
    # one value per field as the YAML of a config gives it, every type accepted (validation comes afterwards)
    argv = [token for name, action in _actions(HfArgumentParser(transformers.Seq2SeqTrainingArguments)).items()
            if name not in NOT_FROM_TEXT | {"fsdp"} for token in _argv_for(action)]
    values = vars(HfArgumentParser(Seq2SeqTrainingArguments).parse_known_args(argv)[0])
    values["generation_config"] = str(values["generation_config"])
    parsed = parser.parse_object({"args": {**values, "fsdp": "full_shard"}})
    assert parsed.args.fsdp == "full_shard" and parsed.args.report_to == "csv"


def test_the_arguments_stay_importable_without_the_heavy_stack():
    """The CLI's fast path builds the arguments before torch, Lightning or transformers are imported."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hf_lightning.seq2seq.args import Seq2SeqTrainingArguments\n"
        "args = Seq2SeqTrainingArguments(report_to='all', eval_strategy='steps', predict_with_generate=True)\n"
        "str(args); args.to_json_string(); args.process_index, args.world_size, args.should_log, args.should_save\n"
        "print(sorted(m for m in ('torch', 'lightning', 'transformers', 'datasets') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_json_config_as_scripts_read_it(tmp_path):
    """`parser.parse_json_file(...)` (the official scripts' single-argument form) builds our arguments like HF's."""
    config = tmp_path / "args.json"
    config.write_text(json.dumps({"output_dir": str(tmp_path / "o"), "do_train": True, "eval_strategy": "epoch",
                                  "report_to": ["csv"], "optim": "adamw_torch", "lr_scheduler_type": "cosine"}))
    (hf,) = HfArgumentParser(transformers.TrainingArguments).parse_json_file(str(config))
    (ours,) = HfArgumentParser(hf_lightning.TrainingArguments).parse_json_file(str(config))
    for name in ("output_dir", "do_train", "do_eval", "eval_strategy", "report_to", "optim", "lr_scheduler_type"):
        assert getattr(ours, name) == _plain(getattr(hf, name)), name


def test_valid_dict_fields_as_hfs_and_a_subclass_extends_them():
    """HF's `_VALID_DICT_FIELDS`: the fields a JSON string starting with `{` may give, parsed into a dict with the
    `"true"` / number strings typed; a subclass (TRL's `SFTConfig`) adds its own fields to the list."""
    assert hf_lightning.TrainingArguments._VALID_DICT_FIELDS == transformers.TrainingArguments._VALID_DICT_FIELDS
    given = '{"a": "true", "b": "3", "c": "0.5", "d": {"e": "False"}, "f": "text"}'
    for base in (transformers.TrainingArguments, hf_lightning.TrainingArguments):
        @dataclasses.dataclass
        class Config(base):  # as TRL's configs: a dict field of its own, given on a command line as JSON
            model_init_kwargs: dict | str | None = None
            _VALID_DICT_FIELDS = base._VALID_DICT_FIELDS + ["model_init_kwargs"]

        args = Config(output_dir="unused", report_to="none", model_init_kwargs=given,
                      lr_scheduler_kwargs='{"num_cycles": "2"}')
        assert args.model_init_kwargs == {"a": True, "b": 3, "c": 0.5, "d": {"e": False}, "f": "text"}, base
        assert args.lr_scheduler_kwargs == {"num_cycles": 2}, base


def test_distributed_state_and_deepspeed_plugin_read_as_hfs(tmp_path):
    """What library trainers read of HF's arguments at construction (TRL: `args.distributed_state.distributed_type`,
    `args.deepspeed_plugin.zero_stage`): HF's values on one process; the ZeRO stage of a DeepSpeed config."""
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    ours = hf_lightning.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert ours.distributed_state.distributed_type == hf.distributed_state.distributed_type == "NO"
    assert (ours.distributed_state.num_processes, ours.distributed_state.process_index) == \
        (hf.distributed_state.num_processes, hf.distributed_state.process_index) == (1, 0)
    assert ours.deepspeed_plugin is None and hf.deepspeed_plugin is None
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    with_deepspeed = hf_lightning.TrainingArguments(output_dir=str(tmp_path), deepspeed=str(config), report_to="none")
    assert with_deepspeed.deepspeed_plugin.zero_stage == 2
    assert with_deepspeed.distributed_state.distributed_type == "DEEPSPEED"
