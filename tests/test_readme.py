"""README's HF argument map is generated from the code: it must list every `transformers.TrainingArguments` field."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

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
    from hf_lightning.args.support import DIFFERENCES, SCRIPT_ONLY, UNSUPPORTED

    hf_fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    assert set(UNSUPPORTED) | set(DIFFERENCES) | set(SCRIPT_ONLY) <= hf_fields  # no stale names in the table
    assert not set(UNSUPPORTED) & (set(DIFFERENCES) | set(SCRIPT_ONLY))
    for name, status, note in argument_map():
        assert (status == "not supported") == (name in UNSUPPORTED), (name, status)
        assert (status == "supported with a difference") == (name in DIFFERENCES), (name, status)
        assert "lands with" not in note and "not wired yet" not in note, (name, note)  # no promises in the map
    assert ("output_dir", "supported", "") in argument_map()
