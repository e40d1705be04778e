"""notebooks/03_generation_evaluation.ipynb runs top to bottom (few steps) with this checkout, and is committed
without outputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "03_generation_evaluation.ipynb"


def test_notebook_is_committed_without_outputs() -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def test_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    repo = str(Path(__file__).parents[1])
    # The kernel is a child process. jupyter_client starts a kernelspec whose argv[0] is "python" with
    # `sys.executable` (this interpreter); PYTHONPATH puts this checkout first; few steps keep it short.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HFL_NOTEBOOK_STEPS", "6")
    monkeypatch.setenv("HFL_NOTEBOOK_OUTPUT", str(tmp_path / "out"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "eval_exact_match" in text and "train/loss" in text
    assert (tmp_path / "out" / "curves_log_history.png").stat().st_size > 1000
    assert (tmp_path / "out" / "curves_tensorboard.png").stat().st_size > 1000
