"""lm-eval's task index kept in the cache folder (vllm_eval.tasks.lmeval_index) against lm-eval's own TaskManager."""

from __future__ import annotations

import json


def _entries(manager) -> dict:
    return {name: (e.kind, e.yaml_path, e.tags, e.cfg) for name, e in manager._index.items()}


def test_the_stored_index_gives_lm_evals_own_task_manager(lm_include):
    from lm_eval.tasks import TaskManager

    from vllm_eval.models.cache import default_cache_dir
    from vllm_eval.tasks.lmeval_index import build_manager, wheel_index

    ours = build_manager(TaskManager, [lm_include])
    theirs = TaskManager(include_path=lm_include)  # lm-eval parsing all of its YAMLs and the include path's
    for names in ("all_tasks", "all_subtasks", "all_groups", "all_tags"):
        assert getattr(ours, names) == getattr(theirs, names), names
    assert _entries(ours) == _entries(theirs)
    # the include path's tasks replace the wheel's of the same name, as in lm-eval's merge
    assert str(ours._index["hellaswag"].yaml_path).startswith(lm_include)
    assert len(ours.all_tasks) > 14_000 and ours.load(["hellaswag"])["tasks"]

    # stored once, then read back; a damaged file is built again, never raised
    (stored,) = (default_cache_dir() / "lm-eval-index").glob("*.json")
    assert {row[0] for row in json.loads(stored.read_text())} == wheel_index().keys()
    from lm_eval.tasks._index import TaskIndex

    from vllm_eval.tasks.lmeval_index import _wheel_folder

    assert wheel_index() == TaskIndex.build([_wheel_folder()])  # read back: every Entry's fields equal lm-eval's
    stored.write_bytes(b"[not json")
    again = wheel_index()
    assert again.keys() == wheel_index().keys() and len(again) > 14_000
    assert {row[0] for row in json.loads(stored.read_text())} == again.keys()


def test_a_cache_folder_that_cannot_be_written_still_gives_the_index(tmp_path):
    from vllm_eval.tasks.lmeval_index import wheel_index

    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    index = wheel_index(cache_dir=blocked)
    assert len(index) > 14_000 and "hellaswag" in index
