"""The Hugging Face hub seen from here: offline mode, and failing fast when it cannot be reached.

``huggingface_hub`` and ``datasets`` retry a dead network for tens of seconds before they fail
(about 40 s for a model id, five retries for a dataset). When the hub's host does not even resolve,
:func:`ensure_offline_if_unreachable` switches both libraries to offline mode before they are
imported, so a missing file is reported at once and by name.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

_TRUE = {"1", "on", "true", "yes"}
#: Seconds to wait for a TCP connection to the hub when its name resolves.
PROBE_TIMEOUT_S = 3.0


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set (by the user, or by :func:`ensure_offline_if_unreachable`)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub (``HF_ENDPOINT``, default huggingface.co) opens within ``timeout`` s."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:  # no name resolution, refused, unreachable or timed out
        return False


def ensure_offline_if_unreachable() -> bool:
    """Set ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1`` when the hub cannot be reached.

    Call it before ``huggingface_hub``/``datasets`` are imported (they read the variables once).
    Does nothing when offline mode is already set. Returns True when the hub counts as offline.
    """
    if hub_offline():
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        return True
    if hub_reachable():
        return False
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return True


def missing_dataset(path: str, needed_by: str, instead: str, revision: str | None = None) -> str | None:
    """Why ``needed_by`` cannot have the hub dataset ``path`` here (the hub is offline and it is not in
    the local cache), naming ``instead``, what to do otherwise; None when it can."""
    if not hub_offline() or cached_dataset(path, revision):
        return None
    at = f" (revision {revision})" if revision else ""
    return (
        f"{needed_by} needs dataset {path}{at}, which is not in the local Hugging Face cache, and the hub is offline "
        f"(HF_HUB_OFFLINE or no network); download it where there is network, or {instead}"
    )


def require_dataset(path: str, needed_by: str, instead: str, revision: str | None = None) -> None:
    """Raises DataUnavailableError with :func:`missing_dataset`'s reason, if there is one."""
    why = missing_dataset(path, needed_by, instead, revision)
    if why:
        from .errors import DataUnavailableError

        raise DataUnavailableError(why)


def cached_dataset(path: str, revision: str | None = None) -> bool:
    """True when the hub dataset ``path`` (at ``revision``) is in the local Hugging Face cache."""
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(path, repo_type="dataset", revision=revision, local_files_only=True)
        return True
    except Exception:  # not cached (LocalEntryNotFoundError), or a bad id: either way not usable offline
        return False
