"""No test can hang: every wait of a test on a child process is bounded (issue 21).

Scans the test modules (not tests/scripts/: those are the children) for `subprocess.run` / `check_output` /
`check_call` / `call` without `timeout=`, `.communicate()` / `.wait()` without a timeout, and loops or `readline()`
over a child's stdout (a child that never prints the line blocks the read forever; `helpers.wait_for_line` reads
in a thread with a timeout). A line that is bounded another way says so with a `# bounded:` comment and the reason.
pytest-timeout's per-test limit (pyproject.toml) is the backstop for everything else.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
RUNNERS = {"run", "check_output", "check_call", "call"}


def _unbounded(path: Path) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        where = getattr(node, "lineno", 0)
        if "# bounded:" in lines[where - 1] if where else False:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            keywords = {k.arg for k in node.keywords}
            owner = ast.unparse(node.func.value)
            if owner == "subprocess" and node.func.attr in RUNNERS and "timeout" not in keywords:
                found.append(f"{path.name}:{where}: subprocess.{node.func.attr} without timeout=")
            if node.func.attr in ("communicate", "wait") and not node.args and "timeout" not in keywords:
                found.append(f"{path.name}:{where}: {owner}.{node.func.attr}() without a timeout")
            if node.func.attr == "readline" and "stdout" in owner:
                found.append(f"{path.name}:{where}: {owner}.readline() can block forever")
        if isinstance(node, ast.For) and "stdout" in ast.unparse(node.iter) and "splitlines" not in \
                ast.unparse(node.iter):
            found.append(f"{path.name}:{where}: a loop over {ast.unparse(node.iter)} can block forever")
    return found


def test_every_wait_on_a_child_process_is_bounded():
    found = [problem for path in sorted(TESTS.glob("*.py")) for problem in _unbounded(path)]
    assert not found, "\n".join(found)


def test_the_scan_finds_an_unbounded_read(tmp_path):
    """The scan itself: the shape of the read that hung for 34 minutes (tests/test_async_save.py, before)."""
    sample = tmp_path / "sample.py"
    sample.write_text("import subprocess\np = subprocess.Popen(['x'], stdout=subprocess.PIPE)\n"
                      "for line in p.stdout:\n    pass\np.wait()\nsubprocess.run(['x'])\n")
    assert [problem.split(": ", 1)[1] for problem in _unbounded(sample)] == [
        "a loop over p.stdout can block forever", "p.wait() without a timeout", "subprocess.run without timeout="]
