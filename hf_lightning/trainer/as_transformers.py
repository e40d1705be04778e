"""`use_as_transformers_trainer()`: make `transformers.Trainer` (and its arguments and seq2seq variants) be
hf_lightning's, so library trainers built on it (TRL's `SFTTrainer` / `DPOTrainer`, sentence-transformers'
`SentenceTransformerTrainer`) run on Lightning unchanged; `restore_transformers_trainer()` undoes it.

A library binds the base class once, when its module runs `class SFTTrainer(Trainer)`; so the swap has to happen
before the library is imported, and what it swaps is every place such an import reads from:

- the `transformers` package object (`from transformers import Trainer`). transformers is a lazy module, and the
  first import of `transformers.processing_utils` executes `transformers/__init__.py` a second time
  (`direct_transformers_import`), which puts a NEW lazy module object into `sys.modules["transformers"]`: an
  attribute set on the earlier object is not seen by later imports. `processing_utils` is imported here first, so the
  object patched is the one that stays; earlier objects still alive (bound by an `import transformers` that ran
  before, perhaps with the real classes cached on them) are patched too;
- the submodules (`from transformers.trainer import Trainer`, `transformers.training_args`,
  `transformers.trainer_seq2seq`, `transformers.training_args_seq2seq`): a lazy module object resolves a name it has
  not cached from these, so any other object of the package resolves to hf_lightning's as well.

A class that already subclasses the real `transformers.Trainer` (the library was imported first) cannot be moved onto
hf_lightning: the call refuses, naming it, instead of leaving that class silently on transformers' loop.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from hf_lightning.args.accelerator_config import set_state_provider
from hf_lightning.trainer.accelerate_state import provide_accelerate_state

__all__ = [
    "SWAPPED", "default_lightning_kwargs", "is_using_hf_lightning", "restore_transformers_trainer",
    "use_as_transformers_trainer",
]

SWAPPED: tuple[tuple[str, str, str], ...] = (
    # (name, transformers submodule that defines it, hf_lightning module that defines ours)
    ("Trainer", "transformers.trainer", "hf_lightning.trainer.facade"),
    ("TrainingArguments", "transformers.training_args", "hf_lightning.args"),
    ("Seq2SeqTrainer", "transformers.trainer_seq2seq", "hf_lightning.seq2seq.trainer"),
    ("Seq2SeqTrainingArguments", "transformers.training_args_seq2seq", "hf_lightning.seq2seq.args"),
)
"""The names `use_as_transformers_trainer` replaces, where transformers defines them, and where ours live."""

_OWN_PACKAGES = ("transformers", "hf_lightning")


_originals: dict[str, Any] | None = None
"""While swapped: each swapped name's real transformers class, to put back; None otherwise."""
_lightning_kwargs: dict[str, Any] = {}
"""The `lightning_kwargs` of every `hf_lightning.Trainer` built without its own (`use_as_transformers_trainer`)."""


def _ours() -> dict[str, type]:
    return {name: getattr(importlib.import_module(module), name) for name, _, module in SWAPPED}


def _real_classes() -> dict[str, type]:
    """The real transformers classes: the submodules' attributes, or the originals kept by an active swap."""
    if _originals is not None:
        return dict(_originals)
    return {name: getattr(importlib.import_module(module), name) for name, module, _ in SWAPPED}


def _library_subclasses(base: type) -> list[type]:
    """Classes outside transformers and hf_lightning that subclass `base` (directly or not)."""
    found: dict[type, None] = {}
    pending: list[type] = list(base.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls in found:
            continue
        if cls.__module__.split(".")[0] not in _OWN_PACKAGES:
            found[cls] = None
        pending.extend(cls.__subclasses__())
    return list(found)


def _refusal(real: dict[str, type]) -> str | None:
    """Why the swap cannot be made (a class already built on a real transformers class), or None."""
    gc.collect()  # a class no longer referenced (a test's local subclass) is not a library's
    taken = [f"{cls.__module__}.{cls.__qualname__} (subclass of the real transformers.{name})"
             for name, base in real.items() for cls in _library_subclasses(base)]
    if not taken:
        return None
    packages = sorted({line.split(".", 1)[0] for line in taken})
    return (
        "hf_lightning.use_as_transformers_trainer() must run before any library subclasses transformers' trainer "
        f"classes; these already do, and would keep running on transformers' own loop: {', '.join(taken)}. Call it "
        f"first, before importing {', '.join(packages)} (e.g. at the top of the script, right after `import "
        "hf_lightning`)."
    )


def _package_objects() -> list[ModuleType]:
    """Every `transformers` package object alive: the one in `sys.modules` first, then any earlier one a module still
    holds (`import transformers` ran before the package object was replaced; it may have cached the real classes)."""
    current = sys.modules["transformers"]
    # `type()`, not `isinstance`: isinstance reads `__class__`, which some deprecated objects warn on (torch's)
    earlier = [obj for obj in gc.get_objects() if issubclass(type(obj), ModuleType) and obj is not current
               and getattr(obj, "__name__", None) == "transformers"]
    return [current, *earlier]


def _patch(packages: list[ModuleType], values: dict[str, Any]) -> None:
    for name, submodule, _ in SWAPPED:
        setattr(importlib.import_module(submodule), name, values[name])
        for package in packages:
            setattr(package, name, values[name])


def use_as_transformers_trainer(lightning_kwargs: Mapping[str, Any] | None = None) -> None:
    """Make `transformers.Trainer`, `TrainingArguments`, `Seq2SeqTrainer` and `Seq2SeqTrainingArguments` be
    hf_lightning's for this process, so a library's trainer subclass (TRL, sentence-transformers) runs on Lightning.

    Call it once, before importing the library: its classes subclass whatever `transformers.Trainer` is when they are
    defined. Idempotent; correct whichever of `transformers` and `hf_lightning` was imported first.
    `restore_transformers_trainer()` undoes it (for tests).

    Args:
        lightning_kwargs: the `lightning.Trainer` options (strategy, devices, precision, logger, callbacks...) of
            every `hf_lightning.Trainer` built without its own `lightning_kwargs`: a library's constructor
            (`SFTTrainer(...)`) has no such parameter. None keeps those of an earlier call (none at first).

    Raises:
        RuntimeError: a class outside transformers / hf_lightning already subclasses a real transformers class (the
            library was imported first), naming each.
    """
    global _originals
    # executes transformers/__init__.py again on its first import: the package object changes here, not later
    importlib.import_module("transformers.processing_utils")
    real = _real_classes()
    if (problem := _refusal(real)) is not None:
        raise RuntimeError(problem)
    packages = _package_objects()
    _patch(packages, _ours())
    _originals = real
    set_state_provider(provide_accelerate_state)  # our arguments configure accelerate's state, as HF's do
    if lightning_kwargs is not None:
        _lightning_kwargs.clear()
        _lightning_kwargs.update(lightning_kwargs)


def restore_transformers_trainer() -> None:
    """Undo `use_as_transformers_trainer()`: the four names are transformers' own again (no-op when not swapped).

    Classes defined while the swap was active (a library imported in between) stay built on hf_lightning's; a library
    imported again in a fresh process gets transformers' classes.
    """
    global _originals
    if _originals is None:
        return
    _patch(_package_objects(), _originals)
    _originals = None
    set_state_provider(None)
    _lightning_kwargs.clear()


def default_lightning_kwargs() -> dict[str, Any]:
    """The `lightning_kwargs` given to `use_as_transformers_trainer` (a copy; empty when none or not swapped)."""
    return dict(_lightning_kwargs)


def is_using_hf_lightning() -> bool:
    """Whether `transformers.Trainer` is hf_lightning's now (`use_as_transformers_trainer` active)."""
    return _originals is not None
