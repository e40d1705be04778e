"""`hf-lightning fit`: every data/model mismatch visible before training, and every config entry that would run code
or write outside `output_dir`, is one `error:` line (exit status 2) before anything trains.

Before these checks: `data.max_length` above the model's positions crashed inside training with an index error, a
wrong `data.label_column` with a label list trained without labels and crashed in the loss, label values outside
the label list ended in a `ValueError` traceback from `datasets.map`, an explicit `num_labels` was silently replaced,
`model.config_class: torch.hub.load` ran a local `hubconf.py`, and `run_name: ../../x` wrote logs outside
`output_dir`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_lightning.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI.s args parameter")

REPO = Path(__file__).resolve().parents[1]
BERT = "{hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64"


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _error(argv: list[str], capsys) -> str:
    """The one `error:` line of a run that stopped with exit status 2 (an uncaught exception would not exit 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


@pytest.mark.parametrize(("config", "extra", "expected"), [
    ("text_classification.yaml", ["--model.config_kwargs", BERT + ", max_position_embeddings: 8}"],
     "data.max_length=64 is longer than the model's position embeddings allow (8 tokens, from its config "
     "BertConfig)"),
    ("causal_lm.yaml", ["--data.block_size", "128"],
     "data.block_size=128 is longer than the model's position embeddings allow (64 tokens"),
    ("seq2seq.yaml", ["--data.max_target_length", "100"],
     "data.max_target_length=100 is longer than the model's position embeddings allow (64 tokens"),
    ("text_classification.yaml", ["--data.label_column", "sentiment", "--data.label_list", "[negative, positive]"],
     "data.label_column='sentiment' is not a column of the train data; its columns: ['text', 'label']"),
    ("text_classification.yaml", ["--data.label_list", "[positive, neutral]"],
     "data.label_column='label': the train data has label(s) ['negative'] that are not in the label list "
     "['positive', 'neutral'] (data.label_list: 2 classes)"),
    ("text_classification.yaml", ["--model.config_kwargs", BERT + ", num_labels: 5}"],
     "model.config_kwargs.num_labels=5 but the data has 2 classes (['negative', 'positive'])"),
    ("token_classification.yaml", ["--data.label_list", "[O]"], "that are not in the label list ['O']"),
], ids=["max_length", "block_size", "max_target_length", "label_column", "label_values", "num_labels",
        "token_labels"])
def test_data_model_mismatch_is_one_error_line_before_training(config, extra, expected, tmp_path, in_repo, capsys):
    out = tmp_path / "out"
    line = _error(["fit", "--config", f"configs/{config}", "--args.output_dir", str(out), *extra], capsys)
    assert expected in line, line
    assert not out.exists() or not list(out.iterdir())  # nothing trained, nothing written


def test_a_config_class_outside_transformers_is_not_imported_nor_called(tmp_path, in_repo, capsys):
    """`torch.hub.load` with a local `hubconf.py` used to run that file: now the module is refused before import,
    and even when allowed, the object is checked to be a config class before it is called."""
    hub = tmp_path / "hub"
    hub.mkdir()
    marker = tmp_path / "ran"
    (hub / "hubconf.py").write_text(f"open({str(marker)!r}, 'w').write('x')\ndef model(**kw):\n    return None\n")
    base = ["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(tmp_path / "out"),
            "--model.config_class", "torch.hub.load",
            "--model.config_kwargs", f"{{repo_or_dir: {hub}, model: model, source: local}}"]
    line = _error(base, capsys)
    assert "model.config_class='torch.hub.load': a config only imports classes from transformers" in line
    assert "add it to allow_code_from" in line
    line = _error([*base, "--allow_code_from", "[torch]"], capsys)
    assert "model.config_class='torch.hub.load' is not a transformers.PretrainedConfig subclass" in line
    assert not marker.exists()


@pytest.mark.parametrize(("extra", "expected"), [
    (["--model.auto_class", "os.system"], "model.auto_class='os.system': a config only imports classes from "
                                          "transformers"),
    (["--model.auto_class", "BertConfig"], "model.auto_class='BertConfig' is not a transformers Auto model class"),
    (["--model.config_class", "AutoModel"], "model.config_class='AutoModel' is not a transformers.PretrainedConfig"),
    (["--hf_callbacks", "[os.getcwd]"], "hf_callbacks[0].class_path='os.getcwd': a config only imports classes"),
    (["--args.run_name", "../../escape"], "`run_name`='../../escape' names the logs' folder inside output_dir"),
], ids=["auto_class-module", "auto_class-kind", "config_class-kind", "hf_callback-module", "run_name"])
def test_code_and_paths_in_a_config_are_checked(extra, expected, tmp_path, in_repo, capsys):
    line = _error(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir",
                   str(tmp_path / "out"), *extra], capsys)
    assert expected in line, line


def test_an_output_dir_that_is_a_file_is_one_error_line(tmp_path, in_repo, capsys):
    target = tmp_path / "file"
    target.write_text("not a folder")
    line = _error(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(target)], capsys)
    assert f"args.output_dir={str(target)!r} is a file, not a folder" in line


def test_a_busy_output_dir_is_one_error_line(tmp_path, in_repo, capsys):
    """Another live run holds the lock (here: this process, under another run id)."""
    import json
    import os
    import socket

    out = tmp_path / "out"
    out.mkdir()
    (out / ".hf_lightning.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(),
                                                        "run": "0123abcd", "created": 0}))
    line = _error(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(out),
                   "--args.max_steps", "2"], capsys)
    assert f"output_dir={str(out)!r} is in use by another training run: pid {os.getppid()} on host " in line


def test_a_task_derived_from_a_preset_checks_the_presets_length_fields():
    """The lengths checked are the preset's (`Task.length_fields`), not chosen by task name: a task made from
    `causal_lm` under another name (as tests/scripts/cli_fsdp2_fit.py registers one) checks `data.block_size`."""
    import dataclasses

    from transformers import GPT2Config

    from hf_lightning.tasks.checks import check_lengths
    from hf_lightning.tasks.registry import get_task
    from hf_lightning.tasks.specs import DataSpec

    derived = dataclasses.replace(get_task("causal_lm"), name="my_causal_lm")
    config = GPT2Config(n_positions=64)
    check_lengths(derived, DataSpec(block_size=64, max_length=128), config)  # max_length does not apply to LM
    with pytest.raises(ValueError, match=r"data.block_size=65 is longer than the model's position embeddings allow "
                                         r"\(64 tokens"):
        check_lengths(derived, DataSpec(block_size=65), config)
    with pytest.raises(ValueError, match=r"data.max_length=128 .*\(64 tokens"):
        check_lengths(get_task("text_classification"), DataSpec(max_length=128), config)


_HEAVY = ("torch", "transformers", "lightning", "datasets")


@pytest.mark.parametrize(("extra", "expected"), [
    (["--data.validation_file", "null"],
     "args.eval_strategy='epoch' needs evaluation data: set data.validation_file (or data.validation_split)"),
    (["--data.text_column", "sentence"],
     "data.text_column='sentence' is not a column of the train data; its columns: ['text', 'label']"),
    (["--data.label_column", "label_id"],
     "data.label_column='label_id' is not a column of the train data; its columns: ['text', 'label']"),
    (["--model.model_name_or_path", "./configs/dta"],
     "model.model_name_or_path='./configs/dta': no such local folder; did you mean './configs/data'?"),
    (["--model.model_name_or_path", "configs/data"],
     "model.model_name_or_path='configs/data' has no config.json, which from_pretrained reads"),
    (["--data.tokenizer_file", "configs/data/tokenizer.jsn"],
     "data.tokenizer_file='configs/data/tokenizer.jsn': no such file"),
    (["--data.train_file", "null"], "fit needs training data: set data.train_file"),
    (["--trainer.val_check_interval", "0.5"],
     "These trainer options are decided by the HF arguments: trainer.val_check_interval (set args.eval_strategy: "
     "steps with args.eval_steps"),
    (["--trainer.max_steps", "3", "--args.max_steps", "5"],
     "trainer.max_steps=3 and args.max_steps=5 are the same setting with two values; keep args.max_steps."),
], ids=["eval_without_data", "text_column", "label_column", "model_folder", "model_without_config", "tokenizer_file",
        "no_train_data", "trainer_refused", "trainer_conflict"])
def test_mistakes_the_files_show_are_found_before_torch_transformers_or_lightning_are_imported(extra, expected,
                                                                                              tmp_path):
    """Each error is the run's one line, and `-X importtime` lists every module imported before it: none of the heavy
    ones (before, these errors came after the data and model were loaded: 88-123 s on a busy 2-core machine)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hf_lightning", "fit", "--config", "configs/text_classification.yaml",
         "--args.output_dir", str(tmp_path / "out"), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert len(lines) == 1 and lines[0].startswith("hf-lightning: error: ") and expected in lines[0], lines
    imported = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert imported and not imported & set(_HEAVY), sorted(imported & set(_HEAVY))
    assert not (tmp_path / "out").exists()


def test_file_columns_reads_headers_json_lines_and_parquet(tmp_path):
    from hf_lightning.cli.file_checks import file_columns

    (tmp_path / "a.csv").write_text("sentence,label_id\nhi,1\n")
    (tmp_path / "b.jsonl").write_text('{"tokens": ["a"], "tags": ["O"]}\n\n{"tokens": ["b"], "extra": 1}\n')
    (tmp_path / "c.json").write_text('[\n {"text": "x"}\n]\n')  # one JSON document: left to the full run
    (tmp_path / "d.txt").write_text("a line\n")
    assert file_columns(str(tmp_path / "a.csv")) == ["sentence", "label_id"]
    assert file_columns(str(tmp_path / "b.jsonl")) == ["tokens", "tags", "extra"]
    assert file_columns(str(tmp_path / "c.json")) is None
    assert file_columns(str(tmp_path / "d.txt")) == ["text"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["x"], "label": [0]}), tmp_path / "e.parquet")
    assert file_columns(str(tmp_path / "e.parquet")) == ["text", "label"]


def test_lightning_spellings_of_hf_arguments_are_moved_or_refused():
    import inspect

    import lightning.pytorch as pl

    from hf_lightning.args.to_lightning import OWNED_BY_HF_ARGS
    from hf_lightning.args.training_args import TrainingArguments
    from hf_lightning.cli.trainer_spellings import (
        LIGHTNING_DEFAULTS, LIGHTNING_TO_HF, REFUSED, help_text, move_lightning_spellings, user_set,
    )

    signature = inspect.signature(pl.Trainer.__init__).parameters
    assert LIGHTNING_DEFAULTS == {k: signature[k].default for k in LIGHTNING_DEFAULTS}
    assert set(LIGHTNING_TO_HF) | set(REFUSED) == set(OWNED_BY_HF_ARGS) == set(LIGHTNING_DEFAULTS)
    assert set(LIGHTNING_TO_HF.values()) <= {f for f in TrainingArguments.__dataclass_fields__}
    assert user_set({**LIGHTNING_DEFAULTS, "max_steps": 7, "devices": 2}) == {"max_steps": 7}  # a --print_config copy
    defaults = {"max_steps": -1, "num_train_epochs": 3.0}
    assert move_lightning_spellings({"max_steps": 7, "max_epochs": 2}, {"max_steps": -1, "learning_rate": 0.1},
                                    defaults) == ({}, {"max_steps": 7, "num_train_epochs": 2, "learning_rate": 0.1})
    with pytest.raises(ValueError, match="trainer.max_epochs=2 and args.num_train_epochs=5"):
        move_lightning_spellings({"max_epochs": 2}, {"num_train_epochs": 5}, defaults)
    with pytest.raises(ValueError, match="trainer.use_distributed_sampler"):
        move_lightning_spellings({"use_distributed_sampler": False}, {}, defaults)
    assert help_text("max_steps") == "Moved to args.max_steps (the same meaning; the HF arguments decide it)."
    assert help_text("check_val_every_n_epoch").startswith("Refused: the HF arguments decide it; set ")
    assert help_text("devices") is None


def test_trainer_max_steps_trains_that_many_updates_and_help_says_where_it_goes(tmp_path, in_repo, monkeypatch,
                                                                              capsys):
    """`--trainer.max_steps 2` was refused after the data and model were loaded; now it is `args.max_steps`."""
    import json

    monkeypatch.setenv("HF_LIGHTNING_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--trainer.max_steps MAX_STEPS Moved to args.max_steps (the same meaning; the HF arguments decide it)" \
        in shown
    assert "--trainer.val_check_interval VAL_CHECK_INTERVAL Refused: the HF arguments decide it; set" in shown
    out = tmp_path / "out"
    main(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(out),
          "--trainer.max_steps", "2", "--args.eval_strategy", "no", "--args.save_strategy", "no",
          "--args.load_best_model_at_end", "false"])
    assert "Training done: 2 updates" in capsys.readouterr().out
    assert json.loads((out / "train_results.json").read_text())["epoch"] < 1


def test_a_library_trainer_task_is_one_error_line_saying_how_the_cli_runs_one(tmp_path, in_repo, capsys):
    """TRL's trainers are Trainer subclasses whose behaviour is their own methods, not a task preset: `task: reward`
    says how the CLI runs a library trainer (a config naming it, configs/sft.yaml) and what else runs it."""
    line = _error(["fit", "--config", "configs/causal_lm.yaml", "--task", "reward",
                   "--args.output_dir", str(tmp_path / "out")], capsys)
    assert "task='reward' is not a CLI task" in line and "TRL's RewardTrainer" in line
    assert "`trainer_class` and `args_class`" in line and "configs/sft.yaml" in line
    assert "use_as_transformers_trainer()" in line and "examples/run_sft.py" in line


def test_task_sft_runs_trls_sft_trainer_whose_config_has_no_preset_preprocessing(tmp_path, in_repo, capsys):
    """`task: sft` is the short form of `trainer_class: trl.SFTTrainer` (tests/test_cli_library.py runs it): a preset
    config's preprocessing key is refused by name, saying what replaces it, before anything is imported."""
    line = _error(["fit", "--config", "configs/causal_lm.yaml", "--task", "sft", "--allow_code_from", "[trl]",
                   "--args.output_dir", str(tmp_path / "out")], capsys)
    assert "data.block_size=64 is task-preset preprocessing" in line and "args.max_length" in line


@pytest.mark.parametrize(("rows", "expected"), [
    ("text,label\ngood film,positive\n,negative\nbad film,negative\n",
     "data.text_column='text': the train data, row 1, column 'text' is empty (None: a missing value in the file)"),
    ("text,label\n1,positive\n2,negative\n",
     "data.text_column='text': the train data, row 0, column 'text' holds int64 values, not text"),
], ids=["empty_cell", "numbers"])
def test_an_empty_or_non_text_cell_is_named_before_tokenisation(rows, expected, tmp_path, in_repo, capsys):
    """Issue 29: an empty text cell in a CSV (None) gave a 76-line tokenizer `TypeError` naming no row or column."""
    train = tmp_path / "train.csv"
    train.write_text(rows)
    line = _error(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(tmp_path / "out"),
                   "--data.train_file", str(train), "--args.eval_strategy", "no", "--args.save_strategy", "no",
                   "--args.load_best_model_at_end", "false"], capsys)
    assert expected in line, line
