"""The notebooks run top to bottom (small step counts), so they cannot rot. They are committed without outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["01_quickstart.ipynb", "02_migrating_from_transformers_trainer.ipynb"]


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A kernel spec for THIS interpreter, and PYTHONPATH pointing at this checkout (the kernel is a subprocess)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("HF_LIGHTNING_NB_MAX_STEPS", "8")
    monkeypatch.setenv("HF_LIGHTNING_NB_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_without_outputs(name):
    notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, kernel_env, tmp_path):
    notebook = nbformat.read(REPO / "notebooks" / name, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "\n".join(str(o.get("text", o.get("data", ""))) for c in notebook.cells if c.cell_type == "code"
                     for o in c.outputs)
    import importlib.util

    if importlib.util.find_spec("ipywidgets") is not None:  # the dev / notebook extras install it
        assert "IProgress not found" not in text  # tqdm's notebook bars need ipywidgets
    if name.startswith("01"):
        assert "checkpoint-8" in text and "BertForSequenceClassification" in text
    else:
        assert "same losses and metrics" in text
