"""The versions a GPU check runs, against the versions CI tests (`constraints-cpu.txt`); see bench/gpu/README.md.

    python bench/gpu/versions.py --json OUT/versions.json [--constraints-out FILE] [--without deepspeed]

Writes, for every package of `VERIFIED`, the tested version (the constraints' pin) and the installed one; `torch` is
recorded but not verified (`NOT_VERIFIED` says why). Exit status 0 when every verified package has the tested version,
3 when one differs (check.sh then reports no parity figure), 2 when the constraints file lacks a pin.

`--constraints-out`: the pins of `VERIFIED` alone, as a pip constraints file for the install from the wheel folder (the
whole file would also pin torch and the image's own numpy, pandas... to versions that cannot travel).

`HF_LIGHTNING_GPU_FAKE_VERSIONS="transformers=5.17.0,tokenizers=0.23.2"`: report those installed versions instead of
the real ones (marked `simulated` in the JSON). tests/test_gpu_check.py uses it to check that a dry run on a machine
image like the GPU's (transformers 5.17) is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints-cpu.txt"

VERIFIED = ("transformers", "tokenizers", "huggingface_hub", "accelerate", "lightning", "lightning-utilities",
            "torchmetrics", "safetensors", "peft", "datasets", "jsonargparse", "torchdata", "deepspeed")
"""The packages whose version decides a figure the check reports: the oracle (`transformers`, with `tokenizers` and
`huggingface_hub`), what hf_lightning trains through (Lightning, torchmetrics, accelerate for the HF side, peft,
DeepSpeed) and what it reads data and settings with (datasets, safetensors, jsonargparse, torchdata)."""

NOT_VERIFIED = {
    "torch": "the machine's CUDA build is used: constraints-cpu.txt pins the CPU wheel, and a CUDA torch (GBs) cannot "
             "travel in the 64 MiB working tree; pyproject.toml allows torch>=2.10. Recorded, not refused.",
}
"""Packages recorded in the JSON but not compared, with why."""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """`name==version` lines of a pip constraints file, by normalised name (comments and blank lines skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[_normal(name)] = version.strip()
    return out


def installed(names: list[str], fake: str | None = None) -> tuple[dict[str, str | None], dict[str, str]]:
    """The installed version of each name (None: not installed), then the simulated ones from `fake`."""
    simulated = {}
    for item in filter(None, (fake or "").split(",")):
        name, _, version = item.partition("=")
        simulated[_normal(name)] = version.strip()
    versions: dict[str, str | None] = {}
    for name in names:
        if name in simulated:
            versions[name] = simulated[name]
            continue
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions, simulated


def report(without: set[str], fake: str | None, constraints: Path = CONSTRAINTS) -> dict:
    """The JSON `main` writes (see the module docstring)."""
    tested = pins(constraints)
    names = [_normal(n) for n in VERIFIED if _normal(n) not in without]
    missing = [n for n in [*names, *NOT_VERIFIED] if n not in tested]
    have, simulated = installed([*names, *NOT_VERIFIED], fake)
    verified = {n: {"tested": tested.get(n), "installed": have[n], "same": have[n] == tested.get(n)} for n in names}
    return {
        "constraints": str(constraints),
        "verified": verified,
        "not_verified": {n: {"tested": tested.get(n), "installed": have[n], "why": why}
                         for n, why in NOT_VERIFIED.items()},
        "differ": [f"{n} {v['installed']} (tested {v['tested']})" for n, v in verified.items() if not v["same"]],
        "unpinned": missing,
        "skipped": sorted(without),
        "simulated": simulated,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--constraints-out")
    parser.add_argument("--without", action="append", default=[], help="a verified package not used in this run")
    options = parser.parse_args()
    result = report({_normal(n) for n in options.without}, os.environ.get("HF_LIGHTNING_GPU_FAKE_VERSIONS"))
    Path(options.json).write_text(json.dumps(result, indent=1))
    if options.constraints_out:
        tested = pins()
        Path(options.constraints_out).write_text("".join(f"{n}=={tested[n]}\n" for n in result["verified"]
                                                         if n in tested))
    for line in result["differ"]:
        print(f"versions: {line}")
    if result["unpinned"]:
        print(f"versions: not pinned in constraints-cpu.txt: {', '.join(result['unpinned'])}")
        return 2
    if result["differ"]:
        print("versions: these differ from constraints-cpu.txt (the versions CI tests): no parity figure is reported")
        return 3
    print(f"versions: {len(result['verified'])} packages as tested ({', '.join(result['verified'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
