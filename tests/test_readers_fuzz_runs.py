"""Property tests of the readers of the project's own files: a run's ``summary.json``, ``compare.json`` and a
suite's ``suite.json`` (``report``, ``compare --runs``), a benchmark replica's manifest and data, the output cache
(SQLite), a finished task's mteb result read back to resume, and a ``--chat-template`` file. Each is written valid,
then damaged as a half-written or hand-edited file is; the reader returns a well-formed result or raises one of the
package's errors on one line naming the file. No engine starts. Then plain examples of the bugs these found.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from _fuzz import FUZZ, made_up_words, mutated, mutated_json, mutated_rows, outcome, scratch
from vllm_eval.evaluation.results import TaskScore
from vllm_eval.measure import report
from vllm_eval.measure.compare import Config, ConfigResult, compare_results, read_run_dir
from vllm_eval.utils.errors import UsageError

SUMMARY = {
    "model": "sentence-transformers/all-MiniLM-L6-v2",
    "revision": "c9745ed1d9f207416be6d2e6f8de32d1f16199bf",
    "backend": "vllm",
    "preset": None,
    "command": ["vllm-eval", "run", "--tasks", "WordSim353"],
    "cache_dir": "/cache",
    "engine_options_in_force": {"dtype": "torch.float32", "max_model_len": 256},
    "engine_start_seconds": 3.25,
    "device": "cpu",
    "versions": {"vllm": "0.32.0", "mteb": "2.26.0"},
    "started_at": "2025-01-01T00:00:00+00:00",
    "total_seconds": 9.5,
    "scores": [
        asdict(TaskScore("WordSim353", "STS", "cosine_spearman", 0.72, 1.5, encode_seconds=0.5, tokens_per_s=900.0)),
        asdict(TaskScore("LeeKnownItemRetrieval", "Retrieval", "ndcg_at_10", 0.87, 2.0, stage="stage1")),
        asdict(TaskScore("STS12", "STS", "cosine_spearman", math.nan, 0.0, status="failed: data unavailable")),
    ],
    "timeline": {
        "origin": 1735689600.0,
        "phases": [
            {"phase": "engine", "start": 0.5, "end": 3.75, "detail": "replica 0"},
            {"phase": "encode", "start": 4.0, "end": 5.0, "task": "WordSim353"},
            {"phase": "scoring", "start": 5.0, "end": 5.5, "task": "WordSim353"},
        ],
    },
}


def _compare_json() -> dict[str, Any]:
    import numpy as np

    ref = ConfigResult(Config("st", "float32"), {"WordSim353": 0.7289, "Lee": 0.8754}, outputs=np.eye(3))
    other = ConfigResult(Config("vllm", "bfloat16"), {"WordSim353": 0.7301, "Lee": math.nan}, outputs=np.eye(3))
    return json.loads(json.dumps(compare_results([ref, other], ref, 1e-4, 1e-3).to_json()))


@pytest.fixture(autouse=True, scope="module")
def _no_png():
    """The plots are drawn (matplotlib meets every value) but not encoded: PNG encoding is most of a render's time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    saved = report._png

    def drawn(fig: Any) -> str:
        fig.canvas.draw()
        plt.close(fig)
        return "data:image/png;base64,"

    report._png = drawn
    yield
    report._png = saved


@settings(FUZZ, max_examples=40)
@given(mutated_json(SUMMARY), mutated_json(_compare_json()), st.booleans())
def test_run_directories_render_or_name_the_file(summary, compare, with_compare):
    with scratch() as folder:
        (folder / "summary.json").write_bytes(summary)
        if with_compare:
            (folder / "compare.json").write_bytes(compare)
        run = outcome(lambda: report.load_run(folder), "summary.json", "compare.json")
        if run is not None:
            page = report.render([run])
            page.encode("utf-8")
        result = outcome(lambda: read_run_dir(folder), "summary.json")
        if result is not None:
            assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in result.scores.values())
            assert isinstance(result.config.label, str)


@settings(FUZZ, max_examples=40)
@given(mutated_json({"suite": "offline", "records": [{"backend": "vllm", "seconds": 1.0}, {"backend": "st"}]}))
def test_suite_folders_list_their_runs_or_name_the_file(suite):
    with scratch() as folder:
        (folder / "suite.json").write_bytes(suite)
        for backend in ("vllm", "st"):
            (folder / backend).mkdir()
            (folder / backend / "summary.json").write_text(json.dumps(SUMMARY))
        runs = outcome(lambda: report._with_suite_runs([folder]), "suite.json")
        if runs is not None:
            assert all(Path(r).parent == folder for r in runs)


SWEEP = {
    "models": [
        {"label": "checkpoint-100", "model": "/ckpt/checkpoint-100", "step": 100, "seconds": 35.7, "reloaded": False},
        {"label": "checkpoint-200", "model": "/ckpt/checkpoint-200", "step": 200, "seconds": 19.6, "reloaded": True},
    ],
    "pending": [],
    "tasks": {"WordSim353": "spearman", "TwentyNewsgroupsMini": "v_measure"},
    "scores": {
        "checkpoint-100": {"WordSim353": 0.7266, "TwentyNewsgroupsMini": 0.789},
        "checkpoint-200": {"WordSim353": 0.6788, "TwentyNewsgroupsMini": 0.7645},
    },
    "significance": {
        "checkpoint-200": {
            "WordSim353": {"delta": -0.0478, "low": -0.08, "high": -0.01, "p_value": 0.006, "significant": True},
            "TwentyNewsgroupsMini": {"note": "no per-unit scores for its main score (v_measure)"},
        }
    },
}


@settings(FUZZ, max_examples=40)
@given(mutated_json(SWEEP))
def test_sweep_folders_render_or_name_the_file(sweep):
    with scratch() as folder:
        (folder / "sweep.json").write_bytes(sweep)
        run = outcome(lambda: report.load_run(folder), "sweep.json")
        if run is not None:
            report.render([run]).encode("utf-8")


TASK_RESULT = {"task": "PangLeePolarity", "metrics": {"accuracy": 0.5, "n_samples": 2}, "backend": "VllmClassifier"}
SAMPLES = b'{"id": 0, "correct": true}\n{"id": 1, "correct": false}\n'


@settings(FUZZ, max_examples=40)
@given(mutated_json(TASK_RESULT), mutated(SAMPLES))
def test_a_commands_folder_compares_or_names_the_file(result, samples):
    """``compare --runs`` of another command's folder: each task's results.json and samples.jsonl read, or the file
    named (a damaged samples.jsonl only loses its units)."""
    from vllm_eval.measure.significance import compare_runs

    with scratch() as folder:
        (folder / "results.json").write_bytes(result)
        (folder / "samples.jsonl").write_bytes(samples)
        run = outcome(lambda: read_run_dir(folder), "results.json")
        table = outcome(lambda: compare_runs(folder, folder), "results.json")
        if run is not None and table is not None:
            assert set(table) <= set(run.scores)


# Plain examples: each failed (a traceback, or a silent acceptance) before the readers checked it.


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda s: s[: len(s) // 2], r"summary\.json:\d+: not valid JSON"),
        (lambda s: s.replace('"task": "WordSim353"', '"task": 7'), r"summary\.json: field 'scores'\[0\]: field 'task'"),
        (lambda s: s.replace("0.72", "NaN"), r"field 'scores'\[0\]: field 'main_score' is nan, not a finite"),
        (lambda s: s.replace('"vllm-eval"', "1"), r"summary\.json: field 'command'\[0\] must be str, got int"),
        (lambda s: s.replace('"start": 4.0', '"start": "4"'), r"field 'timeline'.phases\[1\]: field 'start'"),
        (lambda s: "", r"summary\.json: an empty file, not JSON"),
        # finite, but the plots' arithmetic overflowed (ValueError and OverflowError inside matplotlib)
        (lambda s: s.replace('"end": 5.0', '"end": 1.7e308'), r"phases\[1\]: field 'end' is 1\.7e\+308, outside"),
        (lambda s: s.replace('"seconds": 1.5', '"seconds": 1.7e308'), r"field 'seconds' is 1\.7e\+308, outside"),
        (lambda s: s.replace('"end": 5.0', '"end": 3.5'), r"phases\[1\]: ends \(3\.5\) before it starts \(4\.0\)"),
    ],
)
def test_damaged_summaries_are_named(tmp_path, damage, message):
    (tmp_path / "summary.json").write_text(damage(json.dumps(SUMMARY)))
    with pytest.raises(UsageError, match=message):
        report.load_run(tmp_path)
    with pytest.raises(UsageError, match=message):
        read_run_dir(tmp_path)


def test_damaged_comparisons_and_suites_are_named(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    text = json.dumps(_compare_json())
    (tmp_path / "compare.json").write_text(text.replace('"passed": true', '"passed": "no"', 1))
    with pytest.raises(UsageError, match=r"compare\.json: field 'rows'\[\d\]: field 'passed' must be bool"):
        report.load_run(tmp_path)
    (tmp_path / "compare.json").write_text(text.replace('"min_cosine"', '"min"'))
    with pytest.raises(UsageError, match=r"compare\.json: field 'agreement'.'st float32': no field 'max_abs_diff'"):
        report.load_run(tmp_path)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "suite.json").write_text(json.dumps({"records": [{"backend": "../elsewhere"}]}))
    with pytest.raises(UsageError, match=r"suite\.json: field 'records'\[0\]: field 'backend' '\.\./elsewhere' is not"):
        report.write_report([suite], tmp_path / "r.html")


REPLICA_TASKS = ("STSBenchmark", "SprintDuplicateQuestions", "ArguAna", "AskUbuntuDupQuestions", "ImdbClassification")


@pytest.fixture(scope="module")
def replica_source(tmp_path_factory):
    """A small replica of five MTEB(eng, v2) tasks (one with candidates per query), written by the replica's own
    code with made-up words."""
    import numpy as np

    from vllm_eval.tasks import shaped

    words = made_up_words()
    tasks = {t.metadata.name: t for t in shaped._benchmark_tasks("MTEB(eng, v2)")}
    out = tmp_path_factory.mktemp("replica")
    for i, name in enumerate(REPLICA_TASKS):
        task, rng = tasks[name], np.random.default_rng(i)
        stats = json.loads(shaped.stats_path(task).read_text())
        (out / name).mkdir()
        for subset in task.hf_subsets:
            for split, train in shaped._splits(task):
                split_stats = shaped._split_stats(stats, split, subset)
                shaped.write_split(out / name, rng, words, task, split_stats, 0.0005, train, f"{subset}.{split}")
    manifest = {"benchmark": "MTEB(eng, v2)", "fraction": 0.0005, "seed": 0, "tokenizer": "words", "left_out": {}}
    (out / "replica.json").write_text(json.dumps({**manifest, "tasks": list(REPLICA_TASKS)}))
    return out


def _check_replica_split(split: Any) -> None:
    if not hasattr(split, "column_names"):  # retrieval: every link names a document and a query of the split
        docs, queries = set(split["corpus"]["id"]), set(split["queries"]["id"])
        assert docs and queries
        assert len(docs) == len(split["corpus"]) and len(queries) == len(split["queries"])
        for text in [*split["corpus"]["text"], *split["queries"]["text"]]:
            text.encode("utf-8")
        for qid, judged in split["relevant_docs"].items():
            assert qid in queries and set(judged) <= docs
            assert all(type(score) is int for score in judged.values())
        for qid, candidates in (split["top_ranked"] or {}).items():
            assert qid in queries and set(candidates) <= docs
        return
    assert len(split) > 0
    for column in split.column_names:
        for value in split[column]:
            assert not isinstance(value, float) or math.isfinite(value)
            if isinstance(value, str):
                value.encode("utf-8")


@st.composite
def damaged_replica_file(draw: Any, path: Path) -> bytes:
    """The bytes of ``path`` (a file of a replica) damaged as its kind can be: JSON lines rows with a field dropped,
    of another type, NaN or a lone surrogate, then maybe bytes mutated; an array's value out of the corpus, of
    another shape or type, or its bytes mutated; JSON as :func:`mutated_json` damages it."""
    import io

    import numpy as np

    data = path.read_bytes()
    if path.suffix == ".jsonl":
        if draw(st.booleans()):
            rows = draw(mutated_rows([json.loads(line) for line in data.splitlines()]))
            data = "".join(json.dumps(row) + "\n" for row in rows).encode()
        return draw(mutated(data)) if draw(st.booleans()) else data
    if path.suffix != ".npy":
        return draw(mutated_json(json.loads(data)))
    array = np.load(path)
    op = draw(st.sampled_from(["value", "shape", "float", "bytes"]))
    if op == "value" and array.size:
        array.reshape(-1)[draw(st.integers(0, array.size - 1))] = draw(st.sampled_from([-1, 2**31 - 1, 50, 10]))
    elif op == "shape":
        array = array.reshape(-1)[: draw(st.integers(0, max(array.size - 1, 0)))]
    elif op == "float":
        array = array.astype(float)
    buffer = io.BytesIO()
    np.save(buffer, array)
    return draw(mutated(buffer.getvalue())) if op == "bytes" else buffer.getvalue()


@settings(FUZZ, max_examples=40)
@given(st.data())
def test_replicas_load_or_name_the_file(replica_source, data):
    import shutil

    from vllm_eval.tasks.shaped import replica_tasks

    files = sorted(str(p.relative_to(replica_source)) for p in replica_source.rglob("*") if p.is_file())
    with scratch() as folder:
        replica = folder / "replica"
        shutil.copytree(replica_source, replica)
        damaged = replica / data.draw(st.sampled_from(files))
        damaged.write_bytes(data.draw(damaged_replica_file(replica_source / damaged.relative_to(replica))))
        tasks = outcome(lambda: replica_tasks(replica), damaged.name)
        for task in tasks or []:
            if outcome(task.load_data, damaged.name) is None and task.data_loaded:
                for splits in task.dataset.values():
                    for split in splits.values():
                        _check_replica_split(split)


def test_damaged_replicas_are_named(replica_source, tmp_path):
    import shutil

    from vllm_eval.tasks.shaped import replica_tasks

    replica = tmp_path / "replica"
    shutil.copytree(replica_source, replica)
    manifest = json.loads((replica / "replica.json").read_text())
    (replica / "replica.json").write_text(json.dumps({**manifest, "tasks": ["STSBenchmark", "STSBenchmrk"]}))
    with pytest.raises(UsageError, match=r"replica\.json: field 'tasks' names 'STSBenchmrk', not a task of MTEB"):
        replica_tasks(replica)  # it was dropped without a word: a run of fewer tasks than the replica names
    (replica / "replica.json").write_text(json.dumps({k: v for k, v in manifest.items() if k != "tasks"}))
    with pytest.raises(UsageError, match=r"replica\.json: no field 'tasks'"):
        replica_tasks(replica)
    (replica / "replica.json").write_text(json.dumps(manifest))
    split = replica / "STSBenchmark" / "default.test.jsonl"
    whole = split.read_text()
    lines = whole.splitlines()
    split.write_text(whole[: len(lines[0]) + len(lines[1]) + 10])  # cut in line 3: named before any task loads
    with pytest.raises(UsageError, match=r"default\.test\.jsonl:3: not valid JSON"):
        replica_tasks(replica)
    split.write_text(whole + "\n")
    with pytest.raises(UsageError, match=rf"default\.test\.jsonl:{len(lines) + 1}: a blank line, not JSON"):
        replica_tasks(replica)
    split.write_text(whole[:-1])  # no newline after the last line: a whole line all the same
    replica_tasks(replica)
    corpus = replica / "ArguAna" / "default.test" / "corpus.jsonl"
    kept = corpus.read_bytes()
    corpus.write_bytes(kept[:-7])
    with pytest.raises(UsageError, match=r"ArguAna/default\.test/corpus\.jsonl:\d+: not valid JSON"):
        replica_tasks(replica)
    corpus.write_bytes(kept)
    split.unlink()
    with pytest.raises(UsageError, match=r"STSBenchmark/default\.test\.jsonl: no such file \(a replica split of"):
        replica_tasks(replica)


def _replica_load_error(source: Path, tmp: Path, name: str, file: str, damage: Any) -> str:
    """The message of loading task ``name`` of a copy of ``source`` whose ``file`` went through ``damage``."""
    import shutil

    from vllm_eval.tasks.shaped import replica_tasks

    replica = tmp / "replica"
    shutil.rmtree(replica, ignore_errors=True)
    shutil.copytree(source, replica)
    damage(replica / name / file)
    [task] = [t for t in replica_tasks(replica) if t.metadata.name == name]
    with pytest.raises(UsageError) as caught:
        task.load_data()
    assert len(str(caught.value).splitlines()) == 1
    return str(caught.value)


def _edit_line(path: Path, line: int, edit: Any) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = edit(lines[line - 1])
    path.write_text("".join(x + "\n" for x in lines))


def _set_array(path: Path, change: Any) -> None:
    import numpy as np

    array = np.load(path)
    np.save(path, change(array))


def test_damaged_replica_lines_and_arrays_are_named(replica_source, tmp_path):
    """Each kind of damage to a replica's split: the file, and the line or array and the field, named."""
    import numpy as np

    def error(name: str, file: str, damage: Any) -> str:
        return _replica_load_error(replica_source, tmp_path, name, file, damage)

    row = lambda change: lambda p: _edit_line(p, 3, lambda s: json.dumps(change(json.loads(s))))  # noqa: E731
    message = error("STSBenchmark", "default.test.jsonl", row(lambda r: {**r, "score": "high"}))
    assert re.search(r"default\.test\.jsonl:3: field 'score' must be number, got str 'high'$", message)
    message = error("STSBenchmark", "default.test.jsonl", row(lambda r: {**r, "score": math.nan}))
    assert re.search(r"default\.test\.jsonl:3: field 'score' is nan, not a finite number", message)
    message = error(
        "ImdbClassification", "default.test.jsonl", row(lambda r: {k: v for k, v in r.items() if k != "text"})
    )
    assert re.search(r"default\.test\.jsonl:3: no field 'text'", message)
    message = error("ImdbClassification", "default.test.jsonl", row(lambda r: {**r, "label": "neg"}))
    assert re.search(r"default\.test\.jsonl: field 'label' mixes names and numbers", message)
    message = error("ArguAna", "default.test/corpus.jsonl", row(lambda r: {**r, "text": "a\ud800"}))
    assert re.search(r"corpus\.jsonl:3: field 'text' holds a lone surrogate escape", message)
    message = error("ArguAna", "default.test/corpus.jsonl", row(lambda r: {**r, "id": "d0"}))
    assert re.search(r"corpus\.jsonl:3: field 'id' 'd0' repeats line 1", message)
    message = error("ArguAna", "default.test/corpus.jsonl", lambda p: _edit_line(p, 2, lambda s: s + " " + s))
    assert re.search(r"corpus\.jsonl:2: not valid JSON: extra data", message)
    message = error("ArguAna", "default.test/corpus.jsonl", lambda p: _edit_line(p, 2, lambda s: ""))
    assert re.search(r"corpus\.jsonl:2: a blank line, not JSON", message)
    message = error("ArguAna", "default.test/queries.jsonl", lambda p: _edit_line(p, 2, lambda s: "[1, 2]"))
    assert re.search(r"queries\.jsonl:2: a row must be a JSON object, got list", message)
    cut = lambda p: p.write_text("".join(x + "\n" for x in p.read_text().splitlines()[:-1]))  # noqa: E731
    message = error("ArguAna", "default.test/corpus.jsonl", cut)
    assert re.search(r"corpus\.jsonl: 49 lines, not the 50 of field 'corpus' of .*split\.json$", message)
    message = error("ArguAna", "default.test/qrels.npy", lambda p: _set_array(p, lambda a: a + [0, 60, 0]))
    assert re.search(r"qrels\.npy: row \d+ links row \d+ of corpus\.jsonl, which has 50 rows$", message)
    message = error("ArguAna", "default.test/qrels.npy", lambda p: _set_array(p, lambda a: a.astype(float)))
    assert re.search(r"qrels\.npy: an array of float64, not of integers$", message)
    message = error("ArguAna", "default.test/qrels.npy", lambda p: p.write_bytes(b"\x93NUMPY garbage"))
    assert re.search(r"qrels\.npy: not a NumPy array file \(", message)
    message = error("AskUbuntuDupQuestions", "default.test/top_ranked.npy", lambda p: _set_array(p, lambda a: a[:-1]))
    assert re.search(
        r"top_ranked\.npy: an array of shape \(\d+,\), not \(\d+,\) \(the count in .*split\.json\)", message
    )
    message = error("AskUbuntuDupQuestions", "default.test/top_ranked.npy", lambda p: _set_array(p, lambda a: -a))
    assert re.search(r"top_ranked\.npy: value -\d+ at position \d+ is not in \[0, 50\)$", message)
    change = lambda a: np.concatenate([a[:1] + 1, a[1:]])  # noqa: E731
    message = error("AskUbuntuDupQuestions", "default.test/top_ranked_counts.npy", lambda p: _set_array(p, change))
    assert re.search(r"top_ranked_counts\.npy: counts sum to \d+, not \d+ \(.*split\.json\)$", message)
    split = lambda change: lambda p: p.write_text(json.dumps(change(json.loads(p.read_text()))))  # noqa: E731
    message = error("AskUbuntuDupQuestions", "default.test/split.json", split(lambda s: {**s, "top_ranked": None}))
    assert re.search(r"split\.json: field 'top_ranked' is null, yet the split has a top_ranked\.npy$", message)
    message = error("AskUbuntuDupQuestions", "default.test/split.json", split(lambda s: {**s, "queries": -1}))
    assert re.search(r"split\.json: field 'queries' is -1, not a count$", message)


def _cache_bytes() -> tuple[bytes, dict[bytes, Any]]:
    """An output cache's database with arrays of three dtypes and a JSON value, its write-ahead log folded in."""
    import numpy as np

    from vllm_eval.models.cache import OutputCache

    values = {
        b"k" * 20: np.arange(12, dtype=np.float32).reshape(3, 4),
        b"j" * 20: np.linspace(0, 1, 5),
        b"h" * 20: np.ones(3, dtype=np.float16),
        b"g" * 20: {"text": "answer", "logprob": -1.5},
    }
    with scratch() as folder:
        cache = OutputCache(folder)
        cache.put_many(values.items())
        cache.close()
        return (folder / "outputs.sqlite").read_bytes(), values


_CACHE, _CACHED = _cache_bytes()


@settings(FUZZ, max_examples=60)
@given(mutated(_CACHE, ("flip", "flip", "flip", "truncate", "insert", "delete", "empty")))
def test_output_caches_answer_or_name_the_file(raw):
    import numpy as np

    from vllm_eval.models.cache import OutputCache

    with scratch() as folder:
        (folder / "outputs.sqlite").write_bytes(raw)
        cache = outcome(lambda: OutputCache(folder, timeout=1), "outputs.sqlite")
        if cache is None:
            return
        found = outcome(lambda: cache.get_many(list(_CACHED)), "outputs.sqlite") or {}
        for key, value in found.items():  # whatever comes back is what was stored, bit for bit
            want = _CACHED[key]
            assert (
                (np.array_equal(value, want) and value.dtype == want.dtype)
                if isinstance(want, np.ndarray)
                else (value == want)
            )
        outcome(lambda: cache.put_many([(b"n" * 20, np.zeros(2, dtype=np.float32))]), "outputs.sqlite")
        outcome(cache.entries, "outputs.sqlite")
        cache.close()


def test_caches_that_are_not_ours_are_named(tmp_path):
    import sqlite3

    import numpy as np

    from vllm_eval.models.cache import OutputCache

    other = tmp_path / "other"
    other.mkdir()
    with sqlite3.connect(other / "outputs.sqlite") as conn:
        conn.execute("CREATE TABLE outputs (id INTEGER, value TEXT)")
    with pytest.raises(UsageError, match=r"outputs\.sqlite: its table 'outputs' has columns id, value, not an output"):
        OutputCache(other)  # it opened, then every lookup failed mid-run: "no such column: key"
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "outputs.sqlite").write_bytes(_CACHE[: len(_CACHE) // 2])
    with pytest.raises(UsageError, match=r"outputs\.sqlite: cut short \(\d+ bytes of \d+\)"):
        OutputCache(cut)
    text = tmp_path / "text"
    text.mkdir()
    (text / "outputs.sqlite").write_text("not a database\n" * 10)
    with pytest.raises(UsageError, match=r"outputs\.sqlite: not an SQLite database"):
        OutputCache(text)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "outputs.sqlite").write_bytes(_CACHE.replace(b"<f4", b"<q4"))
    cache = OutputCache(damaged)
    assert b"k" * 20 not in cache.get_many([b"k" * 20]) and cache.stats.damaged == 1  # a dtype numpy does not know
    cache.put_many([(b"k" * 20, np.zeros(1, dtype=np.float32))])
    cache.close()


def _task_result() -> dict[str, Any]:
    from mteb.results import TaskResult

    from vllm_eval.tasks import get_tasks

    [task] = get_tasks(["WordSim353"])
    scores = {"test": {"default": {"main_score": 0.72, "cosine_spearman": 0.72, "pearson": 0.7}}}
    return json.loads(json.dumps(TaskResult.from_task_results(task, scores, evaluation_time=1.5).to_dict()))


@settings(FUZZ, max_examples=40)
@given(mutated_json(_task_result()))
def test_results_read_back_to_resume_or_run_again(raw):
    """A finished task's mteb result, half-written or edited: read back when mteb can read it into a finite score,
    else moved aside (the task runs again); never a traceback in the middle of a run."""
    from types import SimpleNamespace

    from mteb.results import TaskResult

    from vllm_eval.evaluation.results import _reused

    with scratch() as folder:
        path = folder / "WordSim353.json"
        path.write_bytes(raw)
        cache = SimpleNamespace(get_task_result_path=lambda name, meta: path)
        model = SimpleNamespace(mteb_model_meta=None)
        if _reused(cache, "WordSim353", model, "only-missing"):
            event("read back")
            assert math.isfinite(TaskResult.from_disk(path).get_score())
        else:
            event("moved aside")
            assert not path.exists() and (folder / "WordSim353.json.damaged").read_bytes() == raw


def test_a_damaged_result_is_moved_aside_and_the_task_runs_again(tmp_path, caplog):
    from types import SimpleNamespace

    from vllm_eval.evaluation.results import _reused

    path = tmp_path / "WordSim353.json"
    text = json.dumps(_task_result())
    cache = SimpleNamespace(get_task_result_path=lambda name, meta: path)
    model = SimpleNamespace(mteb_model_meta=None)
    path.write_text(text)
    assert _reused(cache, "WordSim353", model, "only-missing")
    path.write_text(text[: len(text) // 2])  # a run killed while mteb wrote it: mteb's reader raised mid-run
    assert not _reused(cache, "WordSim353", model, "only-missing")
    assert (tmp_path / "WordSim353.json.damaged").read_text() == text[: len(text) // 2]
    assert "cannot be read back" in caplog.text and "the task runs again" in caplog.text
    path.write_text(text.replace("0.72", "NaN"))
    assert not _reused(cache, "WordSim353", model, "only-missing")  # a NaN score was reported as the task's


_TEMPLATE = (
    b"{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    b"{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@settings(FUZZ, max_examples=40)
@given(mutated(_TEMPLATE))
def test_chat_template_files_read_or_name_the_file(raw):
    from vllm_eval.api.checks import chat_template

    with scratch() as folder:
        path = folder / "chat.jinja"
        path.write_bytes(raw)
        text = outcome(lambda: chat_template(str(path)), "chat.jinja")
        if text is not None:
            assert ("{{" in text or "{%" in text) and not text.startswith("\ufeff")
            text.encode("utf-8")


def test_chat_template_files_that_are_not_templates_are_named(tmp_path):
    from vllm_eval.api.checks import chat_template

    path = tmp_path / "chat.jinja"
    path.write_bytes(b"\xef\xbb\xbf" + _TEMPLATE)
    assert chat_template(str(path)) == _TEMPLATE.decode()  # a BOM was kept as the template's first character
    path.write_bytes(_TEMPLATE.replace(b"role", b"r\xf4le"))
    with pytest.raises(UsageError, match=r"chat\.jinja:1: not UTF-8 text \(byte 0xf4"):
        chat_template(str(path))  # UnicodeDecodeError
    path.write_text("")
    with pytest.raises(UsageError, match=r"chat\.jinja: the file is empty"):
        chat_template(str(path))  # an empty template fell back to the model's own without a word


def test_a_directory_where_a_file_belongs_is_named(tmp_path):
    from vllm_eval.measure.runfiles import read_summary
    from vllm_eval.models.cache import OutputCache
    from vllm_eval.tasks.ner import load_ner_file

    for name in ("outputs.sqlite", "summary.json", "n.conll"):
        (tmp_path / name).mkdir()
    with pytest.raises(UsageError, match=r"outputs\.sqlite: a directory, not an output cache"):
        OutputCache(tmp_path)  # "unable to open database file", as if the folder were unwritable
    with pytest.raises(UsageError, match=r"summary\.json: a directory, not a file"):
        read_summary(tmp_path / "summary.json")
    with pytest.raises(UsageError, match=r"n\.conll: a directory, not a file"):
        load_ner_file(tmp_path / "n.conll")  # IsADirectoryError
