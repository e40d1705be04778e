"""README's HF argument map is generated from the code: it must list every `transformers.TrainingArguments` field."""

from __future__ import annotations

import dataclasses
import enum
import re
from pathlib import Path
from typing import Any

import transformers

from hf_lightning.args.readme_map import argument_map, markdown_table

README = Path(__file__).resolve().parents[1] / "README.md"


def _map_section() -> str:
    text = README.read_text()
    match = re.search(r"<!-- arg-map:start -->\n(.*)\n<!-- arg-map:end -->", text, re.S)
    assert match, "README lost its arg-map markers"
    return match.group(1)


def test_every_hf_field_is_in_the_readme_map():
    section = _map_section()
    fields = [f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments) if f.init]
    missing = [name for name in fields if f"| `{name}` |" not in section]
    assert not missing, f"README argument map lacks {missing}; run `python -m hf_lightning.args.readme_map`"


def test_readme_map_matches_the_code():
    assert _map_section() == markdown_table(), "README argument map is stale; paste `python -m hf_lightning.args.readme_map`"


def test_map_statuses_follow_the_support_table():
    from hf_lightning.args.support import DIFFERENCES, OURS, SCRIPT_ONLY, UNSUPPORTED

    hf_fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    assert set(UNSUPPORTED) | set(DIFFERENCES) | set(SCRIPT_ONLY) <= hf_fields  # no stale names in the table
    assert not set(UNSUPPORTED) & (set(DIFFERENCES) | set(SCRIPT_ONLY))
    assert not set(OURS) & hf_fields  # our own fields never shadow an HF one
    for name, status, note in argument_map():
        assert (status == "ours (not in HF)") == (name in OURS), (name, status)
        assert (status == "not supported") == (name in UNSUPPORTED), (name, status)
        assert (status == "supported with a difference") == (name in DIFFERENCES), (name, status)
        assert "lands with" not in note and "not wired yet" not in note, (name, note)  # no promises in the map
    assert ("output_dir", "supported", "") in argument_map()


def _other_value(field: dataclasses.Field, default: Any) -> Any:
    """A value different from `default` of the field's type (None when there is no obvious one)."""
    if isinstance(default, enum.Enum):
        others = [member for member in type(default) if member != default]
        return others[0] if others else None
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 2
    if isinstance(default, float):
        return default + 0.25 if default < 1 else default * 2
    if isinstance(default, str):
        return f"{default}_x" if default else "x"
    if default is None:
        hint = str(field.type)
        for name, value in (("bool", True), ("int", 3), ("float", 0.5), ("str", "x"), ("dict", {"a": 1})):
            if name in hint:
                return value
    return None


def _observed(name: str, value: Any, tmp_path: Path) -> str | None:
    """What converting a `transformers.TrainingArguments` with `name=value` does: "kept" (our field has the value),
    "dropped" (accepted, not a field of ours), "refused" (the conversion error names it); None when HF itself
    rejects or normalises the value, or our validation refuses it for another reason."""
    import warnings

    from hf_lightning.seq2seq.args import Seq2SeqTrainingArguments
    from hf_lightning.seq2seq.trainer import to_seq2seq_args

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf_args = transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path), **{name: value})
            reference = transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path))
    except Exception:  # HF refuses this value (or needs hardware / packages for it): nothing to observe
        return None
    if getattr(hf_args, name) == getattr(reference, name):
        return None
    try:
        ours = to_seq2seq_args(hf_args)
    except ValueError as err:
        return "refused" if "not supported" in str(err) and f"`{name}`" in str(err) else None
    if name not in {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)}:
        return "dropped"
    theirs = getattr(hf_args, name)
    theirs = theirs.value if isinstance(theirs, enum.Enum) else theirs
    return "kept" if getattr(ours, name) == theirs else "changed"


def test_map_statuses_match_what_the_conversion_does(tmp_path):
    """Each field set to a value of its own type on a `transformers.TrainingArguments`: a "supported" field arrives
    in ours, an "accepted and ignored" one is dropped, a "not supported" one is refused by name."""
    fields = {f.name: f for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments) if f.init}
    defaults = transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path))
    checked, wrong = 0, []
    for name, status, note in argument_map():
        if status == "ours (not in HF)":
            continue  # not a field of transformers.TrainingArguments: nothing to convert
        value = _other_value(fields[name], getattr(defaults, name))
        observed = None if value is None else _observed(name, value, tmp_path)
        if observed is None:
            continue
        checked += 1
        if status == "not supported":
            expected = {"refused"}
        elif note.startswith("accepted and ignored"):
            expected = {"dropped"}
        elif status == "supported":
            expected = {"kept"}
        else:  # supported with a difference: the value may be translated
            expected = {"kept", "changed"}
        if observed not in expected:
            wrong.append(f"{name}: the map says {status!r} ({note}), the conversion {observed} {value!r}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 0.75 * len(fields), f"only {checked} of {len(fields)} fields could be checked"


def test_configs_readme_states_the_model_sizes_of_the_configs():
    """configs/README.md's model column ("hidden 64", "n_embd 32", "d_model 64") is what each YAML builds."""
    import yaml

    configs = README.parent / "configs"
    rows = re.findall(r"^\| `([a-z_0-9]+\.yaml)` \| `[a-z_0-9]+`[^|]* \| ([^|]+) \|", (configs / "README.md").read_text(), re.M)
    assert len(rows) == len(list(configs.glob("*.yaml")))
    for name, model in rows:
        kwargs = yaml.safe_load((configs / name).read_text())["model"]["config_kwargs"]
        for key, size in re.findall(r"\b(hidden|n_embd|d_model) (\d+)", model):
            field = {"hidden": "hidden_size"}.get(key, key)
            assert kwargs[field] == int(size), f"configs/README.md says {key} {size} for {name}: {kwargs[field]}"
        assert re.search(r"\b(hidden|n_embd|d_model) \d+", model), f"configs/README.md: no model size for {name}"


def test_every_output_folder_of_the_readme_is_git_ignored():
    """Running the README's blocks in a clone leaves `git status` clean: each `output_dir` they write is ignored."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (README.parent / ".git").exists():
        import pytest

        pytest.skip("not a git checkout")
    text = README.read_text()
    folders = set(re.findall(r"""output_dir[= ]["']?([A-Za-z0-9_./-]+?)["']?[,)\s]""", text)) - {"<new", "<output_dir>"}
    folders = {f.split("/")[0] for f in folders if not f.startswith(("<", "$", "/"))}
    assert {"out_lora", "out_seq2seq", "out_lightning", "weighted_output", "lora_output"} <= folders
    for folder in sorted(folders):
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{folder}/x"], cwd=README.parent, timeout=60)
        assert ignored.returncode == 0, f"{folder}/ (an output_dir in README.md) is not in .gitignore"


def test_the_readme_test_command_is_what_ci_runs():
    """CI (`.ci/run`) calls the README's check and test commands, exactly as written there."""
    text = README.read_text()
    block = text.split("Run the checks and the whole test suite", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    pytest_lines = [line for line in block.splitlines() if line.startswith("python -m pytest")]
    assert len(pytest_lines) == 1, block
    assert pytest_lines[0] in ci, f".ci/run does not run the README's test command {pytest_lines[0]!r}"
    # the checks before it: the same install (CI's pip is quiet), lint and type commands
    quiet = [line.replace("pip install -q ", "pip install ") for line in ci]
    for command in block.splitlines()[0].split(" && ")[2:]:
        assert command in quiet, f".ci/run does not run the README's {command!r}"
