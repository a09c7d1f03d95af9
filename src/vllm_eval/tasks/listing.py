"""What ``vllm-eval tasks`` lists, as JSON-ready rows: every packaged task and every hub task with a runner of ours,
by kind of model; or what a selection of names, benchmarks and filters would evaluate, with its availability offline.
"""

from __future__ import annotations

from typing import Any

#: mteb task types a reranker and a multi-vector model also run.
_RETRIEVAL = ("Retrieval", "Reranking")


def task_rows() -> list[dict[str, Any]]:
    """Every packaged task and every hub task with a runner of ours, as JSON-ready rows.

    ``kind`` is where the task comes from (``mteb``: the offline mteb suite; ``generative``,
    ``classification``, ``preference``: offline tasks with our own runners; ``hub``: loaded through
    ``datasets``, offline only when cached); ``kinds`` the kinds of model that run it and ``command``
    the commands.
    """
    from ..utils.hub import ensure_offline_if_unreachable
    from . import offline_tasks
    from .registry import task_rows as own_rows

    ensure_offline_if_unreachable()  # a hub task is available offline only from the local cache
    rows = []
    for name, cls in offline_tasks(images=True).items():
        retrieval = cls.metadata.type in _RETRIEVAL
        rows.append(
            {
                "name": name,
                "kind": "mteb",
                "kinds": ["encoder", "token_embedder", "reranker"] if retrieval else ["encoder"],
                "command": "run, rerank" if retrieval else "run",
                "type": cls.metadata.type,
                "main_score": cls.metadata.main_score,
                "source": "offline",
                "available": True,
                "description": cls.metadata.description,
            }
        )
    for row in own_rows():
        offline = row["source"] == "offline"
        family = {"generate": "generative", "classify": "classification", "reward": "preference"}
        rows.append(
            {
                **row,
                "kind": family.get(row["command"], row["command"]) if offline else "hub",
                "kinds": [row["kind"]],
            }
        )
    from .eva import task_rows as eva_rows

    rows += [{**row, "kind": "eva", "kinds": [row["kind"]]} for row in eva_rows()]
    return rows


def selected_task_rows(
    names: list[str] | str | None = None,
    *,
    benchmarks: list[str] | str | None = None,
    task_types: list[str] | None = None,
    languages: list[str] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """What a run would evaluate (:func:`vllm_eval.tasks.select_tasks`), as rows (name, type, main score,
    languages, dataset, whether it is available here), and how many are not available offline.

    Raises:
        UnknownNameError, UsageError: as :func:`~vllm_eval.tasks.select_tasks`.
    """
    from ..utils.hub import ensure_offline_if_unreachable

    ensure_offline_if_unreachable()
    from . import select_tasks, split_names, unavailable

    tasks = select_tasks(
        split_names(names),
        benchmarks=split_names(benchmarks, "--benchmark"),
        task_types=task_types,
        languages=languages,
    )
    missing = unavailable(tasks)
    rows = [
        {
            "name": t.metadata.name,
            "type": t.metadata.type,
            "main_score": t.metadata.main_score,
            "languages": list(t.metadata.languages),
            "dataset": (t.metadata.dataset or {}).get("path"),
            "available": t.metadata.name not in missing,
        }
        for t in tasks
    ]
    return rows, len(missing)
