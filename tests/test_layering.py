"""The layer rule of DESIGN.md, checked on every import statement of the package (function-local and type-only too).

Layers (imports point downward only; a module may import its own layer or a lower one):

- L0 pure rules: the Python standard library only. Argument dataclasses and their validation (types included), the
  "when" rules (cadence), rotation, setup checks, checkpoint folder names / atomic deletion / integrity checks, the
  run lock, weight-file permissions, the HF callback dispatch, the task and config specs, the config's
  data-against-model checks.
- L1 torch / transformers helpers: + torch, numpy, transformers, datasets, safetensors, torchmetrics, pyarrow,
  tokenizers, torchdata. Loss, optimizer, collation, sampling, evaluation accumulation, metrics, checkpoint folder I/O, finding
  a checkpoint, generation helpers, task presets, the classes a config may import, checking `from_pretrained`
  names (huggingface_hub).
- L2 Lightning objects: + lightning. The modules, data modules and callbacks, the Lightning side of checkpoints and
  resume, the contracts between them, the console (filters, progress bar, end-of-fit summary, thread warning), and
  every Lightning internal (`_lightning_compat.py`).
- L3 assembly / facade / CLI: anything. The `Trainer` facades, building the `lightning.Trainer`, the CLI, the
  quickstart, and the lazy package roots that re-export the public names.

Every module must be in `LAYERS` (a new file fails here until it is placed). Import circles are refused too, type-only
ones included. Function-local imports are allowed only in the modules of `LAZY`, each with its reason.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_lightning"

LAYERS: dict[str, int] = {
    # L0: pure rules
    "hf_lightning.args": 0,
    "hf_lightning.args.choices": 0,
    "hf_lightning.args.enums": 0,
    "hf_lightning.args.training_args": 0,
    "hf_lightning.args.validation": 0,
    "hf_lightning.args.from_transformers": 0,
    "hf_lightning.args.support": 0,
    "hf_lightning.args.hf_fields": 0,
    "hf_lightning.args.process": 0,
    "hf_lightning.args.field_types": 0,
    "hf_lightning.args.accelerator_config": 0,
    "hf_lightning.args.report_to": 0,
    "hf_lightning.args.parallel": 0,
    "hf_lightning.args.deepspeed_config": 0,
    "hf_lightning.args.keyword_hints": 0,
    "hf_lightning.run_options.batch_search": 0,
    "hf_lightning.plan": 0,
    "hf_lightning.flow.interruption": 0,
    "hf_lightning.flow.setup_stop": 0,
    "hf_lightning.callbacks": 0,
    "hf_lightning.flow.hf_callbacks": 0,
    "hf_lightning.checkpoint": 0,
    "hf_lightning.checkpoint.checks": 0,
    "hf_lightning.checkpoint.layout": 0,
    "hf_lightning.checkpoint.integrity": 0,
    "hf_lightning.checkpoint.permissions": 0,
    "hf_lightning.checkpoint.run_lock": 0,
    "hf_lightning.checkpoint.rotate": 0,
    "hf_lightning.checkpoint.weight_files": 0,
    "hf_lightning.data": 0,
    "hf_lightning.flow": 0,
    "hf_lightning.module": 0,
    "hf_lightning.run_options": 0,
    "hf_lightning.parallel": 0,
    "hf_lightning.flow.peak_flops": 0,
    "hf_lightning.checkpoint": 0,
    "hf_lightning.seq2seq.args": 0,
    "hf_lightning.tasks": 0,
    "hf_lightning.tasks.checks": 0,
    "hf_lightning.tasks.specs": 0,
    "hf_lightning.tasks.task": 0,
    "hf_lightning.tasks.rewards": 0,
    "hf_lightning.trainer": 0,
    "hf_lightning.trainer.overrides": 0,
    "hf_lightning.cli.plan": 0,
    # L1: torch / transformers helpers
    "hf_lightning.args.readme_map": 1,
    "hf_lightning.flow.throughput": 1,
    "hf_lightning.flow.tokens_seen": 1,
    "hf_lightning.flow.train_log": 1,
    "hf_lightning.checkpoint.adapters": 1,
    "hf_lightning.checkpoint.background": 1,
    "hf_lightning.checkpoint.content": 1,
    "hf_lightning.checkpoint.distributed": 1,
    "hf_lightning.checkpoint.finite": 1,
    "hf_lightning.checkpoint.final_model": 1,
    "hf_lightning.checkpoint.io": 1,
    "hf_lightning.checkpoint.manifest": 1,
    "hf_lightning.checkpoint.verify": 1,
    "hf_lightning.data.collate": 1,
    "hf_lightning.run_options.device_cache": 1,
    "hf_lightning.data.length_grouping": 1,
    "hf_lightning.data.row_checks": 1,
    "hf_lightning.data.sampling": 1,
    "hf_lightning.data.stream_loader": 1,
    "hf_lightning.data.stream_shuffle": 1,
    "hf_lightning.data.stream_state": 1,
    "hf_lightning.checkpoint.stream_position": 1,
    "hf_lightning.checkpoint.elastic": 1,
    "hf_lightning.data.windows": 1,
    "hf_lightning.data.dispatch": 1,
    "hf_lightning.module.eval_run": 1,
    "hf_lightning.module.evaluation": 1,
    "hf_lightning.flow.messages": 1,
    "hf_lightning.module.full_eval": 1,
    "hf_lightning.module.loss": 1,
    "hf_lightning.run_options.activation_checkpointing": 1,
    "hf_lightning.module.metrics": 1,
    "hf_lightning.run_options.neftune": 1,
    "hf_lightning.run_options.micro_batch": 1,
    "hf_lightning.run_options.torch_compile": 1,
    "hf_lightning.model_wrappers": 1,
    "hf_lightning.module.optim": 1,
    "hf_lightning.trainer.hp_search": 1,
    "hf_lightning.run_options.memory_plan": 1,
    "hf_lightning.trainer.model_card": 1,
    "hf_lightning.trainer.accelerate_state": 1,
    "hf_lightning.trainer.rollout_state": 3,
    "hf_lightning.parallel.fsdp2": 1,
    "hf_lightning.cli.prediction_writer": 1,
    "hf_lightning.pretrained_source": 1,
    "hf_lightning.trainer.script_api": 1,
    "hf_lightning.checkpoint.find": 1,
    "hf_lightning.checkpoint.same_run": 1,
    "hf_lightning.checkpoint.changed_settings": 1,
    "hf_lightning.run_options.seeding": 1,
    "hf_lightning.seq2seq.gen_kwargs": 1,
    "hf_lightning.seq2seq.prompts": 1,
    "hf_lightning.tasks.generation": 1,
    "hf_lightning.tasks.hf_callbacks": 1,
    "hf_lightning.callbacks.jit_checkpoint": 1,
    "hf_lightning.tasks.code_paths": 1,
    "hf_lightning.tasks.loading": 1,
    "hf_lightning.tasks.peft_config": 1,
    "hf_lightning.tasks.registry": 1,
    "hf_lightning.tasks.text": 1,
    "hf_lightning.tasks.text_cells": 1,
    "hf_lightning.tasks.text_metrics": 1,
    # L2: Lightning objects
    "hf_lightning._lightning_compat": 2,
    "hf_lightning.flow.preemption": 2,
    "hf_lightning.checkpoint.best": 2,
    "hf_lightning.checkpoint.write": 2,
    "hf_lightning.callbacks.early_stopping": 2,
    "hf_lightning.flow.evaluation": 2,
    "hf_lightning.flow.flow": 2,
    "hf_lightning.callbacks.progress_bar": 2,
    "hf_lightning.callbacks.lightning_console": 2,
    "hf_lightning.flow.steps": 2,
    "hf_lightning.checkpoint.lightning_state": 2,
    "hf_lightning.console": 2,
    "hf_lightning.contracts": 2,
    "hf_lightning.data.datamodule": 2,
    "hf_lightning.module.module": 2,
    "hf_lightning.module.micro_batching": 2,
    "hf_lightning.module.hooks": 2,
    "hf_lightning.checkpoint.sharded": 2,
    "hf_lightning.parallel.lockstep": 2,
    "hf_lightning.parallel.precision": 2,
    "hf_lightning.parallel.runtime": 2,
    "hf_lightning.parallel.oom_agreement": 1,
    "hf_lightning.parallel.strategies": 2,
    "hf_lightning.checkpoint.restore": 2,
    "hf_lightning.checkpoint.lifecycle": 2,
    "hf_lightning.checkpoint.position": 2,
    "hf_lightning.checkpoint.csv_logs": 2,
    "hf_lightning.seq2seq.module": 2,
    "hf_lightning.cli.summary": 2,
    "hf_lightning.tasks.datamodule": 2,
    "hf_lightning.run_options.threads": 2,
    # L3: assembly, facade, CLI
    "hf_lightning": 3,
    "hf_lightning.__main__": 3,
    "hf_lightning.args.to_lightning": 3,
    "hf_lightning.cli": 3,
    "hf_lightning.cli.lightning_cli": 3,
    "hf_lightning.cli.help_cache": 3,
    "hf_lightning.cli.precheck": 3,
    "hf_lightning.cli.config_code": 3,
    "hf_lightning.cli.verify": 3,
    "hf_lightning.cli.file_checks": 3,
    "hf_lightning.cli.trainer_spellings": 3,
    "hf_lightning.cli.library_config": 3,
    "hf_lightning.cli.library_run": 3,
    "hf_lightning.trainer.facade": 3,
    "hf_lightning.trainer.memory_plan": 3,
    "hf_lightning.trainer.as_transformers": 3,
    "hf_lightning.trainer.lightning_trainer": 3,
    "hf_lightning.cli.quickstart": 3,
    "hf_lightning.seq2seq": 3,
    "hf_lightning.seq2seq.trainer": 3,
    "hf_lightning.trainer.accelerator": 3,
    "hf_lightning.trainer.data_hooks": 3,
    "hf_lightning.trainer.eval_loop": 3,
    "hf_lightning.trainer.loop_hooks": 3,
    "hf_lightning.trainer.step_hooks": 3,
}

THIRD_PARTY_LAYER = {
    "typing_extensions": 0,
    "torch": 1, "numpy": 1, "transformers": 1, "datasets": 1, "safetensors": 1, "torchmetrics": 1, "pyarrow": 1,
    "tokenizers": 1, "torchdata": 1, "huggingface_hub": 1, "optuna": 1, "peft": 1, "xxhash": 1, "accelerate": 1, "bitsandbytes": 1,
    "lightning": 2, "deepspeed": 2,
    "jsonargparse": 3, "yaml": 3,
}

DEFERRED_UPWARD = {
    "hf_lightning.args.process": (
        {"torch", "lightning", "transformers"},
        "the process layout scripts read from the arguments comes from torch.distributed once it exists (a runtime "
        "query, made only when a property is read); `hf_lightning.args` itself stays torch-free",
    ),
    "hf_lightning.args.report_to": (
        {"lightning", "mlflow"},
        "the loggers named by `report_to` are built only when a trainer is built",
    ),
}
"""L0 modules that may import these higher-layer packages inside a function (never at module level), and why."""

LAZY = {
    "hf_lightning.trainer.accelerate_state": "accelerate (absent in a bare install) only when a library trainer is "
                                             "built with `use_as_transformers_trainer()`",
    "hf_lightning.module.optim": "HF's optimizer handlers (and bitsandbytes) only for an `optim` HF's code builds",
    "hf_lightning.parallel.runtime": "FSDP2's communication objects (parallel/oom_agreement.py) only for "
                                     "auto_micro_batch under FSDP2",
    "hf_lightning.args.process": DEFERRED_UPWARD["hf_lightning.args.process"][1],
    "hf_lightning.args.report_to": DEFERRED_UPWARD["hf_lightning.args.report_to"][1],
    "hf_lightning.args.hf_fields": "kept as written by the arguments code",
    "hf_lightning.data.sampling": "`datasets` (pandas, pyarrow) only to shard an iterable dataset across processes",
    "hf_lightning.data.stream_loader": "`datasets` and `torchdata` only when the train dataset is an unsized stream",
    "hf_lightning.data.stream_state": "pyarrow / `datasets` only for the Arrow rows and keys of a saved shuffle buffer",
    "hf_lightning.flow.messages": "HF's notebook progress bar needs IPython: imported only inside a notebook",
    "hf_lightning.cli.prediction_writer": "pyarrow only for the per-sample table",
    "hf_lightning.tasks.text_cells": "pyarrow only once a CLI run checks its loaded splits (`import "
                                     "hf_lightning.cli.lightning_cli` stays without it)",
    "hf_lightning.data.row_checks": "pyarrow only to read a `datasets.Dataset`'s columns (`datasets` has imported it)",
    "hf_lightning.trainer.hp_search": "optuna (an extra) only when a search runs",
    "hf_lightning.args.readme_map": "transformers only to print the map; `hf_lightning.args` stays torch-free",
    "hf_lightning.args.to_lightning": "Lightning loggers are built only when `report_to` asks for them, Lightning "
                                      "strategies only when the strategy is not given",
    "hf_lightning.parallel.fsdp2": "torch.distributed's FSDP2 and checkpoint modules only when a model is sharded",
    "hf_lightning.checkpoint.sharded": "torch.distributed.checkpoint and deepspeed only under FSDP1 / ZeRO-3",
    "hf_lightning.parallel.strategies": "FSDP1's torch modules only for `fsdp_config['version'] = 1`, transformers' "
                                        "model class and the FSDP layer lookup only when the model is resolved",
    "hf_lightning.args.training_args": "json only for `to_json_string`",
    "hf_lightning.args.validation": "json only for a `*_kwargs` given as a JSON string",
    "hf_lightning.checkpoint.distributed": "torch.distributed.checkpoint / DTensor only when a model is sharded",
    "hf_lightning.checkpoint.io": "safetensors only for a model without `save_pretrained`",
    "hf_lightning.checkpoint.adapters": "peft (an optional extra) only once a PEFT model's adapter is loaded",
    "hf_lightning.checkpoint.write": "kept as written by the checkpoint code",
    "hf_lightning.cli": "`hf-lightning --help` and the pre-checks answer before torch and Lightning are imported",
    "hf_lightning.cli.precheck": "runs before Lightning is imported: only what a section check needs",
    "hf_lightning.cli.file_checks": "runs before torch is imported: pyarrow only for a Parquet file's columns, "
                                    "huggingface_hub only to name the closest folder of a missing one",
    "hf_lightning.cli.quickstart": "`hf-lightning quickstart --help` answers before the ML stack is imported",
    "hf_lightning.checkpoint.restore": "kept as written by the checkpoint code",
    "hf_lightning.tasks.generation": "the CLI pre-check lists task names without importing transformers",
    "hf_lightning.tasks.hf_callbacks": "classes named in a config are imported when the config is built",
    "hf_lightning.tasks.loading": "the CLI pre-check imports it without loading transformers / datasets",
    "hf_lightning.tasks.code_paths": "imported by `tasks.loading`, which the CLI pre-check imports without "
                                     "transformers: the class checks import it when a config names a class",
    "hf_lightning.checkpoint.run_lock": "`fcntl` exists only on POSIX (elsewhere the O_EXCL lock file alone)",
    "hf_lightning.tasks.peft_config": "peft is an optional extra, imported only when a config has a `peft` section",
    "hf_lightning.tasks.text": "the CLI pre-check lists task names without importing transformers",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """`(imported module, line, function-local)` for every import statement, resolved to absolute names."""
    tree = ast.parse(path.read_text())
    local_lines = {
        node.lineno
        for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            if module == "__future__":
                continue
            # `from pkg import sub` imports the submodule when there is one
            targets = [f"{module}.{alias.name}" for alias in node.names] + [module]
        else:
            continue
        out += [(target, node.lineno, node.lineno in local_lines) for target in targets]
    return out


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The hf_lightning module an import names (the longest known prefix), or None for a third-party one."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _edges() -> dict[str, set[str]]:
    modules = _modules()
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        for target, _, _ in _imports(name, path):
            resolved = _resolve(target, modules)
            # a package importing its own submodule is how a package re-exports; it is not a dependency back
            if resolved is not None and resolved != name and not resolved.startswith(f"{name}."):
                edges.setdefault(name, set()).add(resolved)
    return edges


def test_every_module_has_a_layer():
    missing = sorted(set(_modules()) - set(LAYERS))
    stale = sorted(set(LAYERS) - set(_modules()))
    assert not missing, f"place these modules in tests/test_layering.py LAYERS: {missing}"
    assert not stale, f"LAYERS names modules that no longer exist: {stale}"


def test_imports_point_downward():
    modules = _modules()
    violations = []
    for name, path in modules.items():
        layer = LAYERS[name]
        for target, line, local in _imports(name, path):
            resolved = _resolve(target, modules)
            if resolved is not None:
                if resolved != name and not resolved.startswith(f"{name}.") and LAYERS[resolved] > layer:
                    violations.append(f"{path.name}:{line} {name} (L{layer}) imports {resolved} (L{LAYERS[resolved]})")
                continue
            top = target.split(".")[0]
            if top == "hf_lightning" or top in sys.stdlib_module_names:
                continue
            allowed = THIRD_PARTY_LAYER.get(top)
            if local and top in DEFERRED_UPWARD.get(name, (set(), ""))[0]:
                continue
            if allowed is None:
                violations.append(f"{path.name}:{line} {name} imports {top}, which THIRD_PARTY_LAYER does not place")
            elif allowed > layer:
                violations.append(f"{path.name}:{line} {name} (L{layer}) imports {top} (L{allowed})")
    assert not violations, "\n".join(violations)


def test_no_import_circles():
    """Tarjan's strongly connected components over runtime and type-only imports."""
    edges = _edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(_modules()):
        if node not in index:
            visit(node)
    assert not circles, f"import circles: {circles}"


def test_function_local_imports_only_where_laziness_is_needed():
    modules = _modules()
    unexplained = sorted(
        f"{path.name}:{line} imports {target}"
        for name, path in modules.items() if name not in LAZY
        for target, line, local in _imports(name, path) if local
    )
    assert not unexplained, "move these imports to the top of the module (or add the module to LAZY, with why):\n" \
        + "\n".join(unexplained)
    assert set(LAZY) <= set(modules)


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    """The parser itself: a local relative import resolves to the absolute module and is marked local."""
    source = tmp_path / "mod.py"
    source.write_text("import os\n\ndef f():\n    from .evaluation import EvalStep\n"
                      "    from hf_lightning import module\n")
    found = _imports("hf_lightning.callbacks.mod", source)
    assert ("os", 1, False) in found
    assert ("hf_lightning.callbacks.evaluation.EvalStep", 4, True) in found
    assert ("hf_lightning.module", 5, True) in found


@pytest.mark.parametrize("code, heavy", [
    ("import hf_lightning", ["torch", "lightning", "transformers"]),
    ("import hf_lightning.args as a; a.TrainingArguments()", ["torch", "lightning", "transformers"]),
    ("from hf_lightning.cli import main; main(['--help'])", ["torch", "lightning", "transformers"]),
    # the facade and the CLI's parser need none of the data stack (it comes with the data, when the data is loaded)
    ("from hf_lightning import Trainer, Seq2SeqTrainer, HFTrainerFlow", ["datasets", "pandas", "pyarrow"]),
    ("import hf_lightning.cli.lightning_cli", ["datasets", "pandas", "pyarrow"]),
    # no model code either; but with peft installed, transformers' own `trainer_utils` (behind `set_seed`) imports
    # peft, which imports it: hide peft for this check (`find_spec` answers None for a None entry)
    ("sys.modules['peft'] = None; import hf_lightning.cli.lightning_cli", ["transformers.modeling_utils"]),
])
def test_light_entry_points_stay_light(code, heavy):
    """The package root, the arguments and `hf-lightning --help` load none of the ML stack."""
    probe = f"import sys; {code}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "[]"
