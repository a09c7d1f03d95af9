"""Property tests of the data-file readers: files built valid by strategies, then mutated (bytes flipped, cut or
inserted, fields dropped, types swapped, NaN and infinity, a byte-order mark, lone surrogates, CRLF), fed to each
reader directly. A reader returns a well-formed result or raises one of the package's errors, on one line naming
the file; never another exception. No engine starts. Then plain examples of the bugs these found.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _fuzz import FUZZ, WORDS, encodable, mutated, mutated_rows, outcome, scratch
from vllm_eval.tasks import owndata, registry
from vllm_eval.tasks.ner import load_ner_file
from vllm_eval.tasks.owntasks import own_mteb_task
from vllm_eval.utils.errors import DataUnavailableError, UsageError

_PAIR = {"sentence1": WORDS, "sentence2": WORDS}
ROWS = {
    "sts": st.fixed_dictionaries({**_PAIR, "score": st.floats(0, 5, allow_nan=False)}),
    "pair_classification": st.fixed_dictionaries({**_PAIR, "label": st.sampled_from([0, 1])}),
    "classification": st.fixed_dictionaries({"text": WORDS, "label": st.sampled_from(["pos", "neg", "mid"])}),
    "reranking": st.fixed_dictionaries(
        {"query": WORDS, "positive": st.lists(WORDS, min_size=1, max_size=2), "negative": st.lists(WORDS, max_size=3)}
    ),
    "multiple_choice": st.fixed_dictionaries(
        {"question": WORDS, "options": st.lists(WORDS, min_size=2, max_size=4), "answer": st.sampled_from(["A", 1])}
    ),
    "preference": st.fixed_dictionaries({"prompt": WORDS, "chosen": WORDS, "rejected": WORDS}),
    # a.wav and b.raw (headerless PCM) are written beside every file of this schema; the other names no file
    "transcription": st.fixed_dictionaries(
        {"audio": st.sampled_from(["a.wav", "a.wav", "b.raw", "sub/none.wav"]), "text": WORDS},
        optional={
            "language": st.sampled_from(["en", "de"]),
            "sample_rate": st.sampled_from([8000, 16000, 0]),
            "channels": st.sampled_from([1, 2, -1]),
            "subtype": st.sampled_from(["PCM_16", "FLOAT", "PCM_13"]),
        },
    ),
    "ner": st.lists(st.tuples(WORDS, st.sampled_from(["O", "B-PER", "I-PER"])), min_size=1, max_size=4).map(
        lambda pairs: {"tokens": [w for w, _ in pairs], "tags": [t for _, t in pairs]}
    ),
}
FORMATS = (".jsonl", ".json", ".csv", ".tsv", ".parquet")


def _wav() -> bytes:
    import numpy as np
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, np.zeros(160, np.float32), 16000, format="WAV")
    return buf.getvalue()


WAV = _wav()


def _csv(rows: list[dict[str, Any]], delimiter: str) -> bytes:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=delimiter)
    writer.writerow(columns)
    for r in rows:
        cells = [r.get(c) for c in columns]
        writer.writerow(["" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else v for v in cells])
    return buf.getvalue().encode("utf-8", "surrogatepass")


def _parquet(rows: list[dict[str, Any]]) -> bytes | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    try:
        pq.write_table(pa.Table.from_pylist(rows), buf)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):  # a column of mixed types: not writable
        return None
    return buf.getvalue()


@st.composite
def data_file(draw: Any, schema: str, suffixes: tuple[str, ...] = FORMATS) -> tuple[str, bytes]:
    """(suffix, bytes) of a file of ``schema`` rows, then mutated: rows first (fields dropped, retyped), bytes
    after."""
    rows = draw(st.lists(ROWS[schema], min_size=5, max_size=8))
    for i, row in enumerate(rows):  # labels and scores that vary, as a file a task can score has them
        if "label" in row:
            row["label"] = [0, 1][i % 2] if schema == "pair_classification" else ["pos", "neg"][i % 2]
        if "score" in row:
            row["score"] += i
    rows = draw(mutated_rows(rows))
    suffix = draw(st.sampled_from(suffixes))
    damage = draw(st.booleans())  # half the files keep their bytes: what the rows' mutations do is then seen
    if suffix == ".parquet":
        data = _parquet(rows)
        if data is not None:
            return suffix, draw(mutated(data, ("flip", "truncate", "insert", "delete", "empty"))) if damage else data
        suffix = ".jsonl"
    if suffix == ".jsonl":
        ascii_only = draw(st.booleans())
        data = "".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in rows).encode("utf-8", "surrogatepass")
    elif suffix == ".json":
        data = json.dumps(rows, indent=draw(st.sampled_from([None, 1]))).encode()
    else:
        data = _csv(rows, "\t" if suffix == ".tsv" else draw(st.sampled_from([",", ";", "\t"])))
    return suffix, draw(mutated(data)) if damage else data


def _write(folder: Path, name: str, file: tuple[str, bytes]) -> Path:
    path = folder / f"{name}{file[0]}"
    path.write_bytes(file[1])
    return path


def _check_split(task: Any) -> None:
    """An mteb task built from a file holds finite numbers and UTF-8 text only."""
    split = task.dataset["default"]["test"]
    if isinstance(split, dict):  # retrieval: corpus, queries, qrels
        assert len(split["corpus"]) and len(split["queries"]) and split["relevant_docs"]
        encodable(*split["corpus"]["id"], *split["queries"]["text"])
        return
    assert len(split) > 0
    for column in split.column_names:
        for value in split[column]:
            if isinstance(value, float):
                assert math.isfinite(value)
            elif isinstance(value, str):
                encodable(value)


@settings(FUZZ, max_examples=100)
@given(st.data())
def test_mteb_data_files_build_a_task_or_name_the_file(data):
    schema = data.draw(st.sampled_from(["sts", "pair_classification", "classification", "reranking"]))
    file = data.draw(data_file(schema))
    with scratch() as folder:
        path = _write(folder, "mine", file)
        task = outcome(lambda: own_mteb_task(path), path.name)
        if task is not None:
            _check_split(task)


@FUZZ
@given(st.data())
def test_retrieval_directories_build_a_task_or_name_the_file(data):
    ids = data.draw(st.lists(st.sampled_from(["d1", "d2", "007", "7", "x y"]), min_size=1, max_size=4, unique=True))
    corpus = [{"_id": i, "title": "", "text": data.draw(WORDS)} for i in ids]
    queries = [{"_id": "q1", "text": data.draw(WORDS)}]
    qrels = [{"query-id": "q1", "corpus-id": data.draw(st.sampled_from(ids)), "score": data.draw(st.integers(0, 2))}]
    with scratch() as folder:
        (folder / "qrels").mkdir()
        names = []
        for stem, rows, suffixes in (
            ("corpus", corpus, (".jsonl", ".csv")),
            ("queries", queries, (".jsonl", ".parquet")),
            ("qrels/test", qrels, (".tsv",)),
        ):
            rows = data.draw(mutated_rows(rows)) if data.draw(st.booleans()) else rows
            suffix = data.draw(st.sampled_from(suffixes))
            raw = _csv(rows, "\t") if suffix == ".tsv" else _parquet(rows) if suffix == ".parquet" else None
            if raw is None:
                suffix, raw = ".jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()
            raw = data.draw(mutated(raw)) if data.draw(st.booleans()) else raw
            names.append(_write(folder, stem, (suffix, raw)).name)
        task = outcome(lambda: own_mteb_task(folder, "Retrieval"), folder.name, *names)
        if task is not None:
            _check_split(task)


def _check_runner_task(command: str, task: Any) -> None:
    if command == "classify":
        assert len(task.texts) == len(task.labels) > 0
        encodable(*task.texts)
        assert len({type(x) for x in task.labels}) == 1
    elif command == "reward":
        encodable(*task.prompts, *task.chosen, *task.rejected)
    elif command == "generate":
        for item in task.load():
            encodable(item.question, *item.options)
            assert 0 <= item.target < len(item.options)
    elif command == "transcribe":
        assert task.samples and all(Path(s.audio).name in ("a.wav", "b.raw") for s in task.samples)
        for s in task.samples:  # a headerless format that was taken is one soundfile reads
            assert s.raw is None or (s.raw[0] >= 1 and s.raw[1] >= 1 and s.raw[2] in ("PCM_16", "FLOAT")), s.raw
        encodable(*[s.text for s in task.samples])
    else:
        for words, tags in zip(task.sentences, task.tags, strict=True):
            assert len(words) == len(tags) > 0
            encodable(*words, *tags)


@FUZZ
@given(st.data())
def test_runner_files_load_or_name_the_file(data):
    command, schema = data.draw(
        st.sampled_from(
            [
                ("classify", "classification"),
                ("reward", "preference"),
                ("generate", "multiple_choice"),
                ("token-classify", "ner"),
                ("transcribe", "transcription"),
            ]
        )
    )
    file = data.draw(data_file(schema))
    with scratch() as folder:
        (folder / "a.wav").write_bytes(WAV)  # its header is read as the file is
        (folder / "b.raw").write_bytes(bytes(range(64)))
        path = _write(folder, "mine", file)
        task = outcome(lambda: registry.load_file(command, str(path)), path.name)
        if task is not None:
            _check_runner_task(command, task)


@st.composite
def conll_file(draw: Any) -> bytes:
    sentences = draw(st.lists(ROWS["ner"], min_size=1, max_size=3))
    lines = ["-DOCSTART- -X- O O", ""] if draw(st.booleans()) else []
    sep = draw(st.sampled_from([" ", "\t", " NN "]))
    for s in sentences:
        lines += [f"{w.replace(' ', '_').replace(chr(9), '_')}{sep}{t}" for w, t in zip(s["tokens"], s["tags"])]
        lines.append("")
    return draw(mutated("\n".join(lines).encode()))


@FUZZ
@given(conll_file(), st.sampled_from([".conll", ".txt"]))
def test_conll_files_load_or_name_the_file(raw, suffix):
    with scratch() as folder:
        path = _write(folder, "ner", (suffix, raw))
        task = outcome(lambda: load_ner_file(path), path.name)
        if task is not None:
            _check_runner_task("token-classify", task)


def _png(colour: int) -> bytes:
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), colour, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@FUZZ
@given(st.data())
def test_image_files_load_or_name_the_file(data):
    """Image classification (paths in JSON lines, or bytes in Parquet) and a multiple-choice file with images: a
    damaged image is named with its row before any model loads."""
    with scratch() as folder:
        images = [data.draw(mutated(_png(c), ("flip", "truncate", "insert", "delete", "empty"))) for c in (0, 255)]
        names = [data.draw(st.sampled_from(["a.png", "sub/b.png", "a\x00.png", "missing.png", "."])) for _ in images]
        (folder / "sub").mkdir()
        for name, raw in zip(names, images):
            if "\x00" not in name and name != "." and name != "missing.png":
                (folder / name).write_bytes(raw)
        labels = ["cat", "dog"] * 3
        if data.draw(st.booleans()):
            rows = [{"image": names[i % 2], "label": label} for i, label in enumerate(labels)]
            path = _write(folder, "pics", (".jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()))
        else:
            rows = [{"image": images[i % 2], "label": label} for i, label in enumerate(labels)]
            path = _write(folder, "pics", (".parquet", _parquet(rows)))
        task = outcome(lambda: own_mteb_task(path, "ImageClassification"), path.name)
        if task is not None:
            assert len(task.dataset["default"]["test"]) == 6
        quiz = [{"question": "colour?", "options": ["black", "white"], "answer": 0, "image": names[0]}]
        path = _write(folder, "quiz", (".jsonl", json.dumps(quiz[0]).encode()))
        task = outcome(lambda: registry.load_file("generate", str(path)), path.name)
        if task is not None:
            assert task.load()[0].images[0].size == (4, 4)


@FUZZ
@given(st.binary(max_size=200), st.sampled_from(FORMATS))
def test_garbage_in_any_format_is_named(raw, suffix):
    with scratch() as folder:
        path = _write(folder, "junk", (suffix, raw))
        table = outcome(lambda: owndata.load_table(path), path.name)
        if table is not None:
            assert table.rows and all(isinstance(r, dict) for r in table.rows)


# Plain examples: each failed (a traceback, or a silent acceptance) before the readers checked it.


def test_a_lone_surrogate_escape_is_named_not_a_pyarrow_traceback(tmp_path):
    path = tmp_path / "sts.jsonl"
    path.write_text(
        '{"sentence1": "a", "sentence2": "b", "score": 1}\n{"sentence1": "\\ud800", "sentence2": "b", "score": 2}\n'
    )
    with pytest.raises(UsageError, match=r"sts\.jsonl:2: field 'sentence1' holds a lone surrogate escape"):
        own_mteb_task(path)


def test_read_json_walks_its_strings_only_for_a_surrogate_escape(tmp_path, monkeypatch):
    """The walk over every string (seconds for a big file) is skipped when no ``\\ud800``-``\\udfff`` escape is
    in the text; an escape in either case, or a pair, is still walked, and a lone one refused."""
    from vllm_eval.utils import files

    walked = []
    real = files.lone_surrogate
    monkeypatch.setattr(files, "lone_surrogate", lambda value: walked.append(1) or real(value))
    path = tmp_path / "a.json"
    path.write_text('{"a": ["caf\\u00e9", "\\u2028"]}')
    assert files.read_json(path) == {"a": ["caf\u00e9", "\u2028"]} and walked == []
    path.write_text('{"a": "\\ud83d\\ude00"}')
    assert files.read_json(path) == {"a": "\U0001f600"} and walked == [1]
    path.write_text('{"a": ["b", "\\uDFFF"]}')
    with pytest.raises(UsageError, match=r"a\.json: field 'a'\[1\] holds a lone surrogate escape"):
        files.read_json(path)


def test_spreadsheet_exports_are_read(tmp_path):
    """A byte-order mark, ';' separators with decimal commas, CRLF line ends, quoted fields, padding columns and
    trailing empty lines, as spreadsheet programs write them."""
    path = tmp_path / "sts.csv"
    path.write_bytes(
        b'\xef\xbb\xbfsentence1;sentence2;score;;\r\n"a; cat";a dog;4,5;;\r\nrain;"sun\r\nshine";1;;\r\n;;;;\r\n\r\n'
    )
    rows = owndata.read_rows(path, "sts")
    assert rows == [
        {"sentence1": "a; cat", "sentence2": "a dog", "score": 4.5},
        {"sentence1": "rain", "sentence2": "sun\r\nshine", "score": 1},
    ]
    bom = tmp_path / "pairs.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"sentence1": "a", "sentence2": "b", "label": 1}\r\n')
    assert owndata.read_rows(bom, "pair_classification")[0]["label"] == 1


def test_line_separators_inside_json_strings_stay_in_their_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        json.dumps({"text": "one\u2028two\x85three", "label": "a"}, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    assert owndata.read_rows(path, "classification")[0]["text"] == "one\u2028two\x85three"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"sentence1": "a", "sentence2": "b", "score": NaN}\n', r"s\.jsonl:1: field 'score' is nan, not a finite"),
        ('{"sentence1": "a", "sentence2": "b", "score": 1e999}\n', r"s\.jsonl:1: field 'score' is inf, not a finite"),
        ('{"sentence1": "a", "sentence2": "b", "score": 1' + "0" * 5000 + "}\n", r"s\.jsonl:1: not valid JSON"),
    ],
)
def test_non_finite_scores_are_refused(tmp_path, content, message):
    path = tmp_path / "s.jsonl"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        own_mteb_task(path)
    csv_path = tmp_path / "s.csv"
    csv_path.write_text("sentence1,sentence2,score\na,b,nan\nc,d,1\n")
    with pytest.raises(UsageError, match=r"s\.csv:2: field 'score' is nan, not a finite number"):
        own_mteb_task(csv_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("sentence1,sentence2,score\na,b,3\nc,d,3\n", r"field 'score' is 3 in every row; STS needs scores that differ"),
        ("sentence1,sentence2,label\na,b,1\nc,d,1\n", r"field 'label' is 1 in every row; pairs labelled 0 and 1"),
        ("text,label\na,x\nb,x\nc,x\nd,x\ne,x\n", r"field 'label' is 'x' in every row; classification needs two"),
        ("text,label\na,x\nb,y\n", r"2 rows; 5-fold cross-validation needs 5 rows or more"),
        ("text,label\n", r"t\.csv: no rows \(an empty file, or a header line only\)"),
        ("sentence1,sentence2,score\na,b,-1e308\nc,d,1e308\n", r"field 'score' spans -1e\+308 to 1e\+308, more than"),
    ],
)
def test_data_that_would_score_nothing_is_refused(tmp_path, content, message):
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        own_mteb_task(path)


def test_retrieval_ids_keep_their_zeros_and_judgements_are_checked(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"_id": "007", "text": "bond"}\n{"_id": "7", "text": "seven"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "spy"}\n')
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t007\t1\n")
    task = own_mteb_task(tmp_path)
    assert task.dataset["default"]["test"]["relevant_docs"] == {"q1": {"007": 1}}
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t007\t0.5\n")
    with pytest.raises(UsageError, match=r"qrels\.tsv:2: field 'score' is 0\.5; relevance is a whole number"):
        own_mteb_task(tmp_path)
    (tmp_path / "corpus.jsonl").write_text('{"_id": "007", "text": "bond"}\n{"_id": "007", "text": "again"}\n')
    with pytest.raises(UsageError, match=r"corpus\.jsonl:2: id '007' again \(first at .*corpus\.jsonl:1\)"):
        own_mteb_task(tmp_path)


def test_long_csv_fields_directories_and_odd_paths(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("text,label\n" + "".join(f'"{"w " * 70000}",{i % 2}\n' for i in range(2)))
    assert len(owndata.read_rows(path, "classification")[0]["text"]) == 140000
    folder = tmp_path / "d.jsonl"
    folder.mkdir()
    with pytest.raises(UsageError, match=r"d\.jsonl: a directory, not a data file"):
        registry.load_file("classify", str(folder))
    quiz = tmp_path / "q.jsonl"
    quiz.write_text(json.dumps({"question": "q", "options": ["a", "b"], "answer": 0, "image": "x\x00.png"}) + "\n")
    with pytest.raises(UsageError, match=r"q\.jsonl:1: field 'image' 'x\\x00\.png' is not a usable path"):
        registry.load_file("generate", str(quiz))
    (tmp_path / "broken.png").write_bytes(_png(0)[:30])
    quiz.write_text(json.dumps({"question": "q", "options": ["a", "b"], "answer": 0, "image": "broken.png"}) + "\n")
    with pytest.raises(UsageError, match=r"q\.jsonl:1: field 'image' is not an image PIL reads"):
        registry.load_file("generate", str(quiz))


def test_ner_files_refuse_what_they_used_to_coerce(tmp_path):
    conll = tmp_path / "n.conll"
    conll.write_bytes(b"\xef\xbb\xbfJohn B-PER\r\nruns O\r\n")
    assert load_ner_file(conll).sentences == [["John", "runs"]]
    conll.write_bytes("Jos\xe9 B-PER\n".encode("latin-1"))
    with pytest.raises(UsageError, match=r"n\.conll:1: not UTF-8 text \(byte 0xe9 at column 4"):
        load_ner_file(conll)
    table = tmp_path / "n.jsonl"
    table.write_text('{"tokens": ["John", null], "tags": ["B-PER", "O"]}\n')
    with pytest.raises(UsageError, match=r"n\.jsonl:1: field 'tokens' must list non-empty str, got None"):
        load_ner_file(table)
    with pytest.raises(DataUnavailableError, match="no such file"):
        load_ner_file(tmp_path / "absent.conll")


def test_deeply_nested_json_is_named(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(UsageError, match=r"deep\.jsonl:1: not valid JSON: nested too deeply"):
        owndata.read_rows(path, "classification")  # RecursionError
    path.write_text('{"text": ' + '{"a": ' * 900 + "1" + "}" * 900 + ', "label": "x"}\n')
    with pytest.raises(UsageError, match=r"deep\.jsonl:1: field 'text' must be str, got dict"):
        owndata.read_rows(path, "classification")


def test_utf16_exports_whole_number_floats_and_single_objects(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_bytes("sentence1\tsentence2\tlabel\r\nété\thiver\t0\r\na\tb\t1\r\n".encode("utf-16"))
    assert [r["sentence1"] for r in owndata.read_rows(path, "pair_classification")] == ["été", "a"]
    floats = tmp_path / "pairs.jsonl"
    floats.write_text('{"sentence1": "a", "sentence2": "b", "label": 1.0}\n')
    assert owndata.read_rows(floats, "pair_classification")[0]["label"] == 1
    floats.write_text('{"sentence1": "a", "sentence2": "b", "label": 0.5}\n')
    with pytest.raises(UsageError, match=r"pairs\.jsonl:1: field 'label' must be int, got float"):
        owndata.read_rows(floats, "pair_classification")
    single = tmp_path / "one.json"
    single.write_text(json.dumps({"sentence1": "a", "sentence2": "b", "label": 1}, indent=2))
    with pytest.raises(UsageError, match=r"one\.json: one JSON object; a data file is JSON lines"):
        owndata.read_rows(single, "pair_classification")
