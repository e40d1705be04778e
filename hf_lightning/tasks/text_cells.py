"""Every cell of a text column is text, checked on the loaded splits before tokenisation.

An empty CSV cell is read as None, and a column of numbers as integers: the tokenizer then fails inside
`datasets.map` with a `TypeError` of some 76 lines naming no row or column. `check_text_cells` reads the Arrow
columns (no Python row objects) and names the first bad cell by split, row and column, with what to do. A list of
words is expected for token classification (`is_split_into_words`).
"""

from __future__ import annotations

from typing import Any

from hf_lightning.tasks.task import Task

__all__ = ["check_text_cells"]


def _text_problem(column: Any, words: bool) -> tuple[int, str] | None:
    """`(row, what is wrong)` of the first cell of an Arrow column that is not text (a list of text for `words`)."""
    import pyarrow as pa  # `datasets` has imported it; `import hf_lightning.cli.lightning_cli` stays without it
    import pyarrow.compute as pc

    kind = column.type
    if words:
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            return 0, f"holds {kind} values, not lists of words"
        inner = kind.value_type
        if not (pa.types.is_string(inner) or pa.types.is_large_string(inner)):
            return 0, f"holds lists of {inner} values, not lists of words"
        nulls = pc.is_null(column)
        if pc.any(nulls).as_py():
            return int(pc.index(nulls, True).as_py()), "is empty (no words)"
        flat_nulls = pc.is_null(pc.list_flatten(column))
        if pc.any(flat_nulls).as_py():
            parents = pc.list_parent_indices(column)
            return int(parents[pc.index(flat_nulls, True).as_py()].as_py()), "holds an empty word (None)"
        return None
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return 0, f"holds {kind} values, not text (the column is read as numbers: give text, or quote the cells)"
    nulls = pc.is_null(column)
    if pc.any(nulls).as_py():
        return int(pc.index(nulls, True).as_py()), "is empty (None: a missing value in the file)"
    return None


def check_text_cells(task: Task, spec: Any, raw: dict[str, Any]) -> None:
    """Every cell of the text columns (`data.text_column`, `data.text_pair_column`, `data.target_column` where the
    split has it) is text, or a list of words for token classification; read from Arrow, before tokenisation.

    Raises:
        ValueError: naming the `data.` key, the split, the row, the column and what to do.
    """
    words = task.name == "token_classification"
    for split, dataset in raw.items():
        names = getattr(dataset, "column_names", None)
        if names is None or not hasattr(dataset, "with_format"):
            continue  # a stream: its rows are checked as they are read
        for key in ("text_column", "text_pair_column", "target_column"):
            column = getattr(spec, key, None)
            if not column or column not in names or (key == "target_column" and not task.generates):
                continue
            problem = _text_problem(dataset.with_format("arrow")[column], words and key == "text_column")
            if problem is not None:
                row, what = problem
                raise ValueError(
                    f"data.{key}={column!r}: the {split} data, row {row}, column {column!r} {what}; each cell must be "
                    f"{'a list of words' if words and key == 'text_column' else 'text'}. Fill or drop such rows "
                    "(e.g. `dataset.filter(...)`, or fix the file), before training.")
