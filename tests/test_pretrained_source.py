"""A mistyped local model folder or a hub name without network is one clear line, before anything is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_lightning.cli import main
from hf_lightning.pretrained_source import check_pretrained_source, closest_folder, looks_like_path

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI.s args parameter")
CONFIG = ["--config", "configs/text_classification.yaml"]


@pytest.mark.parametrize(
    ("value", "is_path"),
    [("./my_modle", True), ("../m", True), ("/abs/model", True), ("~/m", True), ("a/b/c", True), ("out/", True),
     ("bad name", True), ("bert-base-uncased", False), ("google-bert/bert-base-uncased", False), ("gpt2", False)],
)
def test_what_can_only_be_a_path(value, is_path):
    assert looks_like_path(value) is is_path


def test_closest_folder_keeps_the_users_spelling(tmp_path, monkeypatch):
    (tmp_path / "my_model").mkdir()
    (tmp_path / "unrelated").mkdir()
    (tmp_path / "my_model.txt").write_text("a file, not a folder")
    monkeypatch.chdir(tmp_path)
    assert closest_folder("./my_modle") == "./my_model"
    assert closest_folder("my_modle") == "my_model"
    assert closest_folder(f"{tmp_path}/my_modl") == f"{tmp_path}/my_model"
    assert closest_folder("./zzz") is None and closest_folder("./nowhere/x") is None


def test_offline_hub_name_that_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set"):
        check_pretrained_source("model.model_name_or_path", "org-that-does-not-exist/model-xyz")
    check_pretrained_source("model.model_name_or_path", str(tmp_path))  # an existing folder is always fine


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("key", ["model.model_name_or_path", "data.tokenizer_name_or_path", "data.dataset_name"])
def test_cli_mistyped_local_folder(key, tmp_path, in_repo, capsys):
    (tmp_path / "my_model").mkdir()
    extra = ["--data.tokenizer_file", "null"] if key == "data.tokenizer_name_or_path" else []
    if key == "data.dataset_name":
        extra = ["--data.train_file", "null", "--data.validation_file", "null"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *CONFIG, "--args.output_dir", str(tmp_path / "out"), *extra, f"--{key}", f"{tmp_path}/my_modle"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    # found from the files alone, before anything heavy is imported: the early checks' "hf-lightning: error:" line
    assert line == (f"hf-lightning: error: {key}='{tmp_path}/my_modle': no such local folder; did you mean "
                    f"'{tmp_path}/my_model'?")


def test_cli_hub_name_without_network_is_one_line(tmp_path):
    """An unreachable hub (a closed local port stands in for a machine without network): one request, one line,
    naming the closest local folder; no retries, no traceback."""
    (tmp_path / "bert-base-uncased-local").mkdir()
    (tmp_path / "configs").symlink_to(REPO / "configs")  # the config names its data relative to the working folder
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(REPO)}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    result = subprocess.run(
        [sys.executable, "-m", "hf_lightning", "fit", *CONFIG,
         "--args.output_dir", str(tmp_path / "out"), "--model.model_name_or_path", "bert-base-uncasd"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Retry" not in result.stderr, result.stderr
    assert lines[0].startswith("hf-lightning fit: error: model.model_name_or_path='bert-base-uncasd': no local "
                               "folder of that name (did you mean 'bert-base-uncased-local'?), and it is not in the "
                               "local hub cache and the hub is unreachable")
    assert "A hub name needs network access" in lines[0]


def test_generation_config_name(tmp_path):
    from hf_lightning.seq2seq.gen_kwargs import load_generation_config

    with pytest.raises(FileNotFoundError, match="generation_config='./gen_confg': no such local folder"):
        load_generation_config("./gen_confg")
