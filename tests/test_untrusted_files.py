"""Nothing in an output folder or a model folder runs code (issue 29, items 1 and 2, the cheap half).

- No pickle from a folder the run did not just write is unpickled with `weights_only=False`: the package is read
  (AST) for every `torch.load` / `pickle.load`; each `torch.load` says `weights_only=True`, no `pickle.load` exists.
- An earlier run's `training_args.bin` whose `__reduce__` writes a file, in a folder whose manifest the attacker
  rewrote to match (the manifest is a checksum, not a signature): the "holds checkpoints of an earlier run" notice
  reads it through the allow-list, so nothing runs and the notice says "an earlier run".
- The whole runs (facade and CLI) with such a folder: tests/test_preemption.py (SIGTERM into an output_dir with an
  earlier run's checkpoint) and tests/test_cli.py (fit into an output_dir with checkpoints).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import torch

import hf_lightning
from hf_lightning.checkpoint.find import replaced_checkpoints_notice
from hf_lightning.checkpoint.manifest import write_manifest

PACKAGE = Path(hf_lightning.__file__).parent


class WritesAFile:
    """A pickle that creates `path` when it is loaded (`open(path, "w")` is what unpickling calls)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _calls(tree: ast.AST, module: str, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == name and isinstance(node.func.value, ast.Name) and node.func.value.id == module]


def test_no_pickle_in_the_package_is_loaded_without_weights_only():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if "weights_only=False" in text.replace(" ", ""):
            offenders.append(f"{path.relative_to(PACKAGE)}: weights_only=False")
        tree = ast.parse(text)
        for call in _calls(tree, "torch", "load"):
            flags = [k.value for k in call.keywords if k.arg == "weights_only"]
            if not (flags and isinstance(flags[0], ast.Constant) and flags[0].value is True):
                offenders.append(f"{path.relative_to(PACKAGE)}:{call.lineno}: torch.load without weights_only=True")
        for name in ("load", "loads", "Unpickler"):
            offenders += [f"{path.relative_to(PACKAGE)}:{c.lineno}: pickle.{name}"
                          for c in _calls(tree, "pickle", name)]
    assert offenders == []


def test_an_earlier_runs_pickle_with_a_forged_manifest_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    folder = tmp_path / "out" / "checkpoint-6"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 6}))
    torch.save(WritesAFile(marker), folder / "training_args.bin")
    write_manifest(folder, 6)  # the attacker rewrote the manifest: the folder verifies
    args = hf_lightning.TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none")
    notice = replaced_checkpoints_notice(tmp_path / "out", None, True, args)
    assert not marker.exists()  # (before: the pickle ran here, torch.load(weights_only=False))
    assert notice is not None and "holds checkpoints of an earlier run;" in notice
