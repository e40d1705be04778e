"""The `hf-lightning` command: fit -> validate -> predict for every shipped config, DDP, errors, --help, print_config.

Runs are in-process (`cli.main`) where possible: a subprocess costs ~7 s of imports each. Every config is run as
shipped, with only the step count, sample counts and output directory overridden.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hf_lightning.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI.s args parameter")

REPO = Path(__file__).resolve().parents[1]
# configs/sft.yaml, dpo.yaml and grpo.yaml run library trainers (TRL) through `use_as_transformers_trainer()`, a
# process-wide swap: they are run in their own processes by tests/test_cli_library.py and tests/test_cli_rl.py
LIBRARY_CONFIGS = {"sft.yaml", "dpo.yaml", "grpo.yaml"}
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml") if p.name not in LIBRARY_CONFIGS)
GENERATION_CONFIGS = {"seq2seq.yaml", "causal_lm_generation.yaml"}
FAST = ["--args.max_steps", "3", "--args.logging_steps", "1", "--data.max_train_samples", "48",
        "--data.max_eval_samples", "24", "--trainer.enable_progress_bar", "false"]


@pytest.fixture
def in_repo(monkeypatch):
    """Configs name their data relative to the repository root."""
    monkeypatch.chdir(REPO)


def _run(argv: list[str]) -> None:
    main(argv)


def _subprocess(argv: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    kwargs.setdefault("timeout", 600)  # a stuck child fails the test (pytest-timeout would name it too, later)
    command = [sys.executable, "-m", "hf_lightning", *argv]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, **kwargs)  # bounded: above


def test_every_config_is_covered():
    assert set(CONFIGS) >= {"text_classification.yaml", "text_pair_classification.yaml",
                            "token_classification.yaml", "causal_lm.yaml", "masked_lm.yaml", *GENERATION_CONFIGS}


@pytest.mark.parametrize("config", CONFIGS)
def test_fit_validate_predict(config, tmp_path, in_repo, one_thread, capsys):
    out = tmp_path / "out"
    base = ["--config", f"configs/{config}", "--args.output_dir", str(out), *FAST]
    _run(["fit", *base])
    printed = capsys.readouterr().out
    assert printed.startswith("Training done: 3 updates") and f"Model and tokenizer: {out}" in printed
    summary = json.loads((out / "train_results.json").read_text())
    assert np.isfinite(summary["train_loss"]) and summary["train_runtime"] > 0
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    checkpoints = sorted(out.glob("checkpoint-*"))
    assert checkpoints, "fit wrote no checkpoint-N folder"

    # validate the trained model: the output dir is a from_pretrained directory, tokenizer included
    _run(["validate", *base, "--model.model_name_or_path", str(out), "--data.tokenizer_file", "null"])
    metrics = json.loads([line for line in capsys.readouterr().out.splitlines() if line.startswith("{")][-1])
    assert np.isfinite(metrics["eval_loss"])
    assert json.loads((out / "eval_results.json").read_text())["eval_loss"] == metrics["eval_loss"]
    assert "epoch" not in metrics  # the evaluated model's epoch is unknown; HF's evaluating trainer would say 0
    if config == "text_classification.yaml":  # a checkpoint folder knows its epoch (was: "epoch": 0)
        _run(["validate", *base, "--ckpt_path", str(checkpoints[-1])])
        metrics = json.loads([line for line in capsys.readouterr().out.splitlines() if line.startswith("{")][-1])
        assert metrics["epoch"] == json.loads((checkpoints[-1] / "trainer_state.json").read_text())["epoch"] > 0
    if config in GENERATION_CONFIGS:  # evaluation generated and scored texts
        for name in ("eval_sacrebleu", "eval_rouge1", "eval_rougeL", "eval_exact_match"):
            assert 0.0 <= metrics[name] <= 1.0, (name, metrics)

    # predict from one of our checkpoint folders (as ckpt_path: it becomes model_name_or_path)
    _run(["predict", *base, "--ckpt_path", str(checkpoints[-1])])
    printed = capsys.readouterr().out
    path = out / "predictions.npz"
    assert f"predictions written to {path}" in printed
    arrays = np.load(path)
    assert len(arrays["predictions"]) == len(arrays["label_ids"]) > 0
    if config in GENERATION_CONFIGS:
        _check_generated(arrays, out, printed, config)
    if config == "text_classification.yaml":  # issue 29 item 4: 4,000 inverted bytes, size kept: both refuse
        weights = checkpoints[-1] / "model.safetensors"
        data = bytearray(weights.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 4000] = bytes(b ^ 0xFF for b in data[middle:middle + 4000])
        weights.write_bytes(bytes(data))
        path.unlink()
        for command in ("validate", "predict"):
            with pytest.raises(SystemExit) as exit_info:
                _run([command, *base, "--ckpt_path", str(checkpoints[-1])])
            assert exit_info.value.code == 2
            err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
            assert len(err) == 1 and "model.safetensors is damaged (its checksum differs" in err[0], err
        assert not path.exists()  # (before: validate printed metrics of the altered weights, predict wrote them)


def _check_generated(arrays, out: Path, printed: str, config_name: str) -> None:
    """Predictions are generated token ids (not logits), one decoded row per example in predictions.jsonl."""
    from transformers import AutoTokenizer

    predictions = arrays["predictions"]
    assert predictions.dtype.kind == "i" and predictions.ndim == 2 and predictions.shape[1] <= 24
    assert f"decoded predictions written to {out / 'predictions.jsonl'}" in printed
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == len(predictions) == 24  # --data.max_eval_samples
    tokenizer = AutoTokenizer.from_pretrained(out)
    # the random init took the tokenizer's EOS ([SEP] here), so generation stops where the targets end
    model_config = json.loads((out / "config.json").read_text())
    assert model_config["eos_token_id"] == tokenizer.eos_token_id == tokenizer.sep_token_id
    first = [int(t) for t in predictions[0] if t >= 0]
    assert rows[0]["prediction"] == tokenizer.decode(first, skip_special_tokens=True).strip()
    # the references are the validation targets, in dataset order (the toy task's words are one token each)
    config = yaml.safe_load((REPO / "configs" / config_name).read_text())["data"]
    targets = [json.loads(line)[config["target_column"]]
               for line in (REPO / config["validation_file"]).read_text().splitlines()[:24]]
    assert [row["reference"] for row in rows] == targets


def test_token_classification_labels_first_subword_only(in_repo):
    from hf_lightning.tasks.loading import load_tokenizer
    from hf_lightning.tasks.specs import DataSpec, ModelSpec
    from hf_lightning.tasks.text import align_labels, preprocess_tokens
    from datasets import Dataset

    assert align_labels([None, 0, 0, 1, None], [5, 7]) == [-100, 5, -100, 7, -100]
    spec = DataSpec(tokenizer_file="configs/data/tokenizer.json", text_column="tokens", label_column="tags")
    tokenizer = load_tokenizer(spec, ModelSpec(config_class="BertConfig"))
    raw = Dataset.from_dict({"tokens": [["the", "acting", "was", "brilliant"]], "tags": [["O", "O", "O", "POS"]]})
    row = preprocess_tokens(raw, tokenizer, spec, {"O": 0, "POS": 1})[0]
    pieces = tokenizer.convert_ids_to_tokens(row["input_ids"])
    assert len(pieces) > 6, pieces  # "brilliant" is split into sub-words by the bundled tokenizer
    expected = [-100] + [0, 0, 0, 1] + [-100] * (len(pieces) - 6) + [-100]
    assert row["labels"] == expected


@pytest.mark.distributed
def test_ddp_fit_from_the_command_line(tmp_path):
    """The strategy swap is two flags; the tokenisation runs once (rank 0's `prepare_data`), every rank's `setup`
    reads the `datasets` cache (a fresh cache dir, so nothing is cached from other tests).

    Counted from `datasets`' own log lines, not from progress bars: tqdm draws a bar's final "100%" frame twice when
    the single batch takes longer than its 0.1 s refresh interval (a loaded machine), which once made this test
    count "tokenising 48/48" twice although rank 1 had read the cache."""
    out = tmp_path / "ddp"
    cache = tmp_path / "cache"
    result = _subprocess(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(out),
                          *FAST, "--trainer.strategy", "ddp", "--trainer.devices", "2",
                          "--trainer.accelerator", "cpu"],
                         env={"HF_DATASETS_CACHE": str(cache), "DATASETS_VERBOSITY": "info"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("Training done: 3 updates") == 1  # one summary: printed by global rank 0 only
    assert "distributed_backend=gloo" in result.stderr and "All distributed processes registered" in result.stderr
    # one epoch is one update here (48 samples / 2 ranks / batch 32); save_total_limit=1 keeps the best epoch
    (checkpoint,) = out.glob("checkpoint-*")
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert checkpoint.name == f"checkpoint-{state['global_step']}" and state["best_model_checkpoint"]
    # train and eval data each tokenised once (rank 0's prepare_data), then read from that cache by the setup of
    # both ranks: rank 1 computed the same fingerprint and never tokenised
    assert result.stderr.count("Caching processed dataset at") == 2, result.stderr[-3000:]
    assert result.stderr.count("Loading cached processed dataset at") == 4
    assert len(list(cache.rglob("cache-*.arrow"))) == 2


# Mistakes in the task / args / model / data sections: each is one `error:` line, answered before torch, Lightning,
# transformers or datasets are imported (test_help_and_config_errors_do_not_import_the_heavy_stack).
CONFIG_ERRORS = [
    (["--args.eval_strategy", "sometimes"],
     """"args.eval_strategy": Expected a typing.Literal['no', 'steps', 'epoch']. Got value: sometimes"""),
    (["--args.num_train_epochs", "abc"], "\"args.num_train_epochs\": Expected a <class 'float'>. Got value: abc"),
    (["--args.warmup_steps", "-1"], "in `args`: Invalid TrainingArguments: - Got warmup_steps = -1"),
    (["--data.max_length", "0"], "data.max_length=0 must be >= 1"),
    (["--args.evall_steps", "3"], "evall_steps (did you mean eval_steps?)"),
    (["--args.save_strategy", "steps"], "requires the save and eval strategy to match"),
    (["--task", "nope"], "allowed: causal_lm, causal_lm_generation, masked_lm, seq2seq, text_classification, "
                         "token_classification"),
    (["--args.predict_with_generate", "true"], "args.predict_with_generate=True is a generation option, for "
                                               "task causal_lm_generation, seq2seq only"),
    (["--data.train_file", "x.tsv"], "unsupported file type '.tsv'"),
    (["--task", "seq2seq", "--args.generation_num_beams", "0"],
     "`generation_num_beams`=0 must be None or an integer >= 1"),
    (["--task", "seq2seq", "--args.generation_max_length", "many"],
     "\"args.generation_max_length\": Does not validate against any of the Union subtypes"),
    (["--task", "seq2seq", "--data.max_target_length", "0"], "data.max_target_length=0 must be >= 1"),
]


def _config_for(extra: list[str]) -> str:
    return "configs/seq2seq.yaml" if "seq2seq" in " ".join(extra) else "configs/text_classification.yaml"


@pytest.mark.parametrize(("extra", "expected"), CONFIG_ERRORS)
def test_config_errors_are_one_line(extra, expected, tmp_path, in_repo, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _run(["fit", "--config", _config_for(extra), "--args.output_dir", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-lightning: error: ") and "\n" not in err and "Traceback" not in err
    assert expected in err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # trainer.max_steps is moved to args.max_steps (tests/test_cli_checks.py); this one has no same-meaning twin
        (["--trainer.check_val_every_n_epoch", "2"], "trainer.check_val_every_n_epoch (set args.eval_strategy"),
        (["--trainer.devicez", "2"], "unrecognized arguments: --trainer.devicez 2"),
        (["--model.config_class", "NopeConfig"], "model.config_class='NopeConfig' cannot be imported"),
        (["--ckpt_path", "no/such/dir"], "ckpt_path='no/such/dir': no such checkpoint folder"),
        (["--data.text_column", "sentence"], "data.text_column='sentence' is not a column of the train data"),
    ],
)
def test_parser_and_build_errors_are_one_line(extra, expected, tmp_path, in_repo, capsys):
    command = "predict" if "--ckpt_path" in extra else "fit"
    with pytest.raises(SystemExit) as exit_info:
        _run([command, "--config", "configs/text_classification.yaml", "--args.output_dir", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and expected in err[0], err


def test_fit_resumes_exactly_from_a_checkpoint(tmp_path, in_repo, one_thread, capsys):
    """`--ckpt_path checkpoint-2` on fit continues the run exactly: the same log history as the uninterrupted run."""
    import shutil

    def fit(out: Path, *extra: str) -> dict:
        _run(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(out), *FAST,
              "--args.max_steps", "4", "--args.save_strategy", "steps", "--args.save_steps", "2",
              "--args.eval_strategy", "steps", "--args.eval_steps", "2", "--args.load_best_model_at_end", "false",
              "--args.save_total_limit", "null", *extra])
        return json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())

    full = fit(tmp_path / "full")
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "full" / "checkpoint-2", resumed_dir / "checkpoint-2")
    resumed = fit(resumed_dir, "--ckpt_path", str(resumed_dir / "checkpoint-2"))
    capsys.readouterr()

    def history(state: dict) -> list[dict]:
        return [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
                for e in state["log_history"]]

    assert history(resumed) == history(full)
    assert len([e for e in full["log_history"] if "loss" in e]) == 4
    # a missing folder is one HF-worded line, through the facade's resume function
    with pytest.raises(SystemExit):
        _run(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(tmp_path / "x"),
              "--ckpt_path", str(tmp_path / "checkpoint-9")])
    err = capsys.readouterr().err.strip()
    assert "checkpoint-9" in err and "\n" not in err


def test_help_lists_hf_arguments_with_descriptions():
    start = time.perf_counter()
    result = _subprocess(["fit", "--help"], timeout=120)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "--args.eval_strategy {no,steps,epoch} When to evaluate during training" in text
    assert "--args.gradient_accumulation_steps" in text and "Micro-batches accumulated into one" in text
    assert "--trainer.strategy" in text and "--model.model_name_or_path" in text
    assert "--args.predict_with_generate" in text and "Evaluate and predict by calling `model.generate`" in text
    top = _subprocess(["--help"], timeout=60)
    assert "fit" in top.stdout and "quickstart" in top.stdout
    print(f"fit --help: {elapsed:.1f}s")


def test_print_config_round_trip(tmp_path, in_repo, capsys, one_thread):
    out = tmp_path / "printed"
    with pytest.raises(SystemExit) as exit_info:
        _run(["fit", "--config", "configs/causal_lm.yaml", "--args.output_dir", str(out), *FAST, "--print_config"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "per_device_train_batch_size: 8" in printed and "strategy: auto" in printed
    config = tmp_path / "printed.yaml"
    config.write_text(printed)
    _run(["fit", "--config", str(config)])
    assert "Training done: 3 updates" in capsys.readouterr().out


def test_lightning_options_loggers_and_callbacks_pass_through(tmp_path, in_repo, one_thread, capsys):
    """Lightning options from the command line reach `lightning.Trainer`; the HF-derived settings are the facade's."""
    from lightning.pytorch.callbacks import ModelSummary
    from lightning.pytorch.loggers import CSVLogger

    from hf_lightning.flow.flow import HFTrainerFlow
    from hf_lightning.cli import run_cli

    logs = tmp_path / "extra_logs"
    cli = run_cli(["fit", "--config", "configs/token_classification.yaml", "--args.output_dir", str(tmp_path / "o"),
                   *FAST, "--trainer.precision", "bf16-mixed", "--trainer.logger",
                   "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(logs),
                   "--trainer.callbacks", "lightning.pytorch.callbacks.ModelSummary"])
    trainer = cli.trainer
    assert trainer.precision == "bf16-mixed"
    assert isinstance(trainer.logger, CSVLogger) and list(logs.glob("**/metrics.csv"))
    assert isinstance(trainer.callbacks[0], HFTrainerFlow)
    assert any(isinstance(c, ModelSummary) for c in trainer.callbacks)
    # as in hf_lightning.Trainer: no Lightning checkpoints, no sanity val, our own sharding, step budget from args
    assert trainer.checkpoint_callback is None and trainer.num_sanity_val_steps == 0
    assert trainer._accelerator_connector.use_distributed_sampler is False
    assert trainer.global_step == 3 and cli.flow.state.global_step == 3


def test_data_sources_and_pretrained_overrides(tmp_path, in_repo):
    """Saved dataset dirs, parquet and jsonl files load; a pretrained dir loads with config overrides."""
    from datasets import Dataset, DatasetDict

    from hf_lightning.tasks.loading import build_model, label_list_for, load_split, load_tokenizer
    from hf_lightning.tasks.registry import get_task
    from hf_lightning.tasks.specs import DataSpec, ModelSpec

    rows = {"text": ["the film was good", "the plot was bad", "the cast was fun"], "label": [1, 0, 1]}
    DatasetDict({"train": Dataset.from_dict(rows), "dev": Dataset.from_dict(rows)}).save_to_disk(tmp_path / "saved")
    spec = DataSpec(dataset_name=str(tmp_path / "saved"), validation_split="dev", max_eval_samples=2,
                    tokenizer_file="configs/data/tokenizer.json")
    assert load_split(spec, "train")["text"] == rows["text"] and len(load_split(spec, "test")) == 2
    with pytest.raises(ValueError, match=r"data.train_split='nope' is not a split of .*allowed: \['train', 'dev'\]"):
        load_split(DataSpec(dataset_name=str(tmp_path / "saved"), train_split="nope"), "train")
    Dataset.from_dict(rows).to_parquet(tmp_path / "d.parquet")
    Dataset.from_dict(rows).to_json(tmp_path / "d.jsonl")
    for name in ("d.parquet", "d.jsonl"):
        assert load_split(DataSpec(train_file=str(tmp_path / name)), "train")["label"] == [1, 0, 1]

    task = get_task("text_classification")
    tokenizer = load_tokenizer(spec, ModelSpec(config_class="BertConfig"))
    labels = label_list_for(task, spec, ModelSpec(config_class="BertConfig"), [load_split(spec, "train")])
    assert labels == ["0", "1"]
    small = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}
    model = build_model(ModelSpec(config_class="BertConfig", config_kwargs=small), task, tokenizer, ["neg", "pos"])
    model.save_pretrained(tmp_path / "pretrained")
    pretrained = ModelSpec(model_name_or_path=str(tmp_path / "pretrained"),
                           config_overrides={"classifier_dropout": 0.3})
    # the saved id2label wins over the data's labels; the override is applied on top of the saved config
    assert label_list_for(task, spec, pretrained, [load_split(spec, "train")]) == ["neg", "pos"]
    reloaded = build_model(pretrained, task, tokenizer, ["neg", "pos"])
    assert reloaded.config.classifier_dropout == 0.3 and reloaded.config.hidden_size == 16
    assert all((a == b).all() for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()))


def test_help_and_config_errors_do_not_import_the_heavy_stack(tmp_path):
    """`hf-lightning --help` and every error of `CONFIG_ERRORS` are answered before torch, Lightning, transformers
    or datasets are imported (checked by the modules present in a fresh process, after each error)."""
    runs = [["fit", "--config", _config_for(extra), "--args.output_dir", str(tmp_path), *extra]
            for extra, _ in CONFIG_ERRORS]
    code = (
        "import sys, contextlib, io, json\n"
        "from hf_lightning.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 2, argv\n"
        "    else:\n"
        "        raise AssertionError(f'no error for {argv}')\n"
        "    heavy = sorted(m for m in ('torch', 'lightning', 'transformers', 'datasets') if m in sys.modules)\n"
        "    print(json.dumps(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, json.dumps(runs)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [[]] * len(CONFIG_ERRORS)
    assert result.stderr.count("hf-lightning: error:") == len(CONFIG_ERRORS)


def test_hf_callbacks_from_the_config(tmp_path, in_repo, one_thread, capsys):
    """`hf_callbacks` entries are transformers.TrainerCallbacks driven by the flow: HF's EarlyStoppingCallback with an
    impossible threshold stops training after `patience` evaluations without improvement (here at step 2 of 6)."""
    from transformers import EarlyStoppingCallback

    from hf_lightning.cli import run_cli

    config = tmp_path / "early.yaml"
    config.write_text(
        "hf_callbacks:\n"
        "  - class_path: transformers.EarlyStoppingCallback\n"
        "    init_args: {early_stopping_patience: 1, early_stopping_threshold: 1.0}\n"
    )
    cli = run_cli(["fit", "--config", "configs/text_classification.yaml", "--config", str(config),
                   "--args.output_dir", str(tmp_path / "o"), *FAST, "--args.max_steps", "6",
                   "--args.eval_strategy", "steps", "--args.eval_steps", "1", "--args.save_strategy", "steps",
                   "--args.save_steps", "1"])
    (early,) = [cb for cb in cli.flow.handler.callbacks if isinstance(cb, EarlyStoppingCallback)]
    assert early.early_stopping_patience == 1
    # step 1 sets the best metric; step 2 does not beat it by 1.0 -> patience exhausted -> stop
    assert cli.flow.state.global_step == 2 and cli.trainer.global_step == 2
    capsys.readouterr()


@pytest.mark.parametrize(
    ("entry", "allowed", "expected"),
    [
        ("[transformers.NoSuchCallback]", [], "hf_callbacks[0].class_path='transformers.NoSuchCallback' cannot be"),
        ("[lightning.pytorch.callbacks.ModelSummary]", ["--allow_code_from", "[lightning]"],
         "is not a transformers.TrainerCallback subclass"),
        ("[lightning.pytorch.callbacks.ModelSummary]", [],
         "a config only imports classes from transformers unless it allows the module"),
        ("[{class_path: transformers.EarlyStoppingCallback, init_args: {patience: 1}}]", [],
         "hf_callbacks[0] (transformers.EarlyStoppingCallback): "),
    ],
)
def test_hf_callback_errors_are_one_line(entry, allowed, expected, tmp_path, in_repo, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _run(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(tmp_path),
              "--hf_callbacks", entry, *allowed])
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and expected in err[0], err


@pytest.mark.parametrize("config", sorted(GENERATION_CONFIGS))
def test_generation_predict_without_targets(config, tmp_path, in_repo, one_thread, capsys):
    """Prediction data with sources / prompts only: generation from them, no references (null in the jsonl)."""
    source = "source" if config == "seq2seq.yaml" else "prompt"
    rows = ["film plot cast", "music great movie acting", "ending script film"]
    data = tmp_path / "inputs.jsonl"
    data.write_text("".join(json.dumps({source: text}) + "\n" for text in rows))
    out = tmp_path / "out"
    _run(["predict", "--config", f"configs/{config}", "--args.output_dir", str(out), "--data.test_file", str(data),
          "--trainer.enable_progress_bar", "false"])
    capsys.readouterr()
    arrays = np.load(out / "predictions.npz")
    assert arrays["predictions"].dtype.kind == "i" and len(arrays["predictions"]) == 3
    assert "label_ids" not in arrays.files  # the Python writer's format: no labels, no array
    assert (out / "predictions.parquet").is_file() and (out / "predict_results.json").is_file()
    decoded = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [row["reference"] for row in decoded] == [None] * 3
    assert all(isinstance(row["prediction"], str) for row in decoded)


def test_eval_loss_weighting_from_the_config(tmp_path, in_repo, one_thread, capsys):
    """The facade's `eval_loss_weighting` is a top-level CLI key too; a wrong value is one parser line."""
    # token classification: the label tokens per batch vary (sub-words and padding are -100), so the two differ
    base = ["validate", "--config", "configs/token_classification.yaml", "--args.output_dir", str(tmp_path), *FAST]
    losses = {}
    for weighting in ("samples", "tokens"):
        _run([*base, "--eval_loss_weighting", weighting, "--args.per_device_eval_batch_size", "5"])
        printed = capsys.readouterr().out
        losses[weighting] = json.loads([line for line in printed.splitlines() if line.startswith("{")][-1])["eval_loss"]
    assert np.isfinite(losses["samples"]) and np.isfinite(losses["tokens"])
    assert losses["samples"] != pytest.approx(losses["tokens"], rel=1e-6)
    with pytest.raises(SystemExit):
        _run([*base, "--eval_loss_weighting", "words"])
    err = capsys.readouterr().err
    assert "eval_loss_weighting" in err and "tokens" in err


class _WritesAFile:
    """A pickle that creates `path` when it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_fit_into_an_output_dir_with_checkpoints_replaces_them_as_hf(tmp_path, in_repo, caplog, capsys):
    """An earlier run's checkpoint in output_dir: the fit trains (as HF) and replaces it as it saves, named in one
    warning; the user's other files stay."""
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "stale.txt").write_text("old run")
    (tmp_path / "notes.txt").write_text("mine")
    # issue 29 item 1: an earlier run's checkpoint-9 whose training_args.bin writes a file when unpickled
    (tmp_path / "checkpoint-9").mkdir()
    torch.save(_WritesAFile(tmp_path / "pwned"), tmp_path / "checkpoint-9" / "training_args.bin")
    with caplog.at_level(logging.WARNING, logger="hf_lightning.checkpoint.restore"):
        _run(["fit", "--config", "configs/text_classification.yaml", "--args.output_dir", str(tmp_path),
              "--args.save_total_limit", "3", *FAST])  # 2 steps an epoch: saves at 2 and 3
    assert not (tmp_path / "pwned").exists()  # (before: the pickle ran, torch.load(weights_only=False))
    # issue 29 item 3: the summary names this run's checkpoints, and checkpoint-9 apart
    summary = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Checkpoints:")]
    assert summary == [f"Checkpoints: {tmp_path}/checkpoint-2, checkpoint-3 (also in output_dir, not written by this "
                       "run: checkpoint-9)"]
    notices = [r.getMessage() for r in caplog.records if "replaces checkpoint-2, checkpoint-9 as it saves" in
               r.getMessage()]
    assert len(notices) == 1, [r.getMessage() for r in caplog.records]
    assert not (tmp_path / "checkpoint-2" / "stale.txt").exists()  # the whole folder was replaced, not merged
    assert (tmp_path / "checkpoint-2" / "trainer_state.json").is_file()
    assert (tmp_path / "notes.txt").read_text() == "mine"
