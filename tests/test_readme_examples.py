"""Every code block of README.md runs as written, so the README cannot drift from the code.

How the README's blocks are read (new blocks are picked up automatically):

- ```python blocks run in README order in one Python process, one namespace for all of them (like a notebook), in a
  temporary copy of the repository (the examples read `configs/data/` and write their output folders there).
  Blocks folded in `<details>` are ordinary blocks: they run too.
- ```bash blocks run line by line, in README order, in another temporary copy, with the installed package
  (`hf-lightning` on `PATH`) and `OMP_NUM_THREADS=1`. A line may use what earlier lines wrote. Install steps
  (`python3 -m venv ...`, `. .venv/bin/activate`, `pip install ...`) are left out of `&&` chains: the test runs in the
  installed environment. A `python -m pytest ...` line runs with `--collect-only` (it must select tests; running the
  suite inside itself would recurse).
- A line that ends with `# GPU` needs GPUs: it is only checked to parse (`--print_config`); its CPU twin is the line
  next to it. A GPU variant inside a Python block is a commented line next to the CPU one.
- A block preceded by `<!-- readme-test: skip: <reason> -->` is not run; the reason is required.
- Blocks in other languages (`text`, `yaml`...) show output or excerpts and are not run.

Two tiers: the default one runs the Python blocks as written and the bash lines with few updates (`fit` lines get
`--args.max_steps 2`, the quickstart `--max_steps 2 --train_size 64`, evaluations at most 32 rows); the `slow` one
runs every line exactly as written (`tests/conftest.py` `SLOW`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RUN_LANGUAGES = ("python", "bash")
SKIP = re.compile(r"<!--\s*readme-test:\s*skip:\s*(?P<reason>.*?)\s*-->")
INSTALL_STEPS = ("python3 -m venv", "python -m venv", ". .venv/bin/activate", "source .venv/bin/activate",
                 "pip install")
FAST = {
    "fit": ["--args.max_steps", "2", "--data.max_eval_samples", "32"],
    "validate": ["--data.max_eval_samples", "32"],
    "predict": ["--data.max_eval_samples", "32"],
    "quickstart": ["--max_steps", "2", "--train_size", "64"],
}


@dataclass
class Block:
    """A fenced code block of the README: its language, first code line (1-based) and text."""

    language: str
    line: int
    code: str
    skip_reason: str | None


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block, with the skip marker of the line before its fence (blank lines in between allowed)."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = SKIP.search(previous)
        start = i + 1
        end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
        indent = len(fence.group(1))
        code = "\n".join(line[indent:] for line in lines[start:end])
        blocks.append(Block(fence.group(2), start + 1, code, marker.group("reason") if marker else None))
        i = end + 1
    return blocks


def _commands(code: str) -> list[str]:
    """The command lines of a bash block: continuations joined, blank and comment-only lines dropped."""
    commands, current = [], ""
    for line in code.splitlines():
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip() and not current.strip().startswith("#"):
            commands.append(current.strip())
        current = ""
    return commands


def shell_line(command: str, fast: bool) -> str | None:
    """What the test runs for one README command line (None: nothing to run)."""
    comment = re.search(r"\s#(?P<text>.*)$", command)  # a shell comment: " #" to the end of the line
    body = command[:comment.start()].strip() if comment else command.strip()
    gpu = comment is not None and comment.group("text").strip() == "GPU"
    steps = [s.strip() for s in body.split("&&")]
    steps = [s for s in steps if not s.startswith(INSTALL_STEPS)]
    if not steps:
        return None
    out = []
    for step in steps:
        main, redirect = (step.split(" > ", 1) + [""])[:2] if " > " in step else (step, "")
        words = main.split()
        extra: list[str] = []
        if words[:3] == ["python", "-m", "pytest"]:
            extra = ["--collect-only"]
        elif words and words[0] == "hf-lightning":
            sub = words[1] if len(words) > 1 else ""
            if gpu:
                extra = ["--print_config"]
            elif fast and "--help" not in words:
                extra = FAST.get(sub, [])
        main = " ".join([main, *extra])
        out.append(f"{main} > {redirect}" if redirect else main)
    return " && ".join(out)


def _copy_repository(destination: Path) -> Path:
    """The repository's files (tracked and new, not ignored) under `destination/repo`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            text=True, check=True, timeout=60).stdout.splitlines()
    root = destination / "repo"
    for name in listed:
        source = REPO / name
        if source.is_file():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return root


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


BLOCKS = readme_blocks(README.read_text())


def test_blocks_are_found_and_skips_give_a_reason():
    runnable = [b for b in BLOCKS if b.language in RUN_LANGUAGES]
    assert sum(b.language == "python" for b in runnable) >= 4 and sum(b.language == "bash" for b in runnable) >= 3
    for block in BLOCKS:
        if block.skip_reason is not None:
            assert block.skip_reason.strip(), f"README.md:{block.line}: a skip marker needs a reason"
    gpu_lines = [c for b in runnable if b.language == "bash" for c in _commands(b.code) if c.endswith("# GPU")]
    assert gpu_lines, "the README shows a GPU command (marked `# GPU`) next to its CPU twin"


def test_shell_line_rules():
    assert shell_line("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && hf-lightning quickstart",
                      fast=True) == "hf-lightning quickstart --max_steps 2 --train_size 64"
    assert shell_line("pip install -e .", fast=True) is None
    assert shell_line('python -m pytest -m "not slow" -q', fast=False) == \
        'python -m pytest -m "not slow" -q --collect-only'
    assert shell_line("hf-lightning fit --config a.yaml --print_config > my.yaml   # note", fast=True) == \
        "hf-lightning fit --config a.yaml --print_config --args.max_steps 2 --data.max_eval_samples 32 > my.yaml"
    assert shell_line("hf-lightning fit --config my.yaml --trainer.devices 8  # GPU", fast=False) == \
        "hf-lightning fit --config my.yaml --trainer.devices 8 --print_config"
    assert shell_line("hf-lightning fit --help   # every option", fast=True) == "hf-lightning fit --help"
    assert shell_line("hf-lightning validate --config a.yaml", fast=False) == "hf-lightning validate --config a.yaml"


def _run_python_blocks(tmp_path: Path) -> str:
    blocks = [b for b in BLOCKS if b.language == "python" and b.skip_reason is None]
    # padded with newlines so that a traceback names the README's own line numbers
    payload = [{"line": b.line, "code": "\n" * (b.line - 1) + b.code} for b in blocks]
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps(payload))
    driver = (
        "import json, sys\n"
        "namespace = {'__name__': '__main__'}\n"
        "for block in json.load(open(sys.argv[1])):\n"
        "    print(f'### README.md:{block[\"line\"]}', flush=True)\n"
        "    exec(compile(block['code'], 'README.md', 'exec'), namespace)\n"
    )
    root = _copy_repository(tmp_path)
    result = subprocess.run([sys.executable, "-c", driver, str(spec)], cwd=root, env=_env(), capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    # the hand-built `lightning.Trainer` examples pass `max_epochs=-1` (the flow sets the limits from `args`)
    assert "`max_epochs` was not set" not in result.stderr + result.stdout
    ran = re.findall(r"### README.md:(\d+)", result.stdout)
    assert [int(n) for n in ran] == [b.line for b in blocks]
    return result.stdout


@pytest.mark.timeout(2400)  # one child for every block (its own limit: 1800 s)
def test_python_blocks_run_as_written(tmp_path):
    """...and the examples visibly learn: the first one's dev accuracy beats the majority class of its dev set, the
    Seq2SeqTrainer one's exact match (printed per epoch) rises from 0 to the README's 1.0 in the last epoch (on every
    CPU measured; the epochs before depend on the CPU's vector instructions)."""
    from hf_lightning.cli.quickstart import make_sentiment_dataset

    stdout = _run_python_blocks(tmp_path)
    dev_labels = make_sentiment_dataset(256, seed=1)["label"]
    majority = max(sum(dev_labels), len(dev_labels) - sum(dev_labels)) / len(dev_labels)
    accuracy = float(re.search(r"'eval_dev_accuracy': ([0-9.]+)", stdout)[1])
    assert accuracy > majority + 0.1, (accuracy, majority)
    exact = [float(x) for x in re.findall(r"^\[([0-9., ]+)\]$", stdout, flags=re.M)[-1].split(",")]
    assert exact[0] == 0.0 and exact[-1] == 1.0 and len(exact) == 6, exact


def _run_bash_blocks(tmp_path: Path, fast: bool) -> list[tuple[str, str]]:
    root = _copy_repository(tmp_path)
    ran = []
    for block in (b for b in BLOCKS if b.language == "bash" and b.skip_reason is None):
        for command in _commands(block.code):
            line = shell_line(command, fast)
            if line is None:
                continue
            result = subprocess.run(["bash", "-c", line], cwd=root, env=_env(), capture_output=True, text=True,
                                    timeout=1800)
            assert result.returncode == 0, (f"README.md block at line {block.line}: `{command}` ran as `{line}` and "
                                            f"failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
            ran.append((command, result.stdout))
    return ran


@pytest.mark.timeout(3600)  # one child per command (each limited to 1800 s)
def test_bash_blocks_run_in_order_with_few_updates(tmp_path):
    ran = _run_bash_blocks(tmp_path, fast=True)
    fits = [out for command, out in ran if command.startswith("hf-lightning fit") and "--help" not in command
            and "--print_config" not in command and not command.endswith("# GPU")]
    assert fits and all("Training done: 2 updates" in out for out in fits)


def quickstart_ranges(text: str) -> dict[str, tuple[float, float]]:
    """The ranges the README gives for the quickstart's final metrics on x86-64 CPUs (`{metric: (low, high)}`)."""
    found = re.search(r"eval_accuracy ([0-9.]+) to ([0-9.]+) and eval_loss ([0-9.]+) to ([0-9.]+)", text)
    assert found, "README.md states the ranges of the quickstart's metrics across CPUs"
    low_acc, high_acc, low_loss, high_loss = map(float, found.groups())
    return {"eval_accuracy": (low_acc, high_acc), "eval_loss": (low_loss, high_loss)}


@pytest.mark.timeout(3600)  # one child per command (each limited to 1800 s)
def test_bash_blocks_run_exactly_as_written(tmp_path):
    ran = _run_bash_blocks(tmp_path, fast=False)
    # the README's first command (3 epochs, the run whose figures the README shows), not its later one-epoch runs
    quickstart = [out for command, out in ran if command.rstrip().endswith("&& hf-lightning quickstart")]
    assert len(quickstart) == 1
    # the README's figures are true on this CPU too: its final metrics lie in the ranges it gives
    final = re.search(r"^Final model: eval_loss ([0-9.]+), eval_accuracy ([0-9.]+)$", quickstart[0], flags=re.M)
    assert final, quickstart[0][-2000:]
    got = {"eval_loss": float(final[1]), "eval_accuracy": float(final[2])}
    for metric, (low, high) in quickstart_ranges(README.read_text()).items():
        assert low <= got[metric] <= high, (metric, got[metric], low, high)
