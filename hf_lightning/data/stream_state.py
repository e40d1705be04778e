"""What the saved position of a training stream holds, and its form in a checkpoint file.

A position is whatever `StatefulDataLoader.state_dict()` returns: plain containers, plus the `Held` values of the
exactly resumable shuffle buffer (`stream_shuffle.py`), which keep a buffer by reference so that taking a position
after every update costs nothing. `to_plain` turns those into plain containers (Arrow tables into IPC bytes) when a
checkpoint is written, so the file loads with `torch.load(weights_only=True)` (a checkpoint is not trusted code), and
`from_plain` turns them back.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Held", "from_plain", "to_plain"]


class Held:
    """A shuffle buffer's state, kept by reference inside a `datasets` state dict.

    `datasets` copies a state with `_fast_copy`, which deep-copies anything that is not a list, dict or tuple: this
    object answers `deepcopy` with itself, so a buffer of thousands of rows costs nothing to snapshot. It is never
    changed: the buffer makes a new one whenever its state moves.

    Args:
        kind: `"rows"` (Python examples: `(rows, order, position, generator state, last)`) or `"arrow"` (Arrow
            tables: `(kept table or None, generator state, key, finished)`).
        value: the tuple described above.
    """

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: tuple) -> None:
        self.kind = kind
        self.value = value

    def __deepcopy__(self, memo: dict) -> Held:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Held, (self.kind, self.value)


_HELD = "__hf_lightning_held__"
_KEY = "__datasets_key__"


def to_plain(state: Any) -> Any:
    """`state` with every `Held` turned into plain containers (Arrow tables into IPC bytes, the permutation into a
    list), so that a file holding it loads with `torch.load(weights_only=True)`; `from_plain` reverses it."""
    if isinstance(state, Held):
        first, *rest = state.value
        if state.kind == "arrow":
            return {_HELD: "arrow", "value": [_table_bytes(first), *rest]}
        order, *rest = rest
        rows = [(_plain_key(key), example) for key, example in first]
        return {_HELD: "rows", "value": [rows, [int(i) for i in order], *rest]}
    if isinstance(state, dict):
        return {k: to_plain(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(to_plain(v) for v in state)
    return state


def from_plain(state: Any) -> Any:
    """The inverse of `to_plain`."""
    if isinstance(state, dict) and _HELD in state:
        first, *rest = state["value"]
        if state[_HELD] == "arrow":
            return Held("arrow", (_table_from_bytes(first), *rest))
        return Held("rows", ([(_key_from_plain(key), example) for key, example in first], *rest))
    if isinstance(state, dict):
        return {k: from_plain(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(from_plain(v) for v in state)
    return state


def _plain_key(key: Any) -> Any:
    """An example's key: `datasets.builder.Key(shard, item)` as a tagged list, anything else (str, int) as it is."""
    if type(key).__name__ == "Key" and hasattr(key, "original_shard_id"):
        return {_KEY: [key.original_shard_id, key.item_or_batch_id]}
    return key


def _key_from_plain(key: Any) -> Any:
    if isinstance(key, dict) and _KEY in key:
        from datasets.builder import Key

        return Key(*key[_KEY])
    return key


def _table_bytes(table: Any) -> bytes | None:
    if table is None:
        return None
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def _table_from_bytes(data: bytes | None) -> Any:
    if data is None:
        return None
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all()
