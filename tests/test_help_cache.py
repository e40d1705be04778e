"""`hf-lightning <subcommand> --help` is rendered once per installed code and then printed from a file, before torch,
Lightning or transformers are imported."""

from __future__ import annotations

import os
import subprocess
import sys

from hf_lightning.cli.help_cache import cache_key, cached_help, store_help


def test_only_a_bare_subcommand_help_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LIGHTNING_CACHE", str(tmp_path))
    assert cache_key(["fit", "--help"]) == cache_key(["fit", "--help"]) is not None
    assert cache_key(["fit", "--help"]) != cache_key(["validate", "--help"])
    for argv in (["fit", "--config", "x.yaml", "--help"], ["fit"], ["quickstart", "--help"], ["fit", "--print_config"]):
        assert cache_key(argv) is None
    monkeypatch.setenv("COLUMNS", "77")
    narrow = cache_key(["fit", "-h"])
    monkeypatch.setenv("COLUMNS", "150")
    assert cache_key(["fit", "-h"]) != narrow  # the text is wrapped to the terminal
    assert cached_help(["fit", "-h"]) is None
    store_help(["fit", "-h"], "usage: ...\n")
    assert cached_help(["fit", "-h"]) == "usage: ...\n"
    assert list(tmp_path.iterdir()) == [tmp_path / f"help-{cache_key(['fit', '-h'])}.txt"]


def test_the_second_help_is_the_same_text_without_the_ml_stack(tmp_path):
    env = {**os.environ, "HF_LIGHTNING_CACHE": str(tmp_path), "COLUMNS": "100"}
    probe = ("import sys\nfrom hf_lightning.cli import main\ntry:\n    main(['fit', '--help'])\nexcept SystemExit as e:\n"
             "    code = e.code\nprint('CODE', code, 'HEAVY', sorted(m for m in ('torch', 'lightning', 'transformers') "
             "if m in sys.modules), file=sys.stderr)\n")
    first = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
    second = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
    assert "--args.learning_rate" in first.stdout and "--trainer.precision" in first.stdout
    assert second.stdout == first.stdout
    assert "CODE 0 HEAVY ['lightning', 'torch', 'transformers']" in first.stderr
    assert "CODE 0 HEAVY []" in second.stderr
