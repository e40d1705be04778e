"""The reward functions a `task: grpo` config may name by a short name (`reward_funcs: [prompt_words]`), and the
rule that decides what a `reward_funcs` entry may be.

A reward function is code the run calls on every generated batch, so a config names one the way it names any code:
a built-in name from `BUILT_IN` (nothing is imported), or a dotted path `package.module.function` whose package the
config's `allow_code_from` lists (`cli/config_code.py`: the standard library never). A reward model (a folder or a
hub name, which TRL would load with `from_pretrained`) is not a CLI reward: one error line says to run it from
Python. Each function has TRL's reward signature: `(prompts, completions, **columns) -> list[float]`, one reward per
completion; TRL passes the dataset's other columns and its own keywords (`completion_ids`, `trainer_state`...) as
`**kwargs`, which these ignore. Text only: a conversational row's completion (a list of messages) is read as its
last message's content. Pure Python (standard library).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["BUILT_IN", "RewardFunction", "distinct_words", "prompt_words", "reward_entry_problem"]


class RewardFunction(Protocol):
    """TRL's reward-function signature: one float per completion."""

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]: ...


def _text(value: Any) -> str:
    """A prompt or completion as text: a string as it is; a conversation (a list of `{role, content}` messages) as
    its last message's content."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return str(value)


def prompt_words(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """The share of the completion's words (split on white space) that occur in its prompt, in [0, 1] (0 for an
    empty completion): rewards answering with the prompt's own words, e.g. the toy reversal task of
    configs/grpo.yaml, where the reversed prompt scores 1."""
    rewards = []
    for prompt, completion in zip(prompts, completions):
        allowed = set(_text(prompt).split())
        words = _text(completion).split()
        rewards.append(sum(word in allowed for word in words) / len(words) if words else 0.0)
    return rewards


def distinct_words(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """The share of the completion's words that are distinct, in [0, 1] (0 for an empty completion): penalises
    repetition (a completion that repeats one word scores 1 / its length)."""
    rewards = []
    for completion in completions:
        words = _text(completion).split()
        rewards.append(len(set(words)) / len(words) if words else 0.0)
    return rewards


BUILT_IN: dict[str, Callable[..., list[float]]] = {"prompt_words": prompt_words, "distinct_words": distinct_words}
"""The reward functions a config names without a dotted path (and without `allow_code_from`)."""


def reward_entry_problem(key: str, entry: Any) -> str | None:
    """Why a `reward_funcs` entry is not a reward the CLI can name (one line), or None: a built-in name or a dotted
    path (which the caller then checks against `allow_code_from`). Nothing is imported.

    Args:
        key: the config key, for the message (`reward_funcs[0]`).
        entry: the entry as the config gives it.
    """
    names = ", ".join(sorted(BUILT_IN))
    if not isinstance(entry, str) or not entry.strip():
        return f"{key}={entry!r}: a reward function's name ({names}) or dotted path (my_package.rewards.my_reward)."
    if entry in BUILT_IN:
        return None
    if "/" in entry or "\\" in entry or entry.startswith((".", "~")):
        return (f"{key}={entry!r} looks like a reward model (a folder or a hub name); the CLI runs reward functions "
                f"only ({names}, or a dotted path under allow_code_from). Run a reward model from Python: "
                "GRPOTrainer(reward_funcs=<model>) after hf_lightning.use_as_transformers_trainer().")
    parts = entry.split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        return (f"{key}={entry!r} is not a built-in reward function ({names}) nor a dotted path such as "
                "my_package.rewards.my_reward.")
    return None
