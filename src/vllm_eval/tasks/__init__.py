"""Task lookup: our offline tasks by name, then mteb's own registry; and whether a task's data can be had."""

from __future__ import annotations

import difflib
from typing import Any

from ..errors import DataUnavailableError, UnknownNameError


class UnknownTaskError(UnknownNameError):
    """A task name that is neither an offline task nor an mteb task; the message lists close names."""


def offline_tasks() -> dict[str, type]:
    """Name → class of every offline task (importing mteb and reading gensim files lazily)."""
    from .offline import OFFLINE_TASKS

    return {cls.metadata.name: cls for cls in OFFLINE_TASKS}


def get_tasks(names: list[str] | None = None) -> list[Any]:
    """mteb task objects for ``names`` (default: the whole offline suite).

    Offline tasks are matched case-insensitively; other names go to ``mteb.get_task`` (whose data
    comes from the hub; see :func:`check_available`).

    Raises:
        UnknownTaskError: naming the unknown task and up to five close names.
    """
    offline = offline_tasks()
    if not names:
        return [cls() for cls in offline.values()]
    by_lower = {n.lower(): cls for n, cls in offline.items()}
    out = []
    for name in names:
        if name.lower() in by_lower:
            out.append(by_lower[name.lower()]())
            continue
        import mteb

        try:
            out.append(mteb.get_task(name))
        except KeyError:
            known = list(offline) + [t.metadata.name for t in mteb.get_tasks()]
            close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
            lowered = [k for k in known if name.lower() in k.lower() and k not in close][: 5 - len(close)]
            hint = close + lowered
            raise UnknownTaskError(
                f"unknown task {name!r}"
                + (f"; close names: {', '.join(hint)}" if hint else "")
                + "; `vllm-eval tasks` lists the offline suite"
            ) from None
    return out


def check_available(tasks: list[Any]) -> None:
    """Fail now, by name, for a task whose data cannot be had: the hub is offline and it is not cached.

    Offline tasks always pass. With the hub reachable nothing is checked (mteb downloads as usual).

    Raises:
        DataUnavailableError: naming the task, its dataset and revision.
    """
    from ..hub import cached_dataset, hub_offline

    if not hub_offline():
        return
    offline = set(offline_tasks())
    for task in tasks:
        meta = task.metadata
        if meta.name in offline:
            continue
        dataset = meta.dataset or {}
        path, revision = dataset.get("path"), dataset.get("revision")
        if path and not cached_dataset(path, revision):
            raise DataUnavailableError(
                f"task {meta.name} needs dataset {path} (revision {revision}), which is not in the local Hugging "
                "Face cache, and the hub is offline (HF_HUB_OFFLINE or no network); download it where there is "
                "network, or run the offline suite (`vllm-eval tasks`)"
            )
