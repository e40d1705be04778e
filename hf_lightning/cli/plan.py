"""`hf-lightning plan --config <yaml>`: the memory plan of the run `fit` would start, printed instead of training.

The config and its command-line overrides are those of `fit` (the same checks, the same model, data, arguments and
`trainer` section); four options of its own choose what is planned::

    --micro_batch N    samples per device per forward (default: args.per_device_train_batch_size)
    --seq_len N        length of every per-token input (default: the longest training row)
    --budget SIZE      memory per device, bytes or with a unit: 24GiB, 512MiB, 8GB (default: the device's free memory)
    --world_size N     processes sharing the update (default: from the trainer section's devices / num_nodes)

Example: hf-lightning plan --config configs/causal_lm.yaml --micro_batch 8 --budget 24GiB
Every other option is fit's (`hf-lightning fit --help`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["PlanRequest", "parse_plan_options", "parse_size"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}


@dataclass(frozen=True)
class PlanRequest:
    """What `hf-lightning plan` plans (None: the run's own value)."""

    micro_batch: int | None = None
    seq_len: int | None = None
    budget: int | None = None
    world_size: int | None = None

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `trainer.memory_plan.build_memory_plan`."""
        return {"micro_batch": self.micro_batch, "seq_len": self.seq_len, "budget": self.budget,
                "world_size": self.world_size}


def parse_size(text: str) -> int:
    """`"24GiB"` -> 25769803776; `"8GB"` -> 8000000000; `"1000"` -> 1000.

    Raises:
        argparse.ArgumentTypeError: not a number of bytes with one of the units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB.
    """
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"--budget={text!r}: give bytes, or a number with a unit (24GiB, 512MiB, "
                                         "8GB).")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1.")
    return int(text)


def parse_plan_options(argv: list[str]) -> tuple[PlanRequest, list[str]]:
    """The plan's own options, and the rest of the command line (the `fit` config and overrides).

    Raises:
        SystemExit: a malformed option of the plan's (argparse's one-line error, status 2).
    """
    parser = argparse.ArgumentParser(prog="hf-lightning plan", add_help=False, allow_abbrev=False)
    parser.add_argument("--micro_batch", type=_positive)
    parser.add_argument("--seq_len", type=_positive)
    parser.add_argument("--budget", type=parse_size)
    parser.add_argument("--world_size", type=_positive)
    known, rest = parser.parse_known_args(argv)
    return PlanRequest(known.micro_batch, known.seq_len, known.budget, known.world_size), rest
