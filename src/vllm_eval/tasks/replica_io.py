"""The files of a benchmark replica (:mod:`vllm_eval.tasks.shaped`): written in chunks under a temporary name, read
back checked, with checks that look at whole columns and arrays rather than at each value in Python.

Two formats. JSON lines (``.jsonl``): one JSON object per line, the rows of a split (or of its corpus and
queries); a row's fields are its columns. NumPy arrays (``.npy``): the links of a retrieval split, by row number
(0-based line number) into its corpus and queries rather than by id: ``qrels.npy`` (int32, shape ``(n, 3)``:
query row, corpus row, relevance), ``top_ranked.npy`` (int32, shape ``(m,)``: each query's candidates, corpus rows,
query after query) and ``top_ranked_counts.npy`` (int32, shape ``(queries,)``: candidates per query). Its
``split.json`` gives the rows of each part, so a file cut short at a line end is not taken for a smaller split.

Every damaged file is one :class:`~vllm_eval.utils.errors.UsageError` naming the file, the line (JSON lines) or the
array, and the field.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import DataUnavailableError, UsageError
from ..utils.files import SURROGATE_ESCAPE, check, field, json_object, lone_surrogate, parse_json, read_json

#: Rows per chunk, written or read: the Python objects of one chunk at a time (the rest is on disk or in arrow).
CHUNK = 20_000
SPLIT = "split.json"
_BOM = b"\xef\xbb\xbf"


@contextlib.contextmanager
def atomic(path: Path) -> Iterator[Path]:
    """A temporary name beside ``path``, renamed to ``path`` when the block ends and removed when it fails: a file
    under its own name is always whole (an interrupted build leaves ``.<name>.tmp-<pid>`` files, never half a file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_lines(path: Path, chunks: Iterable[Iterable[str]]) -> int:
    """Write ``chunks`` (each an iterable of JSON texts without newlines) to ``path``, a text per line.

    Returns:
        the lines written.
    """
    n = 0
    with atomic(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for chunk in chunks:
            lines = list(chunk)
            f.write("".join(line + "\n" for line in lines))
            n += len(lines)
    return n


def write_rows(path: Path, columns: dict[str, list[Any]]) -> int:
    """Write the rows of ``columns`` (lists of one length) to ``path`` as JSON lines; returns the rows."""
    names = list(columns)
    encode = json.JSONEncoder(separators=(",", ":")).encode
    n = len(columns[names[0]])
    chunks = (
        (encode(dict(zip(names, values, strict=True))) for values in zip(*(columns[c][i : i + CHUNK] for c in names)))
        for i in range(0, n, CHUNK)
    )
    return write_lines(path, chunks)


def write_json(path: Path, value: Any) -> None:
    with atomic(path) as tmp:
        tmp.write_text(json.dumps(value, indent=2) + "\n")


def read_lines(path: Path) -> Iterator[tuple[int, list[Any]]]:
    """The JSON values of the lines of ``path``, a chunk at a time: (the chunk's first line number, values).

    Raises:
        DataUnavailableError: no such file.
        UsageError: an unreadable file, a line that is blank, not UTF-8, not one JSON value, or holds a lone surrogate
            escape (line named); an empty file.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below; the open is what fails
    except FileNotFoundError:
        raise DataUnavailableError(f"{path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with f:
        line = 1
        while raw := list(itertools.islice(f, CHUNK)):
            if line == 1:
                while raw[0].startswith(_BOM):  # a tool that adds a byte-order mark may have saved it twice
                    raw[0] = raw[0][len(_BOM) :]
            yield line, _parse_lines(path, line, raw)
            line += len(raw)
    if line == 1:
        raise UsageError(f"{path}: an empty file, not JSON lines")


#: The most bytes :func:`check_last_line` reads back from a file's end looking for its last line.
_TAIL_LIMIT = 64 << 20


def check_last_line(path: Path) -> None:
    """The last line of a JSON-lines file read and parsed, the rest not read: a file cut short mid-line (a copy
    interrupted, a disk that filled up) is found before any engine starts rather than when its task's turn comes,
    which on the whole benchmark can be many minutes in. Damage elsewhere is found as the file loads
    (:func:`read_lines`).

    Raises:
        DataUnavailableError: no such file.
        UsageError: an empty file, or a last line that is not one JSON value (file and line named).
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DataUnavailableError(f"{path}: no such file") from None
    if size == 0:
        raise UsageError(f"{path}: an empty file, not JSON lines")
    with open(path, "rb") as f:
        f.seek(size - 1)
        ended = f.read(1) == b"\n"
        end = size - 1 if ended else size  # the last line's bytes end here
        start, tail = end, b""
        while start > 0 and b"\n" not in tail:
            if end - start >= _TAIL_LIMIT:
                return  # a last line longer than the bound: left to the full read
            start = max(0, start - (1 << 16))
            f.seek(start)
            tail = f.read(end - start)
        line = tail[tail.rfind(b"\n") + 1 :] + b"\n"
        try:
            _parse_lines(path, 1, [line])
        except UsageError:
            f.seek(0)
            newlines = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))
            _parse_lines(path, newlines if ended else newlines + 1, [line])  # the same message, its line named
            raise


def _parse_lines(path: Path, first: int, raw: list[bytes]) -> list[Any]:
    data = b"".join(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first + data.count(b"\n", 0, exc.start)
        raise UsageError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x})") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    # One parse for the chunk, each line wrapped in a list of its own: a line that is not exactly one value
    # (two values, or half of one continued on the next line) shows as a list of another length, or fails.
    values = None
    with contextlib.suppress(ValueError, RecursionError):
        values = json.loads("[[" + "],[".join(lines) + "]]")
    if values is None or len(values) != len(lines) or any(len(v) != 1 for v in values):
        for i, line in enumerate(lines):
            if not line.strip():
                raise UsageError(f"{path}:{first + i}: a blank line, not JSON")
            parse_json(path, line, first + i)
        raise UsageError(f"{path}:{first}: not JSON lines")  # unreachable: some line failed above
    values = [v[0] for v in values]
    if SURROGATE_ESCAPE.search(text):
        for i, value in enumerate(values):
            bad = lone_surrogate(value)
            if bad is not None:
                raise UsageError(f"{path}:{first + i}: {bad} holds a lone surrogate escape (\\ud800-\\udfff)")
    return values


def columns(path: Path, first: int, rows: list[Any], spec: dict[str, tuple[type, ...]]) -> dict[str, list[Any]]:
    """The fields ``spec`` names of ``rows`` (JSON objects, the first on line ``first`` of ``path``), each a list,
    checked to be of its types (numbers finite); other fields are ignored.

    Raises:
        UsageError: a row that is not an object, lacks a field, or has a value of another type (line and field named).
    """
    if any(type(row) is not dict for row in rows):
        i = next(i for i, row in enumerate(rows) if type(row) is not dict)
        json_object(f"{path}:{first + i}", rows[i], "a row")
    out = {}
    for name, types in spec.items():
        try:
            values = [row[name] for row in rows]
        except KeyError:
            i = next(i for i, row in enumerate(rows) if name not in row)
            raise UsageError(f"{path}:{first + i}: no field {name!r}") from None
        kinds = set(map(type, values))
        floats = (v for v in values if type(v) is float)
        bad = kinds - set(types) or (float in kinds and not all(map(math.isfinite, floats)))
        if bad:
            for i, value in enumerate(values):
                check(value, types, f"{path}:{first + i}: field {name!r}")
        out[name] = values
    return out


def read_rows(path: Path, spec: dict[str, tuple[type, ...]]) -> dict[str, list[Any]]:
    """The columns ``spec`` names of the JSON lines file ``path`` (see :func:`columns`), at least one row."""
    out: dict[str, list[Any]] = {name: [] for name in spec}
    with _no_gc():
        for first, rows in read_lines(path):
            for name, values in columns(path, first, rows, spec).items():
                out[name] += values
    return out


def read_array(path: Path, shape: tuple[int | None, ...], bound: int | None = None, source: str = "") -> np.ndarray:
    """The integer array in ``path`` (a ``.npy`` file), of ``shape`` (None: any length; ``source`` says where the
    shape comes from), values in ``[0, bound)``.

    Returns:
        an array of ``shape``, of the file's integer dtype (int32 as written: 97 million candidates stay 388 MB).

    Raises:
        DataUnavailableError: no such file.
        UsageError: not an ``.npy`` file, not integers, of another shape, or a value out of bounds (file named).
    """
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise DataUnavailableError(f"{path}: no such file") from None
    except (OSError, ValueError, EOFError) as exc:
        reason = " ".join(str(exc).split())[:120]
        raise UsageError(f"{path}: not a NumPy array file ({reason})") from None
    if not isinstance(array, np.ndarray):  # a .npz archive
        array.close()
        raise UsageError(f"{path}: an archive of arrays, not one NumPy array")
    if not np.issubdtype(array.dtype, np.integer):
        raise UsageError(f"{path}: an array of {array.dtype}, not of integers")
    if array.ndim != len(shape) or any(want is not None and want != got for want, got in zip(shape, array.shape)):
        want = "(" + ", ".join("n" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise UsageError(f"{path}: an array of shape {array.shape}, not {want}{f' ({source})' if source else ''}")
    if bound is not None and array.size and (array.min() < 0 or array.max() >= bound):
        at = np.flatnonzero((array.reshape(-1) < 0) | (array.reshape(-1) >= bound))[0]
        raise UsageError(f"{path}: value {array.reshape(-1)[at]} at position {at} is not in [0, {bound})")
    return array


def read_split_counts(folder: Path) -> dict[str, int | None]:
    """A retrieval split's ``split.json``: rows of corpus, queries, qrels and top_ranked (None: no candidates).

    Raises:
        DataUnavailableError: no such file.
        UsageError: not a JSON object of those fields, counts not integers >= 0 (file and field named).
    """
    path = folder / SPLIT
    counts = json_object(path, read_json(path), "a replica split")
    for name in ("corpus", "queries", "qrels", "top_ranked"):
        n = field(counts, name, (int, type(None)) if name == "top_ranked" else (int,), str(path))
        if n is not None and n < 0:
            raise UsageError(f"{path}: field {name!r} is {n}, not a count")
    return counts


def _texts(path: Path, rows: int, what: str) -> tuple[list[str], Any]:
    """The ids (list) and the arrow table (``id``, ``text``) of a corpus or queries file of ``rows`` lines (``what``
    says where that count comes from).

    Raises:
        UsageError: a damaged line (line and field named), another number of lines, or an id repeated.
    """
    table = _arrow_lines(path)
    if table is None:  # damaged, or not a file arrow can vouch for: the line-by-line reader finds out which line
        table = _python_lines(path)
    ids = table.column("id").to_pylist()
    if len(ids) != rows:
        raise UsageError(f"{path}: {len(ids)} lines, not the {rows} of {what}")
    if len(set(ids)) != len(ids):
        seen: dict[str, int] = {}
        for i, name in enumerate(ids):
            if name in seen:
                raise UsageError(f"{path}:{i + 1}: field 'id' {name!r:.40} repeats line {seen[name] + 1}")
            seen[name] = i
    return ids, table


def _arrow_lines(path: Path) -> Any:
    """The ``id`` and ``text`` columns of the JSON lines file ``path`` parsed by arrow (in C++, on every core), or
    None where arrow's reading is not the file's: a parse error, a line without one of the fields or with a null,
    bytes that are not UTF-8 (arrow does not check), or another number of rows than of lines (arrow skips blank
    lines and reads an object split over two)."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema([("id", pa.string()), ("text", pa.string())])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pj.read_json(path, parse_options=options)
        table.validate(full=True)
        lines, last = 0, b"\n"
        with open(path, "rb") as f:
            while block := f.read(1 << 26):
                lines, last = lines + block.count(b"\n"), block[-1:]
    except (pa.ArrowException, OSError, ValueError):
        return None
    lines += last != b"\n"
    if table.num_rows != lines or any(column.null_count for column in table.columns):
        return None
    return table


def _python_lines(path: Path) -> Any:
    """:func:`_arrow_lines` read line by line in Python, each line checked."""
    import pyarrow as pa

    ids: list[str] = []
    texts = []
    for first, chunk in read_lines(path):
        got = columns(path, first, chunk, {"id": (str,), "text": (str,)})
        ids += got["id"]
        texts.append(pa.array(got["text"], pa.string()))  # arrow keeps the text compact; the strs go with the chunk
    return pa.table({"id": pa.array(ids, pa.string()), "text": pa.chunked_array(texts, pa.string())})


def _dataset(table: Any, path: Path) -> Any:
    """``table`` as a ``datasets.Dataset``, fingerprinted by ``path``'s name, size and time rather than by hashing
    its contents (4 s and twice the table's memory for Touche2020's 640 MB of text)."""
    import hashlib

    from datasets import Dataset
    from datasets.table import InMemoryTable

    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return Dataset(InMemoryTable(table), fingerprint=hashlib.sha256(key.encode()).hexdigest()[:16])


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The cycle collector off: reading builds millions of lists and dicts (no cycles among them), and each
    collection it would start walks them all again (2.3 s instead of 0.6 s for a split of 118,000 queries)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def read_retrieval(folder: Path) -> dict[str, Any]:
    """:func:`_read_retrieval` with the cycle collector off (see :func:`_no_gc`)."""
    with _no_gc():
        return _read_retrieval(folder)


def _read_retrieval(folder: Path) -> dict[str, Any]:
    """A retrieval split (see the module doc) as mteb's ``RetrievalSplitData``: corpus and queries datasets (``id``,
    ``text``), ``relevant_docs`` ``{query id: {document id: relevance}}`` and ``top_ranked`` ``{query id: [document
    id, ...]}`` or None. The id strings are shared: each candidate list holds the corpus's own id objects (8 bytes an
    entry).

    Raises:
        DataUnavailableError: a file of the split missing.
        UsageError: a damaged file (file, line or array, and field named), or links to rows that are not there.
    """
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

    counts = read_split_counts(folder)
    where = folder / SPLIT
    doc_ids, corpus = _texts(folder / "corpus.jsonl", counts["corpus"], f"field 'corpus' of {where}")
    query_ids, queries = _texts(folder / "queries.jsonl", counts["queries"], f"field 'queries' of {where}")
    qrels = read_array(folder / "qrels.npy", (counts["qrels"], 3), source=f"the count in {where}")
    for column, bound, part in ((0, len(query_ids), "queries.jsonl"), (1, len(doc_ids), "corpus.jsonl")):
        bad = np.flatnonzero((qrels[:, column] < 0) | (qrels[:, column] >= bound))
        if len(bad):
            row = qrels[bad[0], column]
            raise UsageError(f"{folder / 'qrels.npy'}: row {bad[0]} links row {row} of {part}, which has {bound} rows")
    relevant = _relevant(folder / "qrels.npy", qrels, query_ids, doc_ids)
    if counts["top_ranked"] is None and (folder / "top_ranked.npy").exists():
        raise UsageError(f"{where}: field 'top_ranked' is null, yet the split has a top_ranked.npy")
    top = None if counts["top_ranked"] is None else _top_ranked(folder, counts["top_ranked"], query_ids, doc_ids)
    return RetrievalSplitData(
        corpus=_dataset(corpus, folder / "corpus.jsonl"),
        queries=_dataset(queries, folder / "queries.jsonl"),
        relevant_docs=relevant,
        top_ranked=top,
    )


def _relevant(path: Path, qrels: np.ndarray, query_ids: list[str], doc_ids: list[str]) -> dict[str, dict[str, int]]:
    """``{query id: {document id: relevance}}`` from the rows of ``qrels`` (query row, corpus row, relevance), grouped
    by query with numpy; the id strings are the corpus's and the queries' own."""
    order = np.argsort(qrels[:, 0], kind="stable")
    query, doc = qrels[order, 0].astype(np.int64), qrels[order, 1].astype(np.int64)
    pairs = np.sort(query * len(doc_ids) + doc)
    if (pairs[1:] == pairs[:-1]).any():
        twice = pairs[1:][pairs[1:] == pairs[:-1]][0]
        raise UsageError(f"{path}: query row {twice // len(doc_ids)} judges corpus row {twice % len(doc_ids)} twice")
    cuts = (np.flatnonzero(np.diff(query)) + 1).tolist()
    starts, ends = [0, *cuts], [*cuts, len(query)]
    names = np.array(doc_ids, dtype=object)[doc].tolist()
    scores = qrels[order, 2].tolist()
    queries = [query_ids[q] for q in query[starts].tolist()] if len(query) else []
    return {q: dict(zip(names[a:b], scores[a:b], strict=True)) for q, a, b in zip(queries, starts, ends, strict=True)}


def _top_ranked(folder: Path, total: int, query_ids: list[str], doc_ids: list[str]) -> dict[str, list[str]]:
    """``{query id: [document id, ...]}`` from ``top_ranked.npy`` and ``top_ranked_counts.npy`` (``total``
    candidates), each list holding the corpus's own id objects; a query with no candidates is left out."""
    where = folder / SPLIT
    path = folder / "top_ranked_counts.npy"
    per_query = read_array(path, (len(query_ids),), bound=total + 1, source="one count per query")
    if per_query.sum() != total:
        raise UsageError(f"{path}: counts sum to {per_query.sum()}, not {total} ({where})")
    flat = read_array(folder / "top_ranked.npy", (total,), bound=len(doc_ids), source=f"the count in {where}")
    shared = np.array(doc_ids, dtype=object)
    ends = np.cumsum(per_query)
    out: dict[str, list[str]] = {}
    for q0 in range(0, len(query_ids), CHUNK):  # a chunk of queries' id objects at a time, then sliced per query
        q1 = min(q0 + CHUNK, len(query_ids))
        start = int(ends[q0 - 1]) if q0 else 0
        block = shared[flat[start : int(ends[q1 - 1])]].tolist()
        b = (ends[q0:q1] - start).tolist()
        a = [0, *b[:-1]]
        out.update((q, block[i:j]) for q, i, j in zip(query_ids[q0:q1], a, b, strict=True) if j > i)
    return out
