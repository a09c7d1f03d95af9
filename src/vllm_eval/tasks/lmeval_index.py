"""lm-eval's index of the task YAMLs its wheel ships, parsed once per installation instead of once per command.

``lm_eval.tasks.TaskManager()`` parses every one of the ~14,000 YAMLs lm-eval 0.4.13 ships to learn its task, group
and tag names: 8.5 s of every ``generate`` or ``tasks`` command on a 2-core machine, before a name can be checked.
Those files do not change between commands, so the ``{name: Entry}`` dict lm-eval builds of them
(``lm_eval.tasks._index.TaskIndex.build``) is kept in this project's cache folder
(:func:`~vllm_eval.models.cache.default_cache_dir`) as JSON, keyed on lm-eval's version, the folder, and its YAMLs'
count and latest modification time; reading it back takes under a second. An include path's YAMLs are still parsed by
lm-eval on every call and override the wheel's entries, as lm-eval's own merge of several paths does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections import defaultdict
from itertools import chain
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["build_manager", "wheel_index"]


def _wheel_folder() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def _key(folder: Path) -> str:
    """lm-eval's version, the folder, its YAMLs' count and latest modification time (a stat per file, 0.1 s)."""
    import lm_eval

    count, latest = 0, 0
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith((".yaml", ".yml")):
                count, latest = count + 1, max(latest, os.stat(os.path.join(root, name)).st_mtime_ns)
    text = f"{getattr(lm_eval, '__version__', '?')}|{folder}|{count}|{latest}|{sys.version_info[:2]}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def wheel_index(cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """lm-eval's ``{name: lm_eval.tasks._index.Entry}`` index of its own task folder, as ``TaskIndex.build`` makes
    it, read from ``<cache_dir>/lm-eval-index/<key>.json`` when one for this installation is there, else built
    and stored there (a cache folder that cannot be written only costs the next command the build).

    ``cache_dir``: default :func:`~vllm_eval.models.cache.default_cache_dir`. Never raises for an unreadable or
    damaged file: it is built again.
    """
    from lm_eval.tasks._index import TaskIndex

    from ..models.cache import default_cache_dir

    folder = _wheel_folder()
    path = Path(cache_dir or default_cache_dir()) / "lm-eval-index" / f"{_key(folder)}.json"
    try:
        index = _from_json(path.read_text(encoding="utf-8"))
        if index:
            return index
    except FileNotFoundError:
        pass
    except Exception as exc:  # damaged or from another lm-eval: built again below
        logger.debug("lm-eval's task index at %s is built again (%s)", path, exc)
    index = TaskIndex.build([folder])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_to_json(index), encoding="utf-8")
        os.replace(tmp, path)  # whole or not at all: a command reading it meanwhile sees the old one or none
    except OSError as exc:
        logger.debug("lm-eval's task index not stored at %s (%s)", path, exc)
    return index


def _to_json(index: dict[str, Any]) -> str:
    """The index as JSON: an ``Entry``'s fields, its ``Kind`` by name, its path as text, its tags sorted. The YAMLs'
    parsed configs are plain JSON types (lm-eval leaves ``!function`` tags unresolved, as text)."""
    rows = [
        [e.name, e.kind.name, None if e.yaml_path is None else str(e.yaml_path), e.cfg, sorted(e.tags)]
        for e in index.values()
    ]
    return json.dumps(rows)


def _from_json(text: str) -> dict[str, Any]:
    """:func:`_to_json`'s text back as ``{name: Entry}``.

    Raises ``ValueError``, ``KeyError`` or ``TypeError`` for damaged text."""
    from lm_eval.tasks._index import Entry, Kind

    index = {}
    for name, kind, yaml_path, cfg, tags in json.loads(text):
        index[name] = Entry(name, Kind[kind], None if yaml_path is None else Path(yaml_path), cfg, set(tags))
    return index


def build_manager(cls: type, paths: list[str]) -> Any:
    """An instance of ``cls`` (lm-eval's ``TaskManager`` or a subclass) over lm-eval's own tasks and the folders
    ``paths``, equal to ``cls(include_path=paths or None)``: the include paths parsed by lm-eval itself
    (``include_defaults=False``), the wheel's index from :func:`wheel_index` under them, and the name lists that
    ``TaskManager.__init__`` derives (lm-eval 0.4.13's attributes ``_index``, ``_all_tasks``, ``_all_subtasks``,
    ``_all_groups``, ``_all_tags``; tests/test_lm_eval_index.py compares the two)."""
    from lm_eval.tasks._index import Kind

    manager = cls(include_path=paths or None, include_defaults=False)
    index = dict(wheel_index())
    index.update(manager._index)  # TaskIndex.build: a later path's entry replaces an earlier one of its name
    buckets: dict[Any, list[str]] = defaultdict(list)
    for name, entry in index.items():
        buckets[entry.kind].append(name)
    manager._index = index
    manager._all_tasks = sorted(index)
    manager._all_subtasks = sorted(chain.from_iterable(buckets[k] for k in (Kind.TASK, Kind.PY_TASK)))
    manager._all_groups = sorted(buckets[Kind.GROUP])
    manager._all_tags = sorted(buckets[Kind.TAG])
    return manager
