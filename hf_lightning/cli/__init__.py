"""The `hf-lightning` command: `quickstart`, `verify PATH` (checkpoints, `cli/verify.py`),
`fit|validate|predict --config <yaml>` (a `LightningCLI`), and `plan --config <yaml>` (the memory plan of the run
`fit` would start, `cli/plan.py`).

A config has these sections::

    task: text_classification      # a name from hf_lightning.tasks.registry
    args: {...}                    # HF TrainingArguments (names, defaults and meaning of transformers')
    model: {...}                   # ModelSpec: model_name_or_path, or config_class + config_kwargs
    data: {...}                    # DataSpec: files or dataset_name, tokenizer, columns, lengths
    trainer: {...}                 # lightning.Trainer: strategy, devices, precision, logger, callbacks...
    hf_callbacks: [...]            # optional: transformers.TrainerCallback class paths (tasks/hf_callbacks.py)
    allow_code_from: [...]         # optional: your packages, from which a config may import code (by default:
                                   # classes of lightning, torch, torchmetrics, transformers, peft, hf_lightning;
                                   # config_class / auto_class / hf_callbacks: transformers only; cli/config_code.py)
    peft: {...}                    # optional: a LoRA adapter, peft.LoraConfig fields (tasks/peft_config.py)
    eval_loss_weighting: samples   # optional: HF's eval_loss ("samples") or the per-token mean ("tokens")

A config may instead name a library's `transformers.Trainer` subclass (`trainer_class: trl.SFTTrainer`,
`args_class: trl.SFTConfig`, or `task: sft`): `library_config` checks it before torch is imported and
`library_run` runs it on hf_lightning (`use_as_transformers_trainer`, then `train()` / `evaluate()`).

- `precheck`: the `task` / `args` / `model` / `data` sections checked before Lightning is imported.
- A pre-empted `fit` (SIGTERM, SIGUSR1) ends with status 143 / 138 (`hf_lightning.TrainingPreempted`), Ctrl-C with
  130; both print one line naming the last complete checkpoint and the `--ckpt_path` that resumes it.
- `lightning_cli`: `HFLightningCLI`, which builds the model, data module, `HFTrainerFlow` and `lightning.Trainer`
  with the same functions as the `hf_lightning.Trainer` facade (`trainer/lightning_trainer.py`,
  `args/to_lightning.py`), so both behave the same. Lightning options the HF arguments decide
  (`trainer.max_steps`...) move to the `args.` key of the same meaning or are refused naming what to set
  (`trainer_spellings`). Errors in the config end the run with one `error:` line, not a traceback.
- `file_checks`: mistakes the files alone show (columns, folders, missing evaluation data), before torch is imported.

Heavy modules are imported only once a subcommand needs them, so `--help` stays fast.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_lightning.cli.plan import PlanRequest

__all__ = ["main", "run_cli"]

_USAGE = """usage: hf-lightning {quickstart,fit,validate,predict,verify,plan} [options]

  quickstart   train a tiny BERT on a generated sentiment task (CPU, well under a minute, no downloads)
  fit          train from a YAML config (LightningCLI; `hf-lightning fit --help` lists every option)
  validate     evaluate from a YAML config (prints the metrics, writes eval_results.json)
  predict      predict from a YAML config (writes predictions.npz in args.output_dir)
  verify       check checkpoint folders against their manifests (`hf-lightning verify OUTPUT_DIR`)
  plan         print the memory plan of the run `fit` would start (same config; --micro_batch, --seq_len,
               --budget 24GiB, --world_size), without training

example:
  hf-lightning fit --config configs/text_classification.yaml --args.max_steps 50 --trainer.devices 2 \\
      --trainer.strategy ddp
"""


def run_cli(argv: list[str] | None = None, plan_request: PlanRequest | None = None) -> Any:
    """Run `fit|validate|predict` with `argv` (the command line after `hf-lightning`); returns the CLI object.

    A bare `<subcommand> --help` is printed from `help_cache` when it was rendered before with the same code.
    `plan_request` (a `cli.plan.PlanRequest`, with `fit`): print the run's memory plan instead of training.
    """
    from hf_lightning.cli.help_cache import cache_key, cached_help, store_help

    argv = list(sys.argv[1:] if argv is None else argv)
    text = cached_help(argv)
    if text is not None:
        sys.stdout.write(text)
        sys.exit(0)  # what the parser does after printing its help
    from hf_lightning.cli.config_code import ConfigCodeError, check_config_code, enforce_in_parser
    from hf_lightning.cli.precheck import fail, precheck

    try:  # first: nothing a config names is imported before its module is known to be allowed
        allowed = check_config_code(argv[1:], subcommand=argv[0] if argv else None)
    except ConfigCodeError as err:
        fail(err, prog=f"hf-lightning {argv[0]}" if argv else "hf-lightning")
    from hf_lightning.cli.library_config import is_library_config, read_library_config

    if argv and argv[0] in ("fit", "validate", "predict") and is_library_config(argv[1:]):
        # a config naming a library trainer (TRL's SFTTrainer): checked here, before torch is imported
        try:
            config = read_library_config(argv[0], argv[1:])
        except (ValueError, OSError) as err:
            fail(err, prog=f"hf-lightning {argv[0]}")
        from hf_lightning.cli.library_run import run_library_config

        return run_library_config(config)
    precheck(argv[1:], subcommand=argv[0] if argv else "fit")
    enforce_in_parser(allowed)
    from hf_lightning.flow.setup_stop import SetupStop

    # a SIGTERM while the data is loaded and checked and the model built: the stop line and 143, not a silent death
    # (closed when the subcommand starts; `fit` installs its own until Lightning's handlers take over)
    setup_stop = SetupStop("the same command and --ckpt_path {path}", lambda: _resumed_folder(argv))
    from hf_lightning.cli.lightning_cli import HFLightningCLI

    def build() -> Any:
        # LightningCLI reads sys.argv itself when it is our command line (it warns when given both).
        with setup_stop:
            return HFLightningCLI(args=None if argv == sys.argv[1:] else argv, subcommand=argv[0] if argv else None,
                                  setup_stop=setup_stop, plan_request=plan_request)

    if cache_key(argv) is None or plan_request is not None:
        return build()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            return build()
    except SystemExit as done:
        if done.code in (0, None):
            store_help(argv, captured.getvalue())
        raise
    finally:
        sys.stdout.write(captured.getvalue())


def _resumed_folder(argv: list[str]) -> str | None:
    """The checkpoint folder `fit --ckpt_path` resumes from (the last complete checkpoint of a run stopped before
    its first update), else None."""
    if not argv or argv[0] != "fit":
        return None
    folder = None
    for i, token in enumerate(argv):
        if token == "--ckpt_path" and i + 1 < len(argv):
            folder = argv[i + 1]
        elif token.startswith("--ckpt_path="):
            folder = token.split("=", 1)[1]
    return folder if folder and os.path.isdir(folder) else None


def main(argv: list[str] | None = None) -> None:
    """Dispatch to the quickstart or the LightningCLI subcommands."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE)
        return
    if args[0] == "quickstart":
        from hf_lightning.cli.quickstart import main as quickstart

        quickstart(args[1:])
        return
    if args[0] == "verify":
        from hf_lightning.cli.verify import verify_main

        sys.exit(verify_main(args[1:]))
    if args[0] == "plan":
        from hf_lightning.cli import plan

        if {"-h", "--help"} & set(args[1:]):  # the plan's own options; `fit --help` lists the config's
            print(plan.__doc__)
            return
        request, rest = plan.parse_plan_options(args[1:])
        run_cli(["fit", *rest], plan_request=request)
        return
    if args[0] in ("fit", "validate", "predict"):
        try:
            run_cli(args)
        except KeyboardInterrupt:
            # Ctrl-C: the run printed the line naming the last complete checkpoint and how to resume; no traceback
            sys.exit(130)  # what a shell reports for a process ended by SIGINT
        return
    sys.exit(f"hf-lightning: unknown command {args[0]!r}\n{_USAGE}")


if __name__ == "__main__":
    main()
