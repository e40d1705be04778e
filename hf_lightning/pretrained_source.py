"""A `from_pretrained` name is checked before loading, so a typo costs one line, not the hub's retries.

`from_pretrained("./my_modle")` (a mistyped folder) answers with the hub's "Repo id must use alphanumeric chars";
`from_pretrained("bert-base-uncasd")` without network retries five times over about 30 s and 12 lines, then blames
the connection. `check_pretrained_source` answers both in one line, before anything is loaded:

- a value that is a local folder: fine;
- a value that can only be a path (starts with `.`, `/` or `~`, has more than one `/`, or is not a valid hub name):
  "no such local folder", with the closest existing folder next to it (difflib);
- a hub name: fine when its files are in the local hub cache; otherwise with `HF_HUB_OFFLINE` set it cannot be
  loaded, and without it one request (no retries) tells whether the hub is reachable and knows the name.
"""

from __future__ import annotations

import difflib
import os

from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import HFValidationError, validate_repo_id

__all__ = ["check_pretrained_source", "closest_folder", "looks_like_path", "missing_local_folder"]


def _is_hub_name(value: str) -> bool:
    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def looks_like_path(value: str) -> bool:
    """Whether `value` can only mean a local path (hub names are `name` or `org/name`)."""
    return (value.startswith((".", "/", "~")) or value.endswith(("/", os.sep)) or value.count("/") > 1
            or os.sep in value.replace("/", "") or not _is_hub_name(value))


def closest_folder(value: str) -> str | None:
    """The existing folder next to where `value` points whose name is closest to it (spelled like `value`)."""
    head, name = os.path.split(value.rstrip("/" + os.sep))
    parent = os.path.expanduser(head) or "."
    try:
        folders = [d for d in os.listdir(parent) if os.path.isdir(os.path.join(parent, d))]
    except OSError:
        return None
    match = difflib.get_close_matches(name, folders, n=1, cutoff=0.6)
    return os.path.join(head, match[0]) if match else None


def missing_local_folder(key: str, value: str) -> str:
    """The one-line error for a local path that does not exist."""
    closest = closest_folder(value)
    hint = f"; did you mean {closest!r}?" if closest else "."
    return f"{key}={value!r}: no such local folder{hint}"


def _offline() -> bool:
    return any(os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _in_hub_cache(name: str) -> bool:
    return os.path.isdir(os.path.join(constants.HF_HUB_CACHE, repo_folder_name(repo_id=name, repo_type="model")))


def _not_local(key: str, name: str) -> str:
    local = closest_folder(name)
    return f"{key}={name!r}: no local folder of that name" + (f" (did you mean {local!r}?)" if local else "")


def _hub_problem(name: str) -> str | None:
    """None when the hub knows `name` (or cannot say no); else what is wrong. One request, no retries."""
    try:
        get_hf_file_metadata(hf_hub_url(name, "config.json"), timeout=10)
    except RepositoryNotFoundError:
        return "the hub has no model of that name (a private or gated one needs `hf auth login`)."
    except HfHubHTTPError:
        return None  # the hub answered (e.g. no config.json in a tokenizer-only repo): let from_pretrained decide
    except Exception as err:  # no network: DNS failure, refused connection, timeout, proxy error
        return (f"it is not in the local hub cache and the hub is unreachable ({type(err).__name__}: {err}). A hub "
                "name needs network access, or a copy in the hub cache (HF_HUB_CACHE) and HF_HUB_OFFLINE=1.")
    return None


def check_pretrained_source(key: str, value: str | None) -> None:
    """Raise one clear error when `value` (a `from_pretrained` name given as option `key`) cannot be loaded.

    Raises:
        FileNotFoundError: a path that does not exist (naming the closest existing folder), or a hub name that is
            neither cached nor reachable (offline mode, no network, unknown name).
    """
    if value is None or os.path.isdir(os.path.expanduser(value)):
        return
    if looks_like_path(value):
        raise FileNotFoundError(missing_local_folder(key, value))
    if _in_hub_cache(value):
        return
    if _offline():
        raise FileNotFoundError(
            f"{_not_local(key, value)}, and it is not in the local hub cache; HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE "
            "is set, so it cannot be downloaded (a hub name needs network access)."
        )
    problem = _hub_problem(value)
    if problem:
        raise FileNotFoundError(f"{_not_local(key, value)}, and {problem}")
