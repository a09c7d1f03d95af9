"""Task lookup: our offline tasks by name, then mteb's own registry; and whether a task's data can be had."""

from __future__ import annotations

import difflib
import re
from typing import Any

from ..utils.errors import DataUnavailableError, UnknownNameError, UsageError


class UnknownTaskError(UnknownNameError):
    """A task name that is neither an offline task nor an mteb task; the message lists close names."""


def offline_tasks(images: bool = False) -> dict[str, type]:
    """Name → class of every offline text task (the offline suite), and with ``images`` the offline image tasks
    (:mod:`vllm_eval.tasks.images`), importing mteb and reading data files lazily."""
    from .offline import OFFLINE_TASKS

    out = {cls.metadata.name: cls for cls in OFFLINE_TASKS}
    if images:
        from .images import IMAGE_TASKS

        out.update({cls.metadata.name: cls for cls in IMAGE_TASKS})
    return out


def get_tasks(names: list[str] | None = None) -> list[Any]:
    """mteb task objects for ``names`` (default: the whole offline suite).

    Offline tasks (text and image) are matched case-insensitively; other names go to ``mteb.get_task`` (whose data
    comes from the hub; see :func:`check_available`).

    Raises:
        UnknownTaskError: naming the unknown task and up to five close names.
    """
    if not names:
        return [cls() for cls in offline_tasks().values()]
    offline = offline_tasks(images=True)
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


def get_benchmark_tasks(name: str) -> list[Any]:
    """The tasks of mteb's benchmark ``name`` (e.g. ``"MTEB(eng, v2)"``).

    Raises:
        UnknownNameError: no such benchmark (close names suggested).
    """
    import mteb

    try:
        return list(mteb.get_benchmark(name).tasks)
    except (KeyError, ValueError):
        known = [b.name for b in mteb.get_benchmarks()]
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.4)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise UnknownNameError(f"unknown benchmark {name!r}{hint}") from None


def split_names(values: list[str] | str | None, what: str = "--tasks") -> list[str] | None:
    """``--tasks A B,C`` -> [A, B, C]; a comma inside parentheses (``MTEB(eng, v2)``) does not split; one
    string is one value.

    Raises:
        UsageError: the list is empty, or names a task twice (``what`` names the option).
    """
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    names = [n.strip() for v in values for n in re.split(r",(?![^()]*\))", v) if n.strip()]
    if not names:
        raise UsageError(f"{what} names no task (give task names, or leave --tasks out for the offline suite)")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"{what} names {', '.join(dupes)} more than once")
    return names


def select_tasks(
    names: list[str] | None = None,
    *,
    benchmarks: list[str] | None = None,
    task_types: list[str] | None = None,
    languages: list[str] | None = None,
) -> list[Any]:
    """Tasks by name and by benchmark (in that order, each once), then filtered by type and language.

    With neither names nor benchmarks, the offline suite. ``task_types`` are mteb's (``STS``,
    ``Retrieval`` ...); ``languages`` are ISO 639-3 codes (``eng``) matched against a task's.

    Raises:
        UnknownTaskError, UnknownNameError: an unknown task, benchmark or task type.
        UsageError: the filters leave no task.
    """
    names, benchmarks = _benchmarks_among(names, list(benchmarks or ()))
    tasks = get_tasks(names) if names or not benchmarks else []
    for name in benchmarks or ():
        tasks.extend(get_benchmark_tasks(name))
    seen: set[str] = set()
    unique = [t for t in tasks if not (t.metadata.name in seen or seen.add(t.metadata.name))]
    if task_types:
        import mteb

        known = sorted({t.metadata.type for t in mteb.get_tasks()} | {t.metadata.type for t in unique})
        for kind in task_types:
            if kind not in known:
                close = difflib.get_close_matches(kind, known, n=3, cutoff=0.4)
                raise UnknownNameError(
                    f"unknown task type {kind!r}"
                    + (f" (did you mean {', '.join(close)}?)" if close else "")
                    + f"; types: {', '.join(known)}"
                )
        unique = [t for t in unique if t.metadata.type in task_types]
    if languages:
        wanted = set(languages)
        unique = [t for t in unique if wanted & set(t.metadata.languages)]
    if not unique:
        raise UsageError("no task is left after --task-types / --languages")
    return unique


def _benchmarks_among(names: list[str] | None, benchmarks: list[str]) -> tuple[list[str] | None, list[str]]:
    """Names of mteb benchmarks given as task names (``--tasks "MTEB(eng, v2)"``) run as those benchmarks."""
    if not names:
        return names, benchmarks
    import logging

    import mteb

    known = {b.name for b in mteb.get_benchmarks()}
    found = [n for n in names if n in known]
    for name in found:
        logging.getLogger(__name__).info("%r is a benchmark: running its tasks (as --benchmark %r)", name, name)
    rest = [n for n in names if n not in known]
    return (rest or None), benchmarks + [b for b in found if b not in benchmarks]


def unavailable(tasks: list[Any]) -> dict[str, str]:
    """Task name -> why its data cannot be had (the hub is offline and it is not cached); empty online."""
    from ..utils.hub import hub_offline, missing_dataset

    if not hub_offline():
        return {}
    offline = set(offline_tasks(images=True))
    out = {}
    for task in tasks:
        meta = task.metadata
        dataset = meta.dataset or {}
        path, revision = dataset.get("path"), dataset.get("revision")
        local = meta.name in offline or getattr(task, "local_data", False)  # gensim files, or --data
        why = (
            None
            if local or not path
            else missing_dataset(path, f"task {meta.name}", "run the offline suite (`vllm-eval tasks`)", revision)
        )
        if why:
            out[meta.name] = why
    return out


def check_available(tasks: list[Any]) -> None:
    """Fail now, by name, for a task whose data cannot be had: the hub is offline and it is not cached.

    Offline tasks always pass. With the hub reachable nothing is checked (mteb downloads as usual).

    Raises:
        DataUnavailableError: naming the task, its dataset and revision.
    """
    missing = unavailable(tasks)
    if missing:
        raise DataUnavailableError(next(iter(missing.values())))


#: Task types a reranker can be evaluated on.
RERANK_TYPES = ("Retrieval", "Reranking")


def rerank_tasks(names: list[str] | str | None, data: str | None = None, what: str = "`vllm-eval rerank`") -> list[Any]:
    """A reranker's tasks: ``data`` as an mteb task (a benchmark replica: its retrieval and reranking tasks, or
    those of them ``names`` picks), else by name (default LeeKnownItemRetrieval); retrieval or reranking only.

    Raises:
        UsageError: ``names`` with a data file that is not a replica, or a task of another type (``what`` names
            the command).
        UnknownNameError: a name the replica does not have.
    """
    from ..models.kinds import get_kind

    if data:
        from .owntasks import own_mteb_tasks
        from .shaped import is_replica

        tasks = own_mteb_tasks(data, names=split_names(names))
        if is_replica(data) and not names:
            tasks = [t for t in tasks if t.metadata.type in RERANK_TYPES]
    else:
        tasks = get_tasks(split_names(names or list(get_kind("reranker").default_tasks)))
    for task in tasks:
        if task.metadata.type not in RERANK_TYPES:
            raise UsageError(f"{what} needs retrieval tasks; {task.metadata.name} is {task.metadata.type}")
    return tasks
