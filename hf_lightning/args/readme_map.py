"""The HF argument map: every `transformers.TrainingArguments` and `Seq2SeqTrainingArguments` field, marked supported
/ supported with a difference / not supported, computed from `support.py` (the table the checks use).

`python -m hf_lightning.args.readme_map` prints the README table; tests/test_readme.py checks README holds exactly it.
"""

from __future__ import annotations

import dataclasses

from hf_lightning.args.support import DIFFERENCES, OURS, SCRIPT_ONLY, UNSUPPORTED

__all__ = ["argument_map", "markdown_table"]

_ON_SEQ2SEQ = "on `Seq2SeqTrainingArguments` (the CLI's generation tasks)"
SEQ2SEQ_NOTES = {
    "sortish_sampler": f"{_ON_SEQ2SEQ}; no effect, as HF's `Seq2SeqTrainer` does not use it either",
    "predict_with_generate": _ON_SEQ2SEQ,
    "generation_max_length": _ON_SEQ2SEQ,
    "generation_num_beams": _ON_SEQ2SEQ,
    "generation_config": f"{_ON_SEQ2SEQ}: a `GenerationConfig`, a folder or file path, or a name",
}
"""Notes for the fields `Seq2SeqTrainingArguments` adds."""


def _row(name: str) -> tuple[str, str, str]:
    if name in UNSUPPORTED:
        return name, "not supported", f"must keep its default; instead: {UNSUPPORTED[name]}"
    if name in DIFFERENCES:
        return name, "supported with a difference", DIFFERENCES[name]
    return name, "supported", SCRIPT_ONLY.get(name) or SEQ2SEQ_NOTES.get(name, "")


def argument_map() -> list[tuple[str, str, str]]:
    """`(field, status, note)` for every init field of `transformers.Seq2SeqTrainingArguments` (which holds every
    `TrainingArguments` field first), in HF's order, then hf_lightning's own fields (`support.OURS`)."""
    import transformers

    hf_rows = [_row(f.name) for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments) if f.init]
    return hf_rows + [(name, "ours (not in HF)", note) for name, note in OURS.items()]


def markdown_table() -> str:
    """The README table."""
    lines = ["| argument | status | note |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {status} | {note} |" for name, status, note in argument_map()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
