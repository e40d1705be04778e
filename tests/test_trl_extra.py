"""Without TRL installed, the README's TRL commands stop at once with one line naming the `trl` extra.

Before: `examples/run_sft.py` and `hf-lightning fit --config configs/sft.yaml` loaded torch, transformers and
Lightning (110-145 s on a loaded machine), then failed with `No module named 'trl'` and no install hint.

TRL is made unimportable in the child only: a `sitecustomize.py` on its PYTHONPATH puts `None` in `sys.modules` for
`trl` (what Python does for a module that cannot be imported: `import trl` fails, `find_spec("trl")` finds nothing),
and for `torch` too, so that the error must come before torch is loaded (no timing needed to show "early").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXTRA = 'pip install "hf-lightning[trl]"'


@pytest.fixture
def without_trl(tmp_path) -> dict[str, str]:
    """The environment of a child in which neither trl nor torch can be imported."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['trl'] = None\nsys.modules['torch'] = None\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")])}


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_trl_extra_is_the_series_the_parity_tests_ran():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    trl = [r for r in project["optional-dependencies"]["dev"] if r.startswith("trl")]
    assert project["optional-dependencies"]["trl"] == trl == ["trl>=1.16,<1.17"]


def test_run_sft_without_trl_is_one_line_naming_the_extra(without_trl, tmp_path):
    result = _run([str(REPO / "examples" / "run_sft.py"), "--output_dir", str(tmp_path / "out")], without_trl,
                  tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == f"run_sft.py needs TRL, which is not installed: {EXTRA}"


@pytest.mark.parametrize("config", ["configs/sft.yaml", "task_sft"])
def test_cli_fit_without_trl_is_one_line_naming_the_extra(config, without_trl, tmp_path):
    if config == "task_sft":  # the short form: `task: sft` stands for trl.SFTTrainer / trl.SFTConfig
        text = (REPO / "configs" / "sft.yaml").read_text()
        text = text.replace("trainer_class: trl.SFTTrainer", "task: sft").replace("args_class: trl.SFTConfig", "")
        (tmp_path / "sft_task.yaml").write_text(text)
        config = str(tmp_path / "sft_task.yaml")
    result = _run(["-m", "hf_lightning", "fit", "--config", config, "--args.output_dir", str(tmp_path / "out")],
                  without_trl, REPO)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].endswith(f"error: trainer_class='trl.SFTTrainer' needs the trl package, which is not installed: "
                             f"{EXTRA}."), lines[0]
