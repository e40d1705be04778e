"""The `hf-lightning` command.

`hf-lightning quickstart` runs the bundled quickstart. `hf-lightning fit|validate|predict --config <yaml>` is the
LightningCLI entry point (see `cli_app.py`). Heavy modules are imported only once a subcommand needs them, so
`--help` stays fast.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

_USAGE = """usage: hf-lightning {quickstart,fit,validate,predict} [options]

  quickstart   train a tiny BERT on a generated sentiment task (CPU, a couple of minutes, no downloads)
  fit          train from a YAML config (LightningCLI; `hf-lightning fit --help` lists every option)
  validate     evaluate from a YAML config (prints the metrics, writes eval_results.json)
  predict      predict from a YAML config (writes predictions.npz in args.output_dir)

example:
  hf-lightning fit --config configs/text_classification.yaml --args.max_steps 50 --trainer.devices 2 \\
      --trainer.strategy ddp
"""


def main(argv: list[str] | None = None) -> None:
    """Dispatch to the quickstart or the LightningCLI subcommands."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE)
        return
    if args[0] == "quickstart":
        from hf_lightning.quickstart import main as quickstart

        quickstart(args[1:])
        return
    if args[0] in ("fit", "validate", "predict"):
        try:
            from hf_lightning.cli_app import run_cli
        except ImportError:  # pragma: no cover - until the YAML CLI lands
            sys.exit("hf-lightning: the YAML subcommands are not available in this version; try `quickstart`.")
        run_cli(args)
        return
    sys.exit(f"hf-lightning: unknown command {args[0]!r}\n{_USAGE}")


if __name__ == "__main__":
    main()
