"""`hf-lightning fit|validate` of a library-trainer config (`library_config.py`): TRL's `SFTTrainer` run by the CLI.

The CLI's other configs build a run from a task preset (module, data module, flow); a library trainer's behaviour is
its `transformers.Trainer` subclass's own code (dataset preparation in `__init__`, `compute_loss`, `log`,
`_save_checkpoint`), which only runs when that class is the trainer. So this route does what a user's script does
(examples/run_sft.py): `use_as_transformers_trainer(lightning_kwargs=<the trainer: section>)` before the library is
imported, the arguments class built from `args:`, the model and tokenizer from `model:` / `data:`, the library
trainer built from them, then `train()` (fit: the final model, `train_results.json`, `trainer_state.json`, the
end-of-fit summary) or `evaluate()` (validate: the metrics printed and written to `eval_results.json`).

Mistakes found while building (an `args:` key the arguments class lacks, a value it refuses, a `trainer:` option
Lightning lacks, data the trainer cannot use) end the run with one `error:` line.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import jsonargparse
import lightning
import torch
import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException

from hf_lightning.args import TrainingArguments
from hf_lightning.args.process import current_layout
from hf_lightning.checkpoint.checks import output_dir_problem
from hf_lightning.checkpoint.find import resolve_resume, trained_epoch
from hf_lightning.checkpoint.io import CheckpointWriteError
from hf_lightning.checkpoint.run_lock import OutputDirLocked
from hf_lightning.checkpoint.verify import require_verified
from hf_lightning.cli.config_code import enforce_in_parser
from hf_lightning.cli.library_config import NEEDS_REWARDS, LibraryConfig, processes_lightning_starts, unknown_keys
from hf_lightning.cli.precheck import fail
from hf_lightning.cli.summary import fit_summary, logger_paths
from hf_lightning.cli.trainer_spellings import LIGHTNING_TO_HF, move_lightning_spellings, user_set
from hf_lightning.data.row_checks import BadRowError
from hf_lightning.pretrained_source import check_pretrained_source
from hf_lightning.run_options.seeding import seed_as_hf
from hf_lightning.tasks.hf_callbacks import build_hf_callbacks
from hf_lightning.tasks.loading import build_model, load_split, load_tokenizer, splits_for_stage
from hf_lightning.tasks.registry import get_task
from hf_lightning.tasks.rewards import BUILT_IN
from hf_lightning.tasks.specs import DataSpec, ModelSpec
from hf_lightning.trainer.as_transformers import use_as_transformers_trainer
from hf_lightning.trainer.facade import Trainer

__all__ = ["LibraryRun", "build_library_run", "run_library_config"]

_CONFIG_ERRORS = (ValueError, TypeError, FileNotFoundError, MisconfigurationException)
"""Errors raised while building a run that are config mistakes (one line); others keep their traceback."""
_CONSTRUCTOR = ("model", "args", "train_dataset", "eval_dataset", "processing_class", "callbacks")
"""The keywords the CLI builds a library trainer with (`transformers.Trainer`'s)."""
_STRING_TYPES = ("str", "str | None", "Optional[str]", "typing.Optional[str]", "<class 'str'>")
"""How a string field's type reads in a dataclass (`from __future__ import annotations` keeps it as text)."""
_MODEL_TASK = "causal_lm"
"""The preset whose Auto class (`AutoModelForCausalLM`) builds the model unless `model.auto_class` names another."""


@dataclass
class LibraryRun:
    """A built library-trainer run: the trainer and what the subcommand writes and reports."""

    config: LibraryConfig
    trainer: Any
    args: TrainingArguments
    resume: str | None
    train_rows: int | None
    eval_rows: int | None
    model_folder: str | None


def _import(key: str, path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{key}={path!r} cannot be imported: {err}") from None


def _classes(config: LibraryConfig) -> tuple[type, type]:
    """The arguments class and the trainer class, imported after `use_as_transformers_trainer()` and checked to be
    built on hf_lightning's."""
    args_cls = _import("args_class", config.args_class)
    if not (inspect.isclass(args_cls) and dataclasses.is_dataclass(args_cls)
            and issubclass(args_cls, TrainingArguments)):
        raise ValueError(f"args_class={config.args_class!r} is not a TrainingArguments dataclass (e.g. "
                         "trl.SFTConfig for trl.SFTTrainer).")
    trainer_cls = _import("trainer_class", config.trainer_class)
    if not (inspect.isclass(trainer_cls) and issubclass(trainer_cls, Trainer)):
        raise ValueError(f"trainer_class={config.trainer_class!r} is not a transformers.Trainer subclass (a library "
                         "trainer such as trl.SFTTrainer).")
    parameters = inspect.signature(trainer_cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    missing = [name for name in _CONSTRUCTOR if name not in parameters and not takes_any]
    if config.reward_funcs and "reward_funcs" not in parameters:
        raise ValueError(f"reward_funcs={config.reward_funcs!r}: trainer_class={config.trainer_class!r} takes no "
                         "reward functions (GRPO / RLOO trainers do); drop reward_funcs.")
    if missing:
        raise ValueError(f"trainer_class={config.trainer_class!r} does not take {', '.join(missing)}: the CLI builds "
                         f"a library trainer as transformers.Trainer is built ({', '.join(_CONSTRUCTOR)}); run it "
                         "from Python with hf_lightning.use_as_transformers_trainer().")
    return args_cls, trainer_cls


def _training_arguments(config: LibraryConfig, args_cls: type) -> Any:
    """The arguments object from `args:` (plus the `trainer:` spellings of HF arguments, moved as elsewhere)."""
    fields = [f for f in dataclasses.fields(args_cls) if f.init]
    defaults = {f.name: f.default for f in fields}
    _, values = move_lightning_spellings(user_set(config.trainer), config.args, defaults)
    types = {f.name: str(f.type) for f in fields}
    for key, value in values.items():
        text = config.command_line.get(f"args.{key}")
        # `--args.eos_token [SEP]`: YAML reads a list, the field wants the text (jsonargparse's reading of a str)
        if text is not None and not isinstance(value, str) and types.get(key) in _STRING_TYPES:
            values[key] = text
    if (problem := unknown_keys("args", values, [f.name for f in fields])) is not None:
        raise ValueError(f"{problem} `args` takes the fields of {config.args_class} (HF TrainingArguments and the "
                         "library's own).")
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(args_cls, "args", instantiate=False, fail_untyped=False)
    try:  # the type check of the other configs (jsonargparse's words)
        parser.parse_object({"args": values})
    except jsonargparse.ArgumentError as err:
        raise ValueError(" ".join(line.strip() for line in str(err).splitlines() if line.strip())) from None
    try:
        return args_cls(**values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"in `args`: {err}") from None


def _lightning_kwargs(config: LibraryConfig) -> dict[str, Any]:
    """The `trainer:` options the user set, parsed and instantiated as LightningCLI does (loggers and callbacks from
    `class_path` entries), without those moved to `args`."""
    given = {k: v for k, v in config.trainer.items() if k not in LIGHTNING_TO_HF}
    if not given:
        return {}
    enforce_in_parser(config.allow_code_from)
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(lightning.Trainer, "trainer", instantiate=False, fail_untyped=False, sub_configs=True)
    try:
        parsed = parser.instantiate_classes(parser.parse_object({"trainer": given}))
    except jsonargparse.ArgumentError as err:
        raise ValueError(" ".join(line.strip() for line in str(err).splitlines() if line.strip())) from None
    return {key: parsed["trainer"][key] for key in given}


def _check_launch(config: LibraryConfig) -> None:
    """Several processes must be started by a launcher (torchrun, srun), not by Lightning from this one.

    Lightning's own launcher starts the other processes when `fit` begins, and they run this command again: TRL's
    constructor prepares its datasets under accelerate's `PartialState`, which in such a process (LOCAL_RANK and
    WORLD_SIZE set, no RANK) tries to join a process group the first process has not opened (measured: the second
    process fails with "environment variable RANK expected"). Under torchrun every process builds the trainer
    together, as TRL expects.

    Raises:
        ValueError: the `trainer:` options ask Lightning to start the processes, naming them and the torchrun line.
    """
    if current_layout().world_size > 1:
        return  # a launcher started every process
    count = processes_lightning_starts(config.trainer, torch.cuda.device_count())
    if count <= 1:
        return
    given = ", ".join(f"trainer.{k}={config.trainer[k]!r}" for k in ("accelerator", "devices", "num_nodes")
                      if k in config.trainer) or "trainer.devices='auto' (every GPU)"
    raise ValueError(
        f"{given} asks Lightning to start {count} processes from this one, which a library trainer cannot join (its "
        "constructor prepares the datasets with accelerate in every process); start them with torchrun instead, "
        f"e.g. `torchrun --nproc_per_node {count} -m hf_lightning {config.subcommand} --config ... --trainer.devices "
        f"{count} --trainer.strategy ddp` (every process builds the trainer, then they join one DDP run)."
    )


def _model_folder(config: LibraryConfig) -> str | None:
    """`validate --ckpt_path <folder>`: the folder is the model to evaluate (as the preset route)."""
    ckpt = config.ckpt_path
    if config.subcommand == "fit" or ckpt is None:
        return config.model.model_name_or_path
    if not os.path.isdir(ckpt):
        raise FileNotFoundError(f"ckpt_path={ckpt!r}: no such checkpoint folder (validate evaluates a saved model "
                                "folder).")
    require_verified(ckpt, "ckpt_path")  # a checkpoint is verified before its weights are trusted
    config.model = dataclasses.replace(config.model, model_name_or_path=ckpt, config_class=None, config_kwargs={})
    return ckpt


def _reward_functions(config: LibraryConfig) -> list[Any]:
    """The config's reward functions: built-in ones by name, the others imported from their (checked) dotted path."""
    functions = []
    for index, entry in enumerate(config.reward_funcs):
        function = BUILT_IN.get(entry) or _import(f"reward_funcs[{index}]", entry)
        if not callable(function):
            raise ValueError(f"reward_funcs[{index}]={entry!r} is not callable: a reward function takes (prompts, "
                             "completions, **columns) and returns one float per completion.")
        functions.append(function)
    return functions


def _reference_model(config: LibraryConfig, trainer_cls: type, args: Any, model: Any) -> dict[str, Any]:
    """The keyword that gives a trainer its reference model when TRL could not build it.

    TRL builds the reference model (DPO, GRPO / RLOO with `beta` > 0) by loading the policy's `name_or_path` again;
    a model the config builds from `config_class` has none. DPO takes a `ref_model`: the CLI passes a copy of the
    freshly built policy (the weights TRL's reload would give). GRPO takes none: such a config is refused unless
    `args.beta` is 0 (no reference model: TRL's default).

    Raises:
        ValueError: a GRPO / RLOO config with a `config_class` model and `args.beta` > 0.
    """
    if config.model.model_name_or_path is not None:
        return {}
    if "ref_model" in inspect.signature(trainer_cls).parameters:
        return {"ref_model": copy.deepcopy(model)}
    if getattr(args, "beta", 0.0) not in (0, 0.0, None) and config.trainer_class in NEEDS_REWARDS:
        raise ValueError(f"args.beta={args.beta!r} needs a reference model, which {config.trainer_class} loads from "
                         "the model's path; a model built from model.config_class has none: set args.beta: 0.0, or "
                         "model.model_name_or_path.")
    return {}


def build_library_run(config: LibraryConfig) -> LibraryRun:
    """Everything up to a built library trainer (see the module docstring).

    Raises:
        ValueError / TypeError / FileNotFoundError: a config mistake, naming the key.
    """
    use_as_transformers_trainer()  # before the library is imported: its trainer subclasses hf_lightning's
    args_cls, trainer_cls = _classes(config)
    args = _training_arguments(config, args_cls)
    if (problem := output_dir_problem(args.resolved_output_dir)) is not None:
        raise ValueError(problem.replace("output_dir=", "args.output_dir="))
    try:
        lightning_kwargs = _lightning_kwargs(config)
    except ValueError as err:
        raise ValueError(f"in `trainer`: {err}") from None
    _check_launch(config)
    use_as_transformers_trainer(lightning_kwargs=lightning_kwargs)  # the library's constructor has no such parameter
    model_folder = _model_folder(config)
    resume = resolve_resume(args, config.ckpt_path) if config.subcommand == "fit" else None
    check_pretrained_source("model.model_name_or_path", config.model.model_name_or_path)
    check_pretrained_source("data.tokenizer_name_or_path", config.data.tokenizer_name_or_path)
    seed_as_hf(args)  # before the model is built: a random init is the seed's, as in the preset route
    raw = {split: load_split(config.data, split) for split in splits_for_stage(config.subcommand, args)}
    if config.subcommand == "fit" and raw.get("train") is None:
        raise ValueError("fit needs training data: set data.train_file or data.dataset_name.")
    if "validation" in raw and raw["validation"] is None:
        strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
        reason = "validate" if config.subcommand == "validate" else f"args.eval_strategy={strategy!r}"
        raise ValueError(f"{reason} needs evaluation data: set data.validation_file (or data.validation_split)"
                         + (", or args.eval_strategy: 'no'." if config.subcommand == "fit" else "."))
    tokenizer = load_tokenizer(config.data, config.model)
    model = build_model(config.model, get_task(_MODEL_TASK), tokenizer, None, config.allow_code_from)
    callbacks = build_hf_callbacks(config.hf_callbacks, config.allow_code_from)
    extra = _reference_model(config, trainer_cls, args, model)
    if config.reward_funcs:
        extra["reward_funcs"] = _reward_functions(config)
    # validate: TRL's SFTTrainer refuses to be built without a train dataset; the evaluation rows stand in (only
    # tokenized, never trained on: `evaluate()` reads the eval dataset alone)
    train = raw.get("train") if config.subcommand == "fit" else raw.get("validation")
    try:
        trainer = trainer_cls(model=model, args=args, train_dataset=train,
                              eval_dataset=raw.get("validation"), processing_class=tokenizer,
                              callbacks=callbacks or None, **extra)
    except ValueError as err:
        raise ValueError(str(err).replace("lightning_kwargs", "trainer options").replace(
            "TrainingArguments.", "args.")) from None
    evaluation = raw.get("validation")
    return LibraryRun(config=config, trainer=trainer, args=args, resume=resume,
                      train_rows=None if train is None else len(train),
                      eval_rows=None if evaluation is None else len(evaluation), model_folder=model_folder)


def _one_line(run: LibraryRun, err: Exception) -> NoReturn:
    """An error every process meets (a busy output_dir, a bad row): one line from the first process."""
    if run.trainer.is_world_process_zero():
        fail(err, prog=f"hf-lightning {run.config.subcommand}")
    sys.exit(2)


def _fit(run: LibraryRun) -> None:
    trainer = run.trainer
    try:
        output = trainer.train(resume_from_checkpoint=run.resume)
    except (OutputDirLocked, BadRowError) as err:
        _one_line(run, err)
    try:
        trainer.save_model()  # HF scripts' final save: model, tokenizer and training_args.bin in output_dir
    except CheckpointWriteError as err:  # a full disk: one line saying what is left, not a traceback
        checkpoint = trainer.flow.checkpoints.this_runs_checkpoint()
        last = f" This run's last checkpoint: {checkpoint}." if checkpoint else ""
        sys.stderr.write(f"hf-lightning fit: error: {' '.join(str(err).split())}{last}\n")
        sys.exit(1)
    metrics = dict(output.metrics)
    metrics["train_samples"] = run.train_rows
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    if trainer.is_world_process_zero():
        out = run.args.resolved_output_dir
        print(fit_summary(trainer.state, run.args, train_metrics=metrics, model_dir=out,
                          logs=logger_paths(trainer.lightning_trainer), written=trainer.flow.written_steps))



def _validate(run: LibraryRun) -> None:
    try:
        metrics = run.trainer.evaluate()
    except BadRowError as err:
        _one_line(run, err)
    metrics["eval_samples"] = run.eval_rows
    # HF's `epoch` is the evaluating trainer's (0: it trained nothing); here it is the evaluated model's
    if (epoch := trained_epoch(run.model_folder)) is not None:
        metrics["epoch"] = epoch
    else:
        metrics.pop("epoch", None)
    run.trainer.save_metrics("eval", metrics, combined=False)
    if run.trainer.is_world_process_zero():
        print(json.dumps(metrics, default=float))


def _print_config(config: LibraryConfig, args: Any) -> None:
    values = args.to_dict()
    for name in values:  # `to_dict` hides every `*_token` (HF's); only hub_token is a secret, TRL's eos_token is not
        if name.endswith("_token") and name != "hub_token":
            values[name] = getattr(args, name)
    document = {
        "trainer_class": config.trainer_class, "args_class": config.args_class,
        "allow_code_from": config.allow_code_from,
        "args": json.loads(json.dumps(values, default=str)),
        "model": dataclasses.asdict(config.model), "data": dataclasses.asdict(config.data),
        "trainer": config.trainer, "hf_callbacks": config.hf_callbacks,
    }
    if config.reward_funcs:
        document["reward_funcs"] = config.reward_funcs
    sys.stdout.write(yaml.safe_dump(document, sort_keys=False))


def _print_help(config: LibraryConfig, args_cls: type) -> None:
    parser = jsonargparse.ArgumentParser(
        prog=f"hf-lightning {config.subcommand} --config <library-trainer config>",
        description=f"Runs {config.trainer_class} (built on hf_lightning.Trainer) from the config: `args` are "
                    f"{config.args_class} fields, `model` / `data` as in the other configs, `trainer` the "
                    "lightning.Trainer options given to it as lightning_kwargs (configs/README.md).")
    parser.add_class_arguments(args_cls, "args", instantiate=False, fail_untyped=False)
    parser.add_class_arguments(ModelSpec, "model", instantiate=False)
    parser.add_class_arguments(DataSpec, "data", instantiate=False)
    parser.print_help()


def run_library_config(config: LibraryConfig) -> LibraryRun | None:
    """Run `fit` or `validate` of a checked library-trainer config; `--print_config` prints the complete config
    (every field of the arguments class) and `--help` the options, instead. Config mistakes end with one `error:`
    line (exit status 2)."""
    prog = f"hf-lightning {config.subcommand}"
    if config.help:
        use_as_transformers_trainer()
        try:
            args_cls, _ = _classes(config)
        except _CONFIG_ERRORS as err:
            fail(err, prog=prog)
        _print_help(config, args_cls)
        return None
    if config.print_config:
        use_as_transformers_trainer()
        try:
            args_cls, _ = _classes(config)
            _print_config(config, _training_arguments(config, args_cls))
        except _CONFIG_ERRORS as err:
            fail(err, prog=prog)
        return None
    try:
        run = build_library_run(config)
    except _CONFIG_ERRORS as err:
        fail(err, prog=prog)
    if config.subcommand == "fit":
        _fit(run)
    else:
        _validate(run)
    return run
