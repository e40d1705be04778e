"""A CLI config runs only the code it is allowed to (`hf_lightning/cli/config_code.py`).

Before: for `trainer.callbacks`, `trainer.logger`, `trainer.plugins`, `trainer.profiler` jsonargparse imported the
`class_path` module before its type check refused it (a module next to the config ran under `python -m
hf_lightning`), a `class_path` inside `model.config_kwargs` was imported too, and a `LambdaCallback` hook such as
`builtins.print` was called with the trainer. Each case here uses a module that writes a file when it is imported,
and checks that the file is not written, the module is not imported and the one error line names the key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_lightning.cli import main
from hf_lightning.cli.config_code import ConfigCodeError, check_config_code

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI.s args parameter")

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "text_classification.yaml")
ADVICE = "to allow_code_from"


def _plant(folder: Path, name: str) -> Path:
    """A module `name` in `folder` that writes `<folder>/<name>.ran` when imported (and defines a callback)."""
    marker = folder / f"{name}.ran"
    (folder / f"{name}.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
        "import lightning.pytorch as pl\n"
        "class Thing(pl.Callback):\n"
        "    def __init__(self, **kwargs):\n"
        "        super().__init__()\n"
        "def hook(*args, **kwargs):\n"
        f"    open({str(folder / (name + '.called'))!r}, 'w').write('called')\n"
    )
    return marker


@pytest.fixture
def planted(tmp_path, monkeypatch, request):
    """`(module name, marker file)`: the module is importable (its folder on sys.path, as the config's folder is
    under `python -m hf_lightning`) and the run happens in the repository (the configs' relative data paths)."""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"planted_{abs(hash(request.node.name)) % 10**8}"
    marker = _plant(tmp_path, name)
    yield name, marker
    assert name not in sys.modules


def _error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


# (key named in the error, how the config says it): {m} is the planted module
CASES = {
    "trainer.callbacks[0].class_path": {"trainer": {"callbacks": [{"class_path": "{m}.Thing"}]}},
    "trainer.logger.class_path": {"trainer": {"logger": {"class_path": "{m}.Thing", "init_args": {}}}},
    "trainer.plugins[0]": {"trainer": {"plugins": ["{m}.Thing"]}},
    "trainer.profiler.class_path": {"trainer": {"profiler": {"class_path": "{m}.Thing"}}},
    "trainer.strategy.class_path": {"trainer": {"strategy": {"class_path": "{m}.Thing"}}},
    "trainer.callbacks[0].init_args.on_fit_start": {"trainer": {"callbacks": [{
        "class_path": "lightning.pytorch.callbacks.LambdaCallback", "init_args": {"on_fit_start": "{m}.hook"}}]}},
    "trainer.callbacks[0].init_args.inner.class_path": {"trainer": {"callbacks": [{
        "class_path": "lightning.pytorch.callbacks.LambdaCallback",
        "init_args": {"inner": {"class_path": "{m}.Thing"}}}]}},
    "model.config_kwargs.x.class_path": {"model": {"config_kwargs": {"x": {"class_path": "{m}.Thing"}}}},
    "model.from_pretrained_kwargs.x.class_path": {
        "model": {"from_pretrained_kwargs": {"x": {"class_path": "{m}.Thing"}}}},
    "args.lr_scheduler_kwargs.x.class_path": {"args": {"lr_scheduler_kwargs": {"x": {"class_path": "{m}.Thing"}}}},
    "data.special_tokens.class_path": {"data": {"special_tokens": {"class_path": "{m}.Thing"}}},
    "peft.x.class_path": {"peft": {"x": {"class_path": "{m}.Thing"}}},
    "hf_callbacks[0].class_path": {"hf_callbacks": [{"class_path": "{m}.Thing"}]},
}


def _fill(value, module: str):
    if isinstance(value, dict):
        return {k: _fill(v, module) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, module) for v in value]
    return value.replace("{m}", module) if isinstance(value, str) else value


@pytest.mark.parametrize("key", sorted(CASES))
def test_every_section_is_checked_before_any_import(key, planted, tmp_path, capsys):
    module, marker = planted
    config = tmp_path / "extra.yaml"
    config.write_text(yaml.safe_dump(_fill(CASES[key], module)))
    line = _error(["fit", "--config", CONFIG, "--config", str(config), "--args.output_dir", str(tmp_path / "o")],
                  capsys)
    assert f"{key}='{module}." in line, line
    assert f"add '{module}' {ADVICE}" in line, line
    assert not marker.exists() and not (tmp_path / f"{module}.called").exists()


@pytest.mark.parametrize(("options", "key"), [
    (["--trainer.callbacks+={m}.Thing"], "trainer.callbacks"),
    (["--trainer.callbacks+=LambdaCallback", "--trainer.callbacks.on_fit_start={m}.hook"],
     "trainer.callbacks.on_fit_start"),
    (["--trainer.logger", "{m}.Thing"], "trainer.logger"),
    (["--trainer.callbacks", "[{class_path: {m}.Thing}]"], "trainer.callbacks[0].class_path"),
    (["--trainer.profiler.class_path", "{m}.Thing"], "trainer.profiler.class_path"),
    (["--model.config_kwargs", "{hidden_size: 32, x: {class_path: {m}.Thing}}"], "model.config_kwargs.x.class_path"),
    (["--config", "{trainer: {plugins: [{m}.Thing]}}"], "trainer.plugins[0]"),
], ids=["append", "lambda_hook", "logger", "inline_list", "flat_class_path", "nested_dict", "inline_config"])
def test_command_line_values_are_checked(options, key, planted, tmp_path, capsys):
    module, marker = planted
    argv = ["fit", "--config", CONFIG, "--args.output_dir", str(tmp_path / "o"),
            *(o.replace("{m}", module) for o in options)]
    line = _error(argv, capsys)
    assert f"{key}='{module}." in line, line
    assert not marker.exists()


def test_section_files_are_read_and_checked(planted, tmp_path, capsys):
    """`--trainer trainer.yaml` and `trainer: trainer.yaml` inside a config: jsonargparse loads the file."""
    module, marker = planted
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"callbacks": [{"class_path": f"{module}.Thing"}]}))
    line = _error(["fit", "--config", CONFIG, "--args.output_dir", str(tmp_path / "o"),
                   "--trainer", str(tmp_path / "trainer.yaml")], capsys)
    assert f"trainer.callbacks[0].class_path='{module}.Thing'" in line
    (tmp_path / "main.yaml").write_text(yaml.safe_dump({"trainer": "trainer.yaml"}))  # relative to main.yaml
    line = _error(["fit", "--config", CONFIG, "--config", str(tmp_path / "main.yaml"),
                   "--args.output_dir", str(tmp_path / "o")], capsys)
    assert f"trainer.callbacks[0].class_path='{module}.Thing'" in line
    assert not marker.exists()


def test_a_sub_config_that_names_itself_is_read_once(tmp_path):
    (tmp_path / "loop.yaml").write_text(yaml.safe_dump({"callbacks": "loop.yaml", "logger": False}))
    (tmp_path / "main.yaml").write_text(yaml.safe_dump({"trainer": "loop.yaml"}))
    assert check_config_code(["--config", str(tmp_path / "main.yaml")]) == []


@pytest.mark.parametrize(("value", "expected"), [
    ("builtins.print", "the standard library cannot be allowed"),
    ("os.system", "the standard library cannot be allowed"),
    ("torch.save", "is a function (or another callable that is not a class): a config names classes from torch"),
    ("transformers.trainer_utils.set_seed", "is a function"),
])
def test_lambda_callback_hooks_name_no_function_outside_allow_code_from(value, expected, tmp_path, capsys,
                                                                        monkeypatch):
    """`builtins.print` used to be called with the trainer and the module; library functions are refused too."""
    monkeypatch.chdir(REPO)
    line = _error(["fit", "--config", CONFIG, "--args.output_dir", str(tmp_path / "o"),
                   "--trainer.callbacks+=LambdaCallback", f"--trainer.callbacks.on_fit_start={value}"], capsys)
    assert f"trainer.callbacks.on_fit_start='{value}'" in line and expected in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("entry", ["builtins", "os", "subprocess", "jsonargparse", "os.path"])
def test_allow_code_from_cannot_list_the_standard_library(entry):
    with pytest.raises(ConfigCodeError, match=r"the standard library \(or jsonargparse\).*cannot allow it"):
        check_config_code(["--config", CONFIG, "--allow_code_from", f"[{entry}]"])


def test_library_classes_and_plain_values_pass():
    """Classes of the allowed packages, dtype-like values and dotted strings that name no module are not code."""
    allowed = check_config_code([
        "--config", CONFIG, "--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateMonitor",
        "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=eval.loss",
        "--trainer.logger", "{class_path: lightning.pytorch.loggers.CSVLogger, init_args: {save_dir: logs.v2}}",
        "--model.config_kwargs", "{torch_dtype: torch.float16}", "--data.tokenizer_file", "tokenizer.json",
    ])
    assert allowed == []


@pytest.mark.parametrize("config", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_the_shipped_configs_pass(config):
    # configs/sft.yaml, dpo.yaml and grpo.yaml import TRL's classes, and say so (cli/library_config.py)
    expected = ["trl"] if config in ("sft.yaml", "dpo.yaml", "grpo.yaml") else []
    assert check_config_code(["--config", str(REPO / "configs" / config)]) == expected


def test_allow_code_from_lets_the_users_module_in_and_runs_it(tmp_path):
    """A real `python -m hf_lightning` next to the module: refused without `allow_code_from` (nothing imported),
    then run with it (the callback class and the LambdaCallback hook both from the user's module)."""
    marker = _plant(tmp_path, "my_callbacks")
    (tmp_path / "configs").symlink_to(REPO / "configs")  # the configs' relative data paths, from the run's folder
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "my_callbacks.Thing"},
        {"class_path": "lightning.pytorch.callbacks.LambdaCallback",
         "init_args": {"on_fit_start": "my_callbacks.hook"}},
    ]}}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "hf_lightning", "fit", "--config", "configs/text_classification.yaml",
            "--config", "mine.yaml", "--args.max_steps", "1", "--args.output_dir", "out"]
    refused = subprocess.run(base, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "trainer.callbacks[0].class_path='my_callbacks.Thing'" in refused.stderr
    assert not marker.exists()
    ran = subprocess.run([*base, "--allow_code_from", "[my_callbacks]"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert marker.exists() and (tmp_path / "my_callbacks.called").exists()


def test_jsonargparse_refuses_what_the_walk_did_not_foresee(tmp_path, monkeypatch):
    """The second line of defence: after `enforce_in_parser`, jsonargparse itself refuses a value's import outside
    the allowed packages before importing it (where the installed jsonargparse has an import-path policy)."""
    import inspect

    import jsonargparse

    from hf_lightning.cli.config_code import enforce_in_parser

    if "import_path_allowlist" not in inspect.signature(jsonargparse.set_parsing_settings).parameters:
        pytest.skip("this jsonargparse has no import-path policy")
    monkeypatch.syspath_prepend(str(tmp_path))
    marker = _plant(tmp_path, "unforeseen_module")
    enforce_in_parser([])
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--fn", type=type)
    with pytest.raises(jsonargparse.ArgumentError):
        parser.parse_args(["--fn", "unforeseen_module.Thing"])
    assert not marker.exists() and "unforeseen_module" not in sys.modules
    assert parser.parse_args(["--fn", "torch.nn.Linear"]).fn.__name__ == "Linear"


# ----- issue 29 item 6 (and issue 35): every route by which a config reaches jsonargparse -----
@pytest.mark.parametrize("option", ["--conf", "--co", "--confi"])
def test_an_abbreviation_of_config_is_refused_before_any_import(option, planted, tmp_path, capsys):
    """argparse took `--conf` for `--config`, which the walk did not read. (Before: a function of a library ran
    as a LambdaCallback hook; a foreign module got jsonargparse's multi-part text after the full import.)"""
    module, marker = planted
    config = tmp_path / "extra.yaml"
    config.write_text(yaml.safe_dump(_fill(CASES["trainer.callbacks[0].class_path"], module)))
    line = _error(["fit", "--config", CONFIG, option, str(config), "--args.output_dir", str(tmp_path / "o")], capsys)
    assert f"{option}: write --config in full" in line, line
    assert not marker.exists()


def test_the_parsers_take_no_abbreviation():
    """`allow_abbrev=False` on every parser the CLI builds (the main one and each subcommand's): an abbreviation
    the walk did not read cannot reach a value."""
    from hf_lightning.cli.lightning_cli import HFLightningCLI, _OneLineErrorParser

    cli = HFLightningCLI.__new__(HFLightningCLI)  # only `init_parser`, without parsing a command line
    cli.parser_class = _OneLineErrorParser
    parser = cli.init_parser(prog="hf-lightning")
    assert parser.allow_abbrev is False


@pytest.mark.parametrize("variables", [
    {"PL_FIT__CONFIG": "{extra}"},
    {"PL_FIT__TRAINER__CALLBACKS": "[{{class_path: {m}.Thing}}]"},
], ids=["config_file", "callbacks"])
def test_environment_variables_are_checked_when_jsonargparse_reads_them(variables, planted, tmp_path, capsys,
                                                                        monkeypatch):
    """`JSONARGPARSE_DEFAULT_ENV=true` makes jsonargparse read `PL_FIT__*`: those values are walked too, also for
    `--print_config` (which prints what it parsed). (Before: not read by the check.)"""
    module, marker = planted
    config = tmp_path / "extra.yaml"
    config.write_text(yaml.safe_dump(_fill(CASES["trainer.callbacks[0].class_path"], module)))
    monkeypatch.setenv("JSONARGPARSE_DEFAULT_ENV", "true")
    for name, value in variables.items():
        monkeypatch.setenv(name, value.format(extra=config, m=module))
    for extra in ([], ["--print_config"]):
        line = _error(["fit", "--config", CONFIG, "--args.output_dir", str(tmp_path / "o"), *extra], capsys)
        assert f"trainer.callbacks[0].class_path='{module}.Thing'" in line, line
    assert not marker.exists()
    # the same variables while jsonargparse does not read the environment: nothing to check, nothing refused
    monkeypatch.setenv("JSONARGPARSE_DEFAULT_ENV", "false")
    assert check_config_code(["--config", CONFIG], "fit") == []


def test_a_missing_config_and_a_mistyped_callback_module_are_named_before_the_heavy_imports(tmp_path):
    """Issue 35: `--config nope.yaml` and `--trainer.callbacks+=lightning.pytorch.callbakcs.EarlyStopping` are one
    line each, with torch, Lightning and transformers not imported. (Before: the mistyped module got jsonargparse's
    multi-part denylist text after 30+ s.)"""
    import json

    runs = [["fit", "--config", CONFIG, "--config", "configs/nope.yaml"],
            ["fit", "--config", CONFIG, "--trainer.callbacks+=lightning.pytorch.callbakcs.EarlyStopping"]]
    code = (
        "import sys, json\n"
        "from hf_lightning.cli import main\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 2, argv\n"
        "    heavy = sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules)\n"
        "    print(json.dumps(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, json.dumps(runs)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [json.loads(line) for line in result.stdout.splitlines()] == [[], []]
    assert result.stderr.splitlines() == [
        "hf-lightning fit: error: --config 'configs/nope.yaml': no such config file (from "
        f"{str(REPO)!r}; a --config value is a YAML file or an inline YAML mapping).",
        "hf-lightning fit: error: trainer.callbacks='lightning.pytorch.callbakcs.EarlyStopping' cannot be imported "
        "(no module 'lightning.pytorch.callbakcs' (did you mean 'lightning.pytorch.callbacks'?)); check the spelling "
        "of the class path."]


# ----- issue 29 item 2: a model folder's own code is code -----
@pytest.fixture
def remote_code_model(tmp_path):
    """A model folder whose config.json maps AutoConfig to its own module, which writes `<tmp>/remote.ran` when
    imported (as `trust_remote_code=True` would import it)."""
    folder = tmp_path / "evil_model"
    folder.mkdir()
    marker = tmp_path / "remote.ran"
    (folder / "config.json").write_text('{"model_type": "evil", "auto_map": {"AutoConfig": '
                                        '"configuration_evil.EvilConfig"}}')
    (folder / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n"
        "    model_type = 'evil'\n")
    return folder, marker


def test_trust_remote_code_needs_the_model_folder_in_allow_code_from(remote_code_model, tmp_path, capsys,
                                                                     monkeypatch):
    """`--model.from_pretrained_kwargs '{trust_remote_code: true}'` reached `AutoConfig.from_pretrained` (and
    `label_list_for`): the folder's module ran before the run failed. Now one line before any import, unless the
    folder (or hub id) is in allow_code_from or `allow_remote_code: true`."""
    folder, marker = remote_code_model
    monkeypatch.chdir(REPO)
    trust = ["--model.from_pretrained_kwargs", "{trust_remote_code: true}"]
    line = _error(["fit", "--config", CONFIG, "--args.output_dir", str(tmp_path / "o"),
                   "--model.model_name_or_path", str(folder), *trust], capsys)
    assert line.startswith(f"hf-lightning fit: error: model.from_pretrained_kwargs.trust_remote_code=True with "
                           f"model.model_name_or_path={str(folder)!r}: from_pretrained would import and run"), line
    assert f"add it to allow_code_from (`allow_code_from: [{folder}]`) or set `allow_remote_code: true`" in line
    assert not marker.exists()
    # validate / predict load --ckpt_path as the model: the same rule
    line = _error(["predict", "--config", CONFIG, "--args.output_dir", str(tmp_path / "o"), "--ckpt_path",
                   str(folder), *trust], capsys)
    assert f"ckpt_path={str(folder)!r}" in line and not marker.exists()
    # allowed: by the folder (another spelling of the same folder too) or by allow_remote_code
    base = ["--config", CONFIG, "--model.model_name_or_path", str(folder), *trust]
    assert check_config_code([*base, "--allow_code_from", f"[{folder}/.]"], "fit") == []
    assert check_config_code([*base, "--allow_remote_code", "true"], "fit") == []
    assert check_config_code(["--config", CONFIG, "--model.model_name_or_path", "org/model", *trust,
                              "--allow_code_from", "[org/model]"], "fit") == []
    with pytest.raises(ConfigCodeError, match="model.model_name_or_path='org/model'"):
        check_config_code(["--config", CONFIG, "--model.model_name_or_path", "org/model", *trust], "fit")
    assert not marker.exists()
