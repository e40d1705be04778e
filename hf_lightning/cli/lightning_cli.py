"""`HFLightningCLI`: the LightningCLI subclass behind `hf-lightning fit|validate|predict` (imports Lightning).

The parser has Lightning's `trainer` section and our `task`, `args` (HF `TrainingArguments`, descriptions from the
dataclass field docstrings), `model` (`ModelSpec`) and `data` (`DataSpec`) sections. `instantiate_classes` builds
everything with the facade's functions; errors become one `error:` line.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from typing import Any, Literal, NoReturn, Union

import jsonargparse
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from transformers.trainer_utils import PredictionOutput
from typing_extensions import override

from hf_lightning.args.to_lightning import lightning_trainer_kwargs
from hf_lightning.checkpoint.checks import output_dir_problem
from hf_lightning.checkpoint.final_model import save_final_model
from hf_lightning.checkpoint.find import resolve_resume, trained_epoch
from hf_lightning.checkpoint.io import CheckpointWriteError
from hf_lightning.checkpoint.run_lock import OutputDirLocked
from hf_lightning.checkpoint.sharded import gather_full_weights
from hf_lightning.checkpoint.verify import require_verified
from hf_lightning.checkpoint.weight_files import is_adapter_file, weights_file
from hf_lightning.cli.plan import PlanRequest
from hf_lightning.cli.prediction_writer import write_predictions
from hf_lightning.cli.summary import fit_summary, logger_paths
from hf_lightning.cli.trainer_spellings import LIGHTNING_TO_HF, help_text, move_lightning_spellings, user_set
from hf_lightning.data.row_checks import BadRowError, RowLimits
from hf_lightning.flow.setup_stop import SetupStop
from hf_lightning.pretrained_source import check_pretrained_source, looks_like_path, missing_local_folder
from hf_lightning.run_options.memory_plan import memory_plan_line
from hf_lightning.run_options.seeding import seed_as_hf
from hf_lightning.seq2seq.args import Seq2SeqTrainingArguments
from hf_lightning.tasks import checks
from hf_lightning.tasks.datamodule import TaskDataModule, splits_for_stage
from hf_lightning.tasks.generation import write_prediction_texts
from hf_lightning.tasks.hf_callbacks import build_hf_callbacks
from hf_lightning.tasks.loading import build_model, label_list_for, load_split, load_tokenizer
from hf_lightning.tasks.peft_config import apply_peft
from hf_lightning.tasks.registry import args_for_task, get_task, resolve, task_names
from hf_lightning.tasks.specs import DataSpec, ModelSpec
from hf_lightning.tasks.text_cells import check_text_cells
from hf_lightning.trainer.lightning_trainer import (
    build_flow,
    build_lightning_trainer,
    fit_with_batch_search,
    split_callbacks,
)
from hf_lightning.trainer.memory_plan import build_memory_plan, print_memory_plan_line

__all__ = ["HFLightningCLI"]

# `--help` shows each TrainingArguments field's docstring (PEP 257 attribute docstrings, off by default).
jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)

_SUBCOMMANDS = ("fit", "validate", "predict")

_CONFIG_ERRORS = (ValueError, TypeError, FileNotFoundError, NotImplementedError, OSError, MisconfigurationException)


def _check_sources(model_spec: ModelSpec, data_spec: DataSpec) -> None:
    """Names loaded with `from_pretrained` / `load_dataset`: a mistyped folder or a hub name without network is one
    error line (`pretrained_source.py`), before any data is read.

    Raises:
        FileNotFoundError: naming the key, its value and the closest existing folder.
    """
    check_pretrained_source("model.model_name_or_path", model_spec.model_name_or_path)
    check_pretrained_source("data.tokenizer_name_or_path", data_spec.tokenizer_name_or_path)
    name = data_spec.dataset_name
    if name is not None and looks_like_path(name) and not os.path.isdir(os.path.expanduser(name)):
        raise FileNotFoundError(missing_local_folder("data.dataset_name", name))



class _OneLineErrorParser(LightningArgumentParser):
    """Parse errors as one `error:` line (no usage dump), like the errors of our own checks."""

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        lines = [line.strip() for line in str(message).splitlines() if line.strip()]
        prog = str(self.prog).replace(" [options]", "")
        sys.stderr.write(f"{prog}: error: {' '.join(lines)} (see `{prog} --help`)\n")
        sys.exit(2)


class HFLightningCLI(LightningCLI):
    """LightningCLI whose model, data and trainer are built from an HF-style config (see `cli/__init__.py`)."""

    def __init__(self, args: list[str] | None = None, subcommand: str | None = None,
                 setup_stop: SetupStop | None = None, plan_request: PlanRequest | None = None) -> None:
        self._only_subcommand = subcommand
        self._plan_request = plan_request
        """`hf-lightning plan`: `fit` prints the memory plan of the configured run instead of training."""
        self._setup_stop = setup_stop
        """Stops the process on a signal while the run is built; closed when the subcommand starts."""
        super().__init__(
            # only a placeholder: `add_core_arguments_to_parser` defines the sections and `_instantiate` builds a
            # TransformerModule; not importing it here keeps `fit --help` free of the transformers model code
            model_class=LightningModule,
            save_config_kwargs={"overwrite": True},
            seed_everything_default=False,  # HF seeds with `args.seed` (set before the model is built)
            auto_configure_optimizers=False,  # the optimizer and scheduler come from the HF arguments
            load_from_checkpoint_support=False,
            parser_class=_OneLineErrorParser,
            parser_kwargs={"prog": "hf-lightning", "description": "HF Trainer semantics on PyTorch Lightning."},
            args=args,
        )

    # ----- parser -----
    @override
    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Lightning's parser, without argparse's abbreviations (`--conf` for `--config`): every option reaches the
        parser as `check_config_code` read it."""
        kwargs.setdefault("allow_abbrev", False)
        return super().init_parser(**kwargs)

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]  # Lightning's is a staticmethod
        """`fit`, `validate`, `predict` (no `test`), or only `subcommand` when the constructor got one: each
        subcommand's parser holds the whole `lightning.Trainer` and HF arguments signatures, and building one costs
        about a second, so a run builds only its own."""
        ours = {name: skip for name, skip in LightningCLI.subcommands().items() if name in _SUBCOMMANDS}
        return {self._only_subcommand: ours[self._only_subcommand]} if self._only_subcommand in ours else ours

    @override
    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        for action in parser._actions:  # the options the HF arguments decide say so (cli/trainer_spellings.py)
            if action.dest.startswith("trainer.") and (text := help_text(action.dest[len("trainer."):])):
                action.help = text
        parser.add_argument(
            "--task", type=str, default="text_classification",
            help=f"What to train; one of: {', '.join(task_names())}.",
        )
        # the widest args class, so `--help` lists the generation options too; `args_for_task` narrows it per task
        parser.add_class_arguments(Seq2SeqTrainingArguments, "args", instantiate=False, sub_configs=True,
                                   help="HF TrainingArguments (transformers' names and defaults); the generation "
                                        "tasks also take the Seq2SeqTrainingArguments fields.")
        parser.add_argument(
            "--hf_callbacks", type=list[Union[str, dict[str, Any]]], default=[],  # noqa: UP007  (read by jsonargparse)
            help="transformers.TrainerCallback classes, each a class path or {class_path, init_args} (e.g. "
                 "transformers.EarlyStoppingCallback); Lightning callbacks go in trainer.callbacks.",
        )
        parser.add_argument(
            "--allow_code_from", type=list[str], default=[],
            help="Your packages (module prefixes), from which a config may import code: class_path values anywhere, "
                 "callables such as LambdaCallback hooks, model.config_class, model.auto_class and hf_callbacks. "
                 "Without them a config names only classes of lightning, torch, torchmetrics, transformers, peft "
                 "and hf_lightning (config_class / auto_class / hf_callbacks: transformers only); the standard "
                 "library cannot be allowed.",
        )
        parser.add_argument(
            "--allow_remote_code", type=bool, default=False,
            help="true: `trust_remote_code` may run the Python files of any model folder or hub repository this "
                 "config loads; without it, only of those listed in allow_code_from (checked before anything is "
                 "imported).",
        )
        parser.add_argument(
            "--eval_loss_weighting", type=Literal["samples", "tokens"], default="samples",
            help="eval_loss as HF computes it ('samples': sample-weighted mean of batch means) or the mean over "
                 "every label token ('tokens'); the facade's `eval_loss_weighting`.",
        )
        parser.add_argument(
            "--peft", type=dict[str, Any] | None, default=None,
            help="A LoRA adapter on the model: peft.LoraConfig fields, e.g. {r: 8, lora_alpha: 16, target_modules: "
                 "[c_attn]} (task_type from the task). Needs the peft extra.",
        )
        parser.add_class_arguments(ModelSpec, "model", instantiate=False, sub_configs=True)
        parser.add_class_arguments(DataSpec, "data", instantiate=False, sub_configs=True)

    def _error(self, message: Any) -> NoReturn:
        prog = f"hf-lightning {self.subcommand}" if self.subcommand else "hf-lightning"
        sys.stderr.write(f"{prog}: error: {' '.join(str(message).split())}\n")
        sys.exit(2)

    def _one_process_error(self, err: Exception) -> NoReturn:
        """An error every process meets (a busy output_dir, a bad data row): one line from the first process."""
        if self.trainer.is_global_zero:
            self._error(err)
        sys.exit(2)

    # ----- building -----
    def _section(self, name: str) -> dict[str, Any]:
        value = self.config[self.subcommand][name]
        return value.as_dict() if hasattr(value, "as_dict") else dict(value or {})

    def _user_trainer_kwargs(self, trainer_cfg: dict[str, Any]) -> dict[str, Any]:
        """Only the `trainer` options the user set (those differing from the parser defaults)."""
        defaults = self._parser(self.subcommand).get_defaults()["trainer"]
        given = self.config[self.subcommand]["trainer"]
        return {k: v for k, v in trainer_cfg.items() if given.get(k) != defaults.get(k)}

    @override
    def instantiate_classes(self) -> None:
        try:
            self._instantiate()
        except _CONFIG_ERRORS as err:
            self._error(err)

    def _instantiate(self) -> None:
        sub = self.subcommand
        if sub is None:
            raise ValueError("hf-lightning needs a subcommand: fit, validate or predict.")
        self.config_init = self.parser.instantiate_classes(self.config)
        cfg = self.config[sub]
        task = get_task(cfg["task"])
        args_defaults = self._parser(sub).get_defaults()["args"]
        _, moved_args = move_lightning_spellings(user_set(self._section("trainer")), self._section("args"),
                                                 args_defaults.as_dict() if hasattr(args_defaults, "as_dict")
                                                 else dict(args_defaults or {}))
        try:
            args_class, args_values = args_for_task(task, moved_args)
            args = args_class(**args_values)
        except ValueError as err:
            raise ValueError(f"in `args`: {err}") from None
        if (problem := output_dir_problem(args.resolved_output_dir)) is not None:
            raise ValueError(problem.replace("output_dir=", "args.output_dir="))
        model_values = self._section("model")
        adapter: str | None = None
        self.ckpt_for_lightning: str | None = self.config_init[sub].get("ckpt_path")
        if sub == "fit":
            self.ckpt_for_lightning = resolve_resume(args, self.ckpt_for_lightning)
        elif self.ckpt_for_lightning and os.path.isdir(self.ckpt_for_lightning):
            require_verified(self.ckpt_for_lightning, "ckpt_path")  # before any data is read or weight loaded
            if (found := weights_file(self.ckpt_for_lightning)) is not None and is_adapter_file(found):
                adapter = self.ckpt_for_lightning  # a PEFT checkpoint: the base from `model`, its adapter on top
            else:  # one of our checkpoint folders: it is a pretrained model directory
                model_values.update(model_name_or_path=self.ckpt_for_lightning, config_class=None, config_kwargs={})
            self.ckpt_for_lightning = None
        elif self.ckpt_for_lightning and self.ckpt_for_lightning not in ("best", "last", "hpc", "registry") \
                and not os.path.isfile(self.ckpt_for_lightning):
            raise FileNotFoundError(f"ckpt_path={self.ckpt_for_lightning!r}: no such checkpoint folder or file.")
        self._model_folder: str | None = model_values.get("model_name_or_path")
        model_spec, data_spec = ModelSpec(**model_values), DataSpec(**self._section("data"))
        _check_sources(model_spec, data_spec)
        self.hf_args = args
        seed_as_hf(args)
        raw = {name: load_split(data_spec, name) for name in splits_for_stage(sub, args)}
        # data against model here, not inside fit: each mismatch is one error line (tasks/checks.py)
        checks.check_columns(task, data_spec, raw)
        check_text_cells(task, data_spec, raw)
        if sub == "fit" and raw.get("train") is None:
            raise ValueError("fit needs training data: set data.train_file or data.dataset_name.")
        if sub == "fit" and args.eval_strategy != "no" and raw.get("validation") is None:
            strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
            raise ValueError(f"args.eval_strategy={strategy!r} needs evaluation data: set "
                             "data.validation_file (or data.validation_split), or args.eval_strategy: 'no'.")
        if sub != "fit" and all(v is None for v in raw.values()):
            raise ValueError(f"{sub} needs data: set data.validation_file / data.test_file (or a dataset_name).")
        tokenizer = load_tokenizer(data_spec, model_spec)
        labels = label_list_for(task, data_spec, model_spec, list(raw.values()))
        checks.check_explicit_num_labels(model_spec, labels)
        checks.check_label_values(task, data_spec, raw, labels)
        label2id = {name: i for i, name in enumerate(labels)} if labels is not None else None
        allow_code_from = list(cfg.get("allow_code_from") or [])
        model = apply_peft(build_model(model_spec, task, tokenizer, labels, allow_code_from), cfg.get("peft"),
                           task.name, adapter)
        limits = RowLimits.of(model)
        checks.check_lengths(task, data_spec, model.config, (limits.max_positions, limits.decoder_max_positions))
        self.datamodule = TaskDataModule(task, data_spec, args, tokenizer, label2id, sub, raw=raw)

        self.task = task
        metrics = task.build_metrics(tokenizer, args) if task.build_metrics is not None else task.compute_metrics
        self.model = resolve(task.module_class)(model, args, compute_metrics=metrics, processing_class=tokenizer)
        self.model.eval_loss_weighting = cfg.get("eval_loss_weighting") or "samples"
        trainer_cfg = dict(self.config_init[sub]["trainer"])
        user = {k: v for k, v in self._user_trainer_kwargs(trainer_cfg).items() if k not in LIGHTNING_TO_HF}
        callbacks = user.pop("callbacks", None) or []
        hf_callbacks, lightning_callbacks = split_callbacks(callbacks if isinstance(callbacks, list) else [callbacks])
        hf_callbacks += build_hf_callbacks(cfg.get("hf_callbacks"), allow_code_from)
        try:
            trainer_kwargs = lightning_trainer_kwargs(args, user, model)
        except ValueError as err:
            raise ValueError(str(err).replace("lightning_kwargs", "trainer options").replace(
                "TrainingArguments.", "args.")) from None
        # the line a stopped run prints names how to resume
        self.flow = build_flow(args, hf_callbacks, tokenizer, resume_hint="the same command and --ckpt_path {path}")
        self.flow.hf_init_end(model)
        save_config = SaveConfigCallback(self._parser(sub), self.config[sub], **self.save_config_kwargs)

        def new_trainer() -> Any:  # a fresh one for each run (auto_find_batch_size may run fit again)
            return build_lightning_trainer(self.flow, [*lightning_callbacks, save_config], trainer_kwargs)

        self._new_trainer = new_trainer
        self._trainer_kwargs = trainer_kwargs
        self.trainer = new_trainer()

    # ----- subcommands -----
    def fit(self, model: Any, datamodule: Any, **_: Any) -> None:
        """Train, save the final model and tokenizer to `output_dir` (HF scripts' `trainer.save_model()`) and the
        train metrics to `<output_dir>/train_results.json` (HF scripts' `save_metrics("train", ...)`), then print
        the summary (`summary.fit_summary`)."""
        if self._setup_stop is not None:
            self._setup_stop.close()  # the run is built: from here the flow's handlers decide
        if self._plan_request is not None:  # `hf-lightning plan`: the plan of this run, no training
            self._print_plan(model, datamodule, self._plan_request)
            return
        if self.hf_args.auto_micro_batch:  # the memory plan's line before the run (issue 34)
            datamodule.setup("fit")
            print_memory_plan_line(model, datamodule, self.hf_args, self._trainer_kwargs)
        # the flow restores an HF-layout checkpoint folder itself (checkpoint/restore.py), as in the facade; with
        # `auto_find_batch_size` a run that ran out of memory starts again with a smaller batch
        # (run_options/batch_search.py)
        attempts = iter([self.trainer])

        def fit_once() -> Any:
            self.trainer = next(attempts, None) or self._new_trainer()
            resume = self.ckpt_for_lightning or False
            return self.flow.fit(self.trainer, model, datamodule, resume_from_checkpoint=resume)

        try:
            output = fit_with_batch_search(self.hf_args, self.ckpt_for_lightning, fit_once)
        except (OutputDirLocked, BadRowError) as err:  # one line (from one process), not a traceback
            self._one_process_error(err)
        out = self.hf_args.resolved_output_dir
        try:
            save_final_model(model.model, out, datamodule.processing_class, self.hf_args,
                             is_global_zero=self.trainer.is_global_zero,  # every process: the FSDP / ZeRO-3 gather
                             gather=partial(gather_full_weights, self.trainer.strategy))
        except CheckpointWriteError as err:  # a full disk: one line saying what is left, not a traceback
            checkpoint = self.flow.checkpoints.this_runs_checkpoint()
            last = f" This run's last checkpoint: {checkpoint}." if checkpoint else ""
            sys.stderr.write(f"hf-lightning fit: error: {' '.join(str(err).split())}{last}\n")
            sys.exit(1)
        if self.trainer.is_global_zero:
            with open(os.path.join(out, "train_results.json"), "w") as f:
                json.dump(output.metrics, f, indent=2, default=float)
            print(fit_summary(self.flow.state, self.hf_args, train_metrics=output.metrics, model_dir=out,
                              logs=logger_paths(self.trainer), resumed_from=self.flow.resumed_from,
                              written=self.flow.written_steps))

    def _print_plan(self, model: Any, datamodule: Any, request: PlanRequest) -> None:
        """Print the memory plan (and the warning when it does not fit)."""
        datamodule.setup("fit")
        plan = build_memory_plan(model, datamodule, self.hf_args, self._trainer_kwargs, **request.as_kwargs())
        print(memory_plan_line(plan))
        for note in plan.notes:
            print(f"note: {note}")

    def validate(self, model: Any, datamodule: Any, **_: Any) -> None:
        """Evaluate and print the HF metric dict (also written to `<output_dir>/eval_results.json`)."""
        if self._setup_stop is not None:
            self._setup_stop.close()  # the run is built: from here the flow's handlers decide
        try:
            metrics = self.flow.evaluate(self.trainer, model, datamodule, ckpt_path=self.ckpt_for_lightning).metrics
        except BadRowError as err:
            self._one_process_error(err)
        # HF's `epoch` is the evaluating trainer's (0: it trained nothing); here it is the evaluated model's
        epoch = trained_epoch(self._model_folder)
        if epoch is not None:
            metrics["epoch"] = epoch
        elif self._model_folder is not None:
            metrics.pop("epoch", None)  # a saved model of unknown training: not "epoch 0"
        if self.trainer.is_global_zero:
            out = self.hf_args.resolved_output_dir
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "eval_results.json"), "w") as f:
                json.dump(metrics, f, indent=2, default=float)
            print(json.dumps(metrics, default=float))

    def predict(self, model: Any, datamodule: Any, **_: Any) -> None:
        """Predict and write the prediction files to `output_dir` (`cli/prediction_writer.py`); prints their path."""
        if self._setup_stop is not None:
            self._setup_stop.close()  # the run is built: from here the flow's handlers decide
        try:
            result = self.flow.predict(self.trainer, model, datamodule, ckpt_path=self.ckpt_for_lightning)
        except BadRowError as err:
            self._one_process_error(err)
        if self.trainer.is_global_zero:
            output = PredictionOutput(predictions=result.predictions, label_ids=result.label_ids,
                                      metrics=result.metrics)
            path = write_predictions(output, self.hf_args.resolved_output_dir)
            print(f"predictions written to {os.path.abspath(path)}")
            if self.task.generates:
                texts = write_prediction_texts(result, datamodule.processing_class, self.hf_args.resolved_output_dir)
                if texts is not None:
                    print(f"decoded predictions written to {os.path.abspath(texts)}")
