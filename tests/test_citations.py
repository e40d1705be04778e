"""Every citation of an HF source in the code can be checked: its form is in docs/hf_sources.md's legend, its lines
exist in the cited transformers file, and no citation points at a document outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import transformers

REPO = Path(__file__).resolve().parents[1]
LEGEND = (REPO / "docs" / "hf_sources.md").read_text()
SCANNED = [p for folder in ("hf_lightning", "tests", "bench") for p in sorted((REPO / folder).rglob("*.py"))]
SCANNED += [REPO / "README.md", *sorted((REPO / "configs").glob("*.yaml"))]

LINE_CITATION = re.compile(r"\b([A-Z][A-Z0-9]*):(\d+(?:-\d+)?(?:,\s*\d+(?:-\d+)?)*)")
OUTSIDE_DOCUMENTS = re.compile(r"\bspec (?:section )?\d|\[obs [a-z]|\bobs [a-z]\d|\bfindings [A-Z]\d|reference/")


def _legend() -> dict[str, str]:
    """`{form: file}` from the legend's table rows ("| `T:<lines>` | `transformers/trainer.py` | ...")."""
    rows = re.findall(r"^\| `([A-Z][A-Z0-9]*):<lines>` \| `transformers/([a-z0-9_]+\.py)`", LEGEND, flags=re.M)
    return dict(rows)


def _citations() -> list[tuple[str, str, str]]:
    """`(where, form, lines)` of every line citation in the code, tests, README and configs."""
    found = []
    for path in SCANNED:
        if path.name == Path(__file__).name:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found += [(f"{path.relative_to(REPO)}:{number}", m[1], m[2]) for m in LINE_CITATION.finditer(line)]
    return found


def test_the_legend_names_the_version_and_the_forms():
    version = re.search(r"\*\*transformers (\d+\.\d+\.\d+)\.\*\*", LEGEND)
    assert version, "docs/hf_sources.md must name the transformers version of its line numbers"
    assert set(_legend()) >= {"T", "TA", "TU", "CB", "S2S", "S2SA"}


def test_every_citation_form_is_in_the_legend():
    forms = _legend()
    unknown = [f"{where}: {form}:{lines}" for where, form, lines in _citations() if form not in forms]
    assert not unknown, "add these citation forms to docs/hf_sources.md:\n" + "\n".join(unknown)
    assert len(_citations()) > 50  # the scan sees the code's citations


def test_no_citation_points_outside_the_repository():
    outside = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in SCANNED if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE_DOCUMENTS.search(line)
    ]
    assert not outside, "cite the HF source (docs/hf_sources.md) or put the text in docs/:\n" + "\n".join(outside)


def test_cited_lines_exist_in_the_cited_file():
    version = re.search(r"\*\*transformers (\d+\.\d+\.\d+)\.\*\*", LEGEND)
    if version is None or transformers.__version__ != version[1]:
        pytest.skip(f"line numbers are for transformers {version[1] if version else '?'}, "
                    f"{transformers.__version__} is installed")
    root = Path(transformers.__file__).parent
    lengths = {form: len((root / file).read_text().splitlines()) for form, file in _legend().items()}
    wrong = []
    for where, form, lines in _citations():
        for part in re.split(r",\s*", lines):
            first, _, last = part.partition("-")
            if not 1 <= int(first) <= int(last or first) <= lengths[form]:
                wrong.append(f"{where}: {form}:{part} (the file has {lengths[form]} lines)")
    assert not wrong, "\n".join(wrong)


def _pins() -> dict[str, str]:
    """`{name: version}` of constraints-cpu.txt (names normalised as pip does)."""
    pins = {}
    for line in (REPO / "constraints-cpu.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_the_tested_versions_agree_with_the_citations_and_the_package_ranges():
    """The citations' transformers release is the one constraints-cpu.txt pins (the tested one), and every pin lies in
    the range pyproject.toml asks for (so the README's install commands resolve to what CI tests)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement

    pins = _pins()
    assert pins["transformers"] == re.search(r"\*\*transformers (\d+\.\d+\.\d+)\.\*\*", LEGEND)[1]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values()
                                                for r in extra)]
    checked = 0
    for text in requirements:
        req = Requirement(text)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"constraints-cpu.txt does not pin {req.name}"
        assert req.specifier.contains(pins[name]), f"{req.name}=={pins[name]} is outside {text!r}"
        checked += 1
    assert checked > 20
