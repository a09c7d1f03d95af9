"""Task lookup: our offline tasks by name, then mteb's own registry."""

from __future__ import annotations

import difflib
from typing import Any

OFFLINE_TASK_NAMES = (
    "LeeDocSimilarity",
    "SimLex999",
    "WordSim353",
    "PangLeePolarity",
    "TwentyNewsgroupsMini",
    "LeeKnownItemRetrieval",
)


class UnknownTaskError(KeyError):
    """A task name that is neither an offline task nor an mteb task; the message lists close names."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def offline_tasks() -> dict[str, type]:
    """Name → class of every offline task (importing mteb and reading gensim files lazily)."""
    from .offline import OFFLINE_TASKS

    return {cls.metadata.name: cls for cls in OFFLINE_TASKS}


def get_tasks(names: list[str] | None = None) -> list[Any]:
    """mteb task objects for ``names`` (default: the whole offline suite).

    Offline tasks are matched case-insensitively; other names go to ``mteb.get_task`` (which may
    need the network to load data later).

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
                f"unknown task {name!r}" + (f"; close names: {', '.join(hint)}" if hint else "")
                + "; `vllm-eval tasks` lists the offline suite"
            ) from None
    return out
