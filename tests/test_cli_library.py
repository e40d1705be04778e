"""`hf-lightning fit|validate --config configs/sft.yaml`: a config naming a library trainer (TRL's `SFTTrainer`) runs
it on hf_lightning (cli/library_config.py, cli/library_run.py).

The runs are real processes: the route calls `hf_lightning.use_as_transformers_trainer()`, a process-wide swap of
`transformers.Trainer`, which must not leak into the other tests. The oracle is examples/run_sft.py with TRL on the
real `transformers.Trainer` (`EXAMPLES_TRAINER=transformers`), with the same settings: the CLI run ends with the
same log history, checkpoints and weights. Mistakes found before torch is imported are checked in a small process
that also reports whether torch and trl were imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import communicate_within
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "configs" / "data"
sys.path.insert(0, str(REPO / "examples"))
from _common import make_tiny_model  # noqa: E402

TIMING = ("_runtime", "_per_second")
SETTINGS = {  # the same run, in run_sft.py flags and in the config's `args:`
    "max_steps": 4, "save_steps": 2, "save_strategy": "steps", "eval_strategy": "steps", "eval_steps": 2,
    "logging_steps": 1, "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8, "report_to": "none",
    "learning_rate": 1e-3, "seed": 7, "max_length": 32, "use_cpu": True, "bf16": False,
    "gradient_checkpointing": False, "eos_token": "[SEP]", "save_total_limit": None, "disable_tqdm": True,
}
DATA_FILES = {"train_file": DATA / "sentiment_train.csv", "validation_file": DATA / "sentiment_validation.csv"}
SAMPLES = {"max_train_samples": 32, "max_eval_samples": 16}


def _env() -> dict[str, str]:
    # PYTHONHASHSEED: TRL's model card lists its tags from a set (see tests/test_examples.py)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONHASHSEED": "0"}
    env.pop("EXAMPLES_TRAINER", None)
    return env


def _cli(subcommand: str, *argv: str, cwd: Path = REPO) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hf_lightning", subcommand, *map(str, argv)], cwd=cwd,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _done(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = communicate_within(process, timeout, str(process.args))
    return process.returncode, out, err


def _ok(process: subprocess.Popen) -> str:
    code, out, err = _done(process)
    assert code == 0, out[-3000:] + err[-5000:]
    return out


def _cli_overrides(model: str, out: Path) -> list[str]:
    argv = ["--config", "configs/sft.yaml", "--model.model_name_or_path", model, "--data.tokenizer_file", "null",
            "--args.output_dir", str(out)]
    for key, value in SETTINGS.items():
        argv += [f"--args.{key}", "null" if value is None else str(value)]  # `[SEP]`: the text, for a str field
    for key, value in {**DATA_FILES, **SAMPLES}.items():
        argv += [f"--data.{key}", str(value)]
    return argv


def _run_sft_oracle(model: str, out: Path, launcher: tuple[str, ...] = ()) -> subprocess.Popen:
    """examples/run_sft.py on TRL's own base (`transformers.Trainer`), the same settings; `launcher`: torchrun's
    command (then through tests/scripts/oracle_clean_exit.py, see its docstring)."""
    flags = ["--do_train", "--do_eval", "--model_name_or_path", model, "--output_dir", str(out)]
    for key, value in {**SETTINGS, **DATA_FILES, **SAMPLES}.items():
        if value is not None:
            flags += [f"--{key}", str(value)]
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**_env(), "EXAMPLES_TRAINER": "transformers"}
    script = [*launcher, str(REPO / "tests" / "scripts" / "oracle_clean_exit.py")] if launcher else [sys.executable]
    return subprocess.Popen([*script, str(REPO / "examples" / "run_sft.py"), *flags], cwd=out.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _without_timings(log: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if not k.endswith(TIMING)} for entry in log]


def _assert_same_weights(got: Path, want: Path) -> None:
    ours, hf = load_file(str(got / "model.safetensors")), load_file(str(want / "model.safetensors"))
    assert sorted(ours) == sorted(hf)
    for name, tensor in hf.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The CLI's fit of configs/sft.yaml and run_sft.py on transformers.Trainer, side by side, on one tiny Llama."""
    root = tmp_path_factory.mktemp("sft_cli")
    model = make_tiny_model("llama", str(root / "llama"))
    cli, hf = root / "cli" / "out", root / "hf" / "out"
    started = [_cli("fit", *_cli_overrides(model, cli)), _run_sft_oracle(model, hf)]
    printed = _ok(started[0])
    _ok(started[1])
    return {"model": model, "cli": cli, "hf": hf, "printed": printed}


def _assert_same_run(cli: Path, hf: Path) -> None:
    got, want = (json.loads((d / "trainer_state.json").read_text()) for d in (cli, hf))
    ours, theirs = _without_timings(got["log_history"]), _without_timings(want["log_history"])
    assert [sorted(e) for e in ours] == [sorted(e) for e in theirs] and ours
    for entry, expected in zip(ours, theirs):
        assert entry == pytest.approx(expected, rel=1e-6, abs=1e-9), expected["step"]
    assert any("eval_mean_token_accuracy" in e for e in got["log_history"])  # TRL's own metrics, logged by its `log`
    assert got["global_step"] == want["global_step"] == 4
    names = sorted(p.name for p in hf.glob("checkpoint-*"))
    assert sorted(p.name for p in cli.glob("checkpoint-*")) == names == ["checkpoint-2", "checkpoint-4"]
    for name in names:
        _assert_same_weights(cli / name, hf / name)
    _assert_same_weights(cli, hf)
    train = {k: v for k, v in json.loads((cli / "train_results.json").read_text()).items() if not k.endswith(TIMING)}
    assert train == pytest.approx({k: v for k, v in json.loads((hf / "train_results.json").read_text()).items()
                                   if not k.endswith(TIMING)}, rel=1e-6)
    assert (cli / "README.md").is_file()  # TRL's model card (its `_save_checkpoint` / `create_model_card`)


def test_sft_config_fit_ends_as_run_sft_on_transformers(runs):
    """Same log history (losses, grad norms, learning rates, TRL's entropy / token accuracy / num_tokens, the
    evaluations), the same checkpoints with the same weights, the same final model."""
    cli = runs["cli"]
    _assert_same_run(cli, runs["hf"])
    assert "Training done: 4 updates" in runs["printed"] and f"Model and tokenizer: {cli}" in runs["printed"]


def test_sft_config_validate_evaluates_the_saved_model(runs):
    """`validate --model.model_name_or_path <output_dir>`: TRL's evaluation of the final model, the same loss as the
    fit's evaluation at its last step (the same weights), printed and written to eval_results.json."""
    out = runs["cli"]
    argv = _cli_overrides(runs["model"], out)
    argv += ["--model.model_name_or_path", str(out)]
    printed = _ok(_cli("validate", *argv))
    metrics = json.loads([line for line in printed.splitlines() if line.startswith("{")][-1])
    last_eval = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "eval_loss" in e][-1]
    assert last_eval["step"] == 4
    assert metrics["eval_loss"] == pytest.approx(last_eval["eval_loss"], rel=1e-6)
    assert metrics["eval_mean_token_accuracy"] == pytest.approx(last_eval["eval_mean_token_accuracy"], rel=1e-6)
    assert metrics["epoch"] == last_eval["epoch"] and metrics["eval_samples"] == 16
    assert json.loads((out / "eval_results.json").read_text())["eval_loss"] == metrics["eval_loss"]


def _probe(tmp_path: Path, subcommand: str, *argv: str) -> tuple[str, bool, bool]:
    """`hf-lightning <subcommand> <argv>` in a small process that must stop with status 2: its one `error:` line,
    and whether torch and trl were imported by then."""
    code = ("import sys\nfrom hf_lightning.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as done:\n"
            "    print('EXIT', done.code, 'torch' in sys.modules, 'trl' in sys.modules)\n")
    process = subprocess.Popen([sys.executable, "-c", code, subcommand, *argv], cwd=REPO, env=_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    returncode, out, err = _done(process, timeout=300)
    assert returncode == 0, err[-3000:]
    status = out.strip().splitlines()[-1].split()
    assert status[:2] == ["EXIT", "2"], out[-2000:] + err[-3000:]
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err[-3000:]
    return lines[0], status[2] == "True", status[3] == "True"


def test_a_mistyped_args_key_is_one_error_line_naming_it(tmp_path):
    """`args:` is checked against the arguments class the config names (trl.SFTConfig): an unknown key is refused by
    name, with the closest field, before anything trains (no output folder)."""
    out = tmp_path / "out"
    line, _, trl = _probe(tmp_path, "fit", "--config", "configs/sft.yaml", "--args.output_dir", str(out),
                          "--args.max_lenght", "16")
    assert "unknown key(s) in `args`: max_lenght (did you mean max_length?)" in line and "trl.SFTConfig" in line
    assert trl  # SFTConfig's fields are known once trl is imported (after the swap)
    assert not out.exists()


def test_trl_not_allowed_by_the_config_is_refused_by_name_before_importing_it(tmp_path):
    """The config's allow-list (cli/config_code.py): without `allow_code_from: [trl]` the trainer class is refused,
    naming the key, the value and the entry that allows it, before torch or trl is imported."""
    config = yaml.safe_load((REPO / "configs" / "sft.yaml").read_text())
    del config["allow_code_from"]
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(config))
    line, torch_imported, trl_imported = _probe(tmp_path, "fit", "--config", str(tmp_path / "sft.yaml"),
                                                "--args.output_dir", str(tmp_path / "out"))
    assert "trainer_class='trl.SFTTrainer'" in line and "add 'trl' to allow_code_from" in line
    assert not torch_imported and not trl_imported


@pytest.mark.parametrize(("argv", "expected"), [
    (["predict"], "predict: a library trainer (TRL's SFTTrainer) tokenizes only the train and eval datasets"),
    (["fit", "--data.block_size", "16"], "data.block_size=16 is task-preset preprocessing, which a library trainer "
                                         "does not use (it tokenizes the rows itself); set args.max_length"),
    (["fit", "--data.train_file", "configs/data/nothing.jsonl"], "data.train_file='configs/data/nothing.jsonl': "
                                                                 "no such file"),
    (["fit", "--args_class", "null"], "trainer_class='trl.SFTTrainer' needs args_class"),
    (["fit", "--task", "text_classification"], "task='text_classification' cannot be combined with trainer_class"),
], ids=["predict", "preset_data_key", "missing_file", "no_args_class", "task_and_trainer_class"])
def test_config_mistakes_are_one_error_line_before_torch_is_imported(argv, expected, tmp_path):
    line, torch_imported, _ = _probe(tmp_path, argv[0], "--config", "configs/sft.yaml", *argv[1:])
    assert expected in line
    assert not torch_imported


def test_task_sft_is_the_short_form_of_the_trainer_and_args_classes(tmp_path):
    """`task: sft` instead of `trainer_class` / `args_class`: `--print_config` shows the classes it stands for and
    every SFTConfig field (TRL's defaults, the config's values)."""
    config = yaml.safe_load((REPO / "configs" / "sft.yaml").read_text())
    del config["trainer_class"], config["args_class"]
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump({"task": "sft", **config}))
    printed = yaml.safe_load(_ok(_cli("fit", "--config", tmp_path / "sft.yaml", "--print_config")))
    assert printed["trainer_class"] == "trl.SFTTrainer" and printed["args_class"] == "trl.SFTConfig"
    assert printed["args"]["max_length"] == 32 and printed["args"]["packing"] is False  # config / TRL's default
    assert printed["args"]["completion_only_loss"] is None and printed["trainer"] == {"accelerator": "cpu",
                                                                                       "devices": 1}


def test_the_shipped_sft_config_learns_its_task(tmp_path):
    """configs/sft.yaml as shipped (3 epochs of the reversal task, prompt / completion rows): the last evaluation's
    token accuracy on the completions is far above the share of the most frequent completion token."""
    out = tmp_path / "out"
    code, printed, err = _done(_cli("fit", "--config", "configs/sft.yaml", "--args.output_dir", out,
                                    "--args.disable_tqdm", "true"))
    assert code == 0, printed[-3000:] + err[-5000:]
    assert "Training done: 96 updates (3 epochs)" in printed
    # the config sets `activation_checkpointing`, not its deprecated alias (TRL's default keeps the alias at True)
    assert "is deprecated" not in err, err[-3000:]
    last = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "eval_loss" in e][-1]
    rows = [json.loads(line) for line in (DATA / "reverse_prompts_validation.jsonl").read_text().splitlines()]
    words = [w for row in rows for w in row["completion"].split()]
    majority = max(words.count(w) for w in set(words)) / len(words)
    assert last["eval_mean_token_accuracy"] > 0.8 > 2 * majority, (last, majority)


def test_help_of_a_library_config_lists_its_arguments_class_fields():
    """`fit --config configs/sft.yaml --help`: the options are SFTConfig's (TRL's own fields beside HF's), not the
    task presets' TrainingArguments."""
    shown = _ok(_cli("fit", "--config", "configs/sft.yaml", "--help"))
    assert "Runs trl.SFTTrainer" in shown
    for option in ("--args.packing", "--args.dataset_text_field", "--args.learning_rate",
                   "--model.model_name_or_path"):
        assert option in shown, option
    assert "--task" not in shown


def test_processes_lightning_would_start_are_refused_with_the_torchrun_line(tmp_path):
    """`--trainer.devices 2` from one process: Lightning's launcher would start the second process when fit begins,
    and TRL's constructor there (accelerate's PartialState, no RANK) cannot join; one line gives the torchrun command
    that runs it (each process builds the trainer) before anything trains."""
    line, _, _ = _probe(tmp_path, "fit", "--config", "configs/sft.yaml", "--args.output_dir", str(tmp_path / "out"),
                        "--trainer.devices", "2", "--trainer.strategy", "ddp")
    assert "trainer.devices=2 asks Lightning to start 2 processes from this one" in line
    assert "torchrun --nproc_per_node 2 -m hf_lightning fit --config ... --trainer.devices 2" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("trainer", "gpus", "expected"), [
    ({"accelerator": "cpu", "devices": 1}, 0, 1), ({"devices": 2}, 0, 2), ({"devices": "2"}, 0, 2),
    ({"devices": [0, 1]}, 2, 2), ({}, 0, 1), ({}, 4, 4), ({"accelerator": "cpu"}, 4, 1), ({"devices": -1}, 8, 8),
    ({"devices": 2, "num_nodes": 3}, 2, 6),
])
def test_processes_lightning_starts_reads_the_trainer_options_as_lightning(trainer, gpus, expected):
    from hf_lightning.cli.library_config import processes_lightning_starts

    assert processes_lightning_starts(trainer, gpus) == expected


@pytest.mark.distributed
def test_sft_config_under_torchrun_equals_run_sft_on_two_hf_processes(tmp_path):
    """`torchrun --nproc_per_node 2 -m hf_lightning fit --config configs/sft.yaml --trainer.devices 2 --trainer.strategy
    ddp` (gloo): every process builds TRL's trainer, then one DDP run, equal to run_sft.py on two transformers.Trainer
    processes."""
    model = make_tiny_model("llama", str(tmp_path / "llama"))
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    cli, hf = tmp_path / "cli" / "out", tmp_path / "hf" / "out"
    _ok(_run_sft_oracle(model, hf, launcher))  # one after the other: 2 processes each on a 2-core machine
    command = [*launcher, "-m", "hf_lightning", "fit", *_cli_overrides(model, cli), "--trainer.devices", "2",
               "--trainer.strategy", "ddp"]
    printed = _ok(subprocess.Popen(command, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True))
    assert printed.count("Training done: 4 updates") == 1  # the summary from the first process only
    _assert_same_run(cli, hf)


def test_fit_resumed_from_a_checkpoint_ends_as_the_uninterrupted_run(runs, tmp_path):
    """`fit --ckpt_path <output_dir>/checkpoint-2` into a new folder: updates 3-4 and the final weights are those of
    the run that was not stopped (hf_lightning's exact resume, under TRL's trainer)."""
    out = tmp_path / "resumed"
    _ok(_cli("fit", *_cli_overrides(runs["model"], out), "--ckpt_path", runs["cli"] / "checkpoint-2"))
    _assert_same_weights(out, runs["cli"])
    _assert_same_weights(out / "checkpoint-4", runs["cli"] / "checkpoint-4")
    whole = json.loads((runs["cli"] / "trainer_state.json").read_text())["log_history"]
    resumed = json.loads((out / "trainer_state.json").read_text())["log_history"]
    # TRL's own token counter starts again at 0 on a resumed run (TRL does not checkpoint it, on HF's base too)
    counters = ("num_tokens", "eval_num_tokens")
    after = [{k: v for k, v in e.items() if k not in counters} for e in _without_timings(resumed)
             if e["step"] > 2 and "train_loss" not in e]
    before = [{k: v for k, v in e.items() if k not in counters} for e in _without_timings(whole)
              if e["step"] > 2 and "train_loss" not in e]
    assert after and len(after) == len(before)
    for entry, expected in zip(after, before):
        assert entry == pytest.approx(expected, rel=1e-6, abs=1e-9), expected["step"]
