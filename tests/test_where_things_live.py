"""README's "Where things live" stays true: every file it names exists and defines the names it gives."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rows() -> list[tuple[str, str, list[str]]]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (.+?) \| `([^`]+\.py)` \| (.+?) \|$", section, flags=re.M)
    return [(behaviour, path, re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", names)) for behaviour, path, names in rows]


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def test_the_section_lists_the_behaviours():
    rows = _rows()
    # the folders say most of it (issue 23): the table keeps the HF behaviours a file name does not tell
    assert 25 <= len(rows) <= 45
    behaviours = " ".join(behaviour for behaviour, _, _ in rows)
    for words in ("cadence", "rotation", "best model", "label smoothing", "generation evaluation", "resume mid-epoch"):
        assert words in behaviours, words


def test_every_folder_it_names_exists():
    text = (REPO / "README.md").read_text()
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    folders = re.findall(r"^\| `(hf_lightning/[a-z0-9_]+/)` \|", section, flags=re.M)
    assert len(folders) >= 10
    assert not [folder for folder in folders if not (REPO / folder).is_dir()]
    # every package folder of hf_lightning is in the folder table
    packages = {f"hf_lightning/{p.name}/" for p in (REPO / "hf_lightning").iterdir() if (p / "__init__.py").is_file()}
    assert packages <= set(folders), sorted(packages - set(folders))


def test_every_file_exists_and_defines_its_names():
    problems = []
    for behaviour, path, names in _rows():
        file = REPO / path
        if not file.is_file():
            problems.append(f"{behaviour}: {path} does not exist")
            continue
        missing = [name for name in names if name not in _defined(file)]
        if not names or missing:
            problems.append(f"{behaviour}: {path} does not define {missing or 'any name'}")
    assert not problems, "\n".join(problems)
