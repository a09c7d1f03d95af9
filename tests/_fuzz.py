"""Shared pieces of the readers' property tests: file mutations as hypothesis strategies, and the one outcome
every reader must have (a well-formed result, or one of the package's errors on one line naming the file)."""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st

from vllm_eval.utils.errors import VllmEvalError

#: One profile for every property: deterministic for CI, no per-example deadline (the first example imports mteb).
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

#: Values of every JSON type and some Python writes that JSON does not have (NaN, infinity).
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.one_of(st.text(max_size=4), st.integers()), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
#: Words as people write them: letters, digits, spaces and the odd character that trips parsers.
WORDS = st.text(
    alphabet=st.sampled_from(list("abcdefgh XYZ019,;\"'\t\\é日\u2028\u0085\x00-")), min_size=1, max_size=12
).filter(lambda s: s.strip())

_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?")
_STRING_START = re.compile(rb'"')
_NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"nan", b"inf", b"9" * 5000]
_BYTES_OPS = (
    "flip",
    "truncate",
    "insert",
    "delete",
    "bom",
    "crlf",
    "cr",
    "non_finite",
    "surrogate",
    "nul",
    "latin1",
    "empty",
    "blank_lines",
    "duplicate_line",
)


@st.composite
def mutated(draw: Any, data: bytes, ops: tuple[str, ...] = _BYTES_OPS) -> bytes:
    """``data`` after up to two mutations: bytes flipped, cut, inserted or deleted, a byte-order mark, CRLF or
    CR line ends, a number made NaN/infinite/huge, a lone surrogate escape, NUL or Latin-1 bytes, emptied,
    blank lines, a line repeated."""
    for op in draw(st.lists(st.sampled_from(ops), max_size=2)):
        data = _mutate(draw, op, data)
    return data


def _at(draw: Any, data: bytes) -> int:
    return draw(st.integers(min_value=0, max_value=len(data)))


def _mutate(draw: Any, op: str, data: bytes) -> bytes:  # noqa: C901 - one branch per mutation
    if op == "flip" and data:
        i = draw(st.integers(min_value=0, max_value=len(data) - 1))
        return data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1 :]
    if op == "truncate":
        return data[: _at(draw, data)]
    if op == "insert":
        i = _at(draw, data)
        return data[:i] + draw(st.binary(min_size=1, max_size=6)) + data[i:]
    if op == "delete" and data:
        i = _at(draw, data)
        return data[:i] + data[i + draw(st.integers(1, 8)) :]
    if op == "bom":
        return b"\xef\xbb\xbf" + data
    if op == "crlf":
        return data.replace(b"\n", b"\r\n")
    if op == "cr":
        return data.replace(b"\n", b"\r")
    if op == "non_finite":
        return _replace_match(draw, _NUMBER, data, draw(st.sampled_from(_NON_FINITE)))
    if op == "surrogate":
        return _replace_match(draw, _STRING_START, data, b'"\\ud800', keep=False)
    if op == "nul":
        i = _at(draw, data)
        return data[:i] + b"\x00" + data[i:]
    if op == "latin1":
        i = _at(draw, data)
        return data[:i] + b"\xe9\xff" + data[i:]
    if op == "empty":
        return b""
    if op == "blank_lines":
        return b"\n\n" + data + b"\n\n\r\n"
    if op == "duplicate_line" and data:
        lines = data.split(b"\n")
        i = draw(st.integers(0, len(lines) - 1))
        return b"\n".join(lines[: i + 1] + lines[i:])
    return data


def _replace_match(draw: Any, pattern: re.Pattern, data: bytes, new: bytes, keep: bool = False) -> bytes:
    matches = list(pattern.finditer(data))
    if not matches:
        return data
    m = matches[draw(st.integers(0, len(matches) - 1))]
    return data[: m.start()] + new + (m.group() if keep else b"") + data[m.end() :]


@st.composite
def mutated_rows(draw: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with up to two of: a field dropped, a value of another type, a field added, a value made NaN or
    infinite, a string holding a lone surrogate."""
    rows = [dict(r) for r in rows]
    for _ in range(draw(st.integers(0, 2))):
        if not rows:
            break
        row = rows[draw(st.integers(0, len(rows) - 1))]
        op = draw(st.sampled_from(["drop", "swap", "add", "non_finite", "surrogate"]))
        keys = list(row)
        if op == "add" or not keys:
            row[draw(st.text(max_size=4))] = draw(ANY_VALUE)
        elif op == "drop":
            del row[draw(st.sampled_from(keys))]
        elif op == "swap":
            row[draw(st.sampled_from(keys))] = draw(ANY_VALUE)
        elif op == "non_finite":  # a number's field where there is one: the value, not the type, is wrong
            numbers = [k for k in keys if isinstance(row[k], (int, float))] or keys
            row[draw(st.sampled_from(numbers))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        else:
            texts = [k for k in keys if isinstance(row[k], (str, list))] or keys
            key = draw(st.sampled_from(texts))
            row[key] = ["\udc00"] if isinstance(row[key], list) else draw(st.sampled_from(["\ud800", "a\udfff"]))
    return rows


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A fresh folder for one example (hypothesis reruns a test body many times; tmp_path is one folder)."""
    folder = Path(tempfile.mkdtemp(prefix="vllm-eval-fuzz-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def outcome(read: Callable[[], Any], *names: str) -> Any:
    """``read()``'s result, or None when it raised one of the package's errors: its message one line that names
    one of ``names`` (the file, or its folder). Any other exception fails the test, as it would crash a user's run.
    """
    try:
        result = read()
    except VllmEvalError as exc:
        message = str(exc)
        assert len(message.splitlines()) == 1, f"not one line: {message!r}"
        assert any(n in message for n in names), f"{message!r} names none of {names}"
        event(f"refused: {type(exc).__name__}")
        return None
    event("read")
    return result


def encodable(*texts: Any) -> None:
    """Every text a reader returns can be written as UTF-8 (a lone surrogate cannot: pyarrow and tokenizers fail)."""
    for text in texts:
        assert isinstance(text, str), type(text)
        text.encode("utf-8")


def _paths(value: Any, here: tuple = ()) -> Iterator[tuple]:
    yield here
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*here, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*here, i))


@st.composite
def mutated_json(draw: Any, doc: Any) -> bytes:
    """``doc`` (a JSON document the project writes) with up to two of: a member dropped, a value of another type,
    a number made NaN, infinite or huge; serialised, then (half the time) its bytes mutated as :func:`mutated` does."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(0, 2))):
        path = draw(st.sampled_from(list(_paths(doc))))
        if not path:
            doc = draw(ANY_VALUE)
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        op = draw(st.sampled_from(["drop", "swap", "non_finite"]))
        if op == "drop":
            del parent[path[-1]]
        elif op == "swap":
            parent[path[-1]] = draw(ANY_VALUE)
        else:  # or finite but as far as a float goes: differences and axis limits overflow
            parent[path[-1]] = draw(st.sampled_from([math.nan, math.inf, -math.inf, 1.7e308, -1.7e308]))
    data = json.dumps(doc, indent=draw(st.sampled_from([None, 2]))).encode()
    return draw(mutated(data)) if draw(st.booleans()) else data


def made_up_words() -> Any:
    """A benchmark replica's words without a tokenizer (:class:`vllm_eval.tasks.shaped.Words`): 100 made-up ones."""
    import numpy as np

    from vllm_eval.tasks.shaped import Words

    words = Words.__new__(Words)
    words.vocab = np.asarray([f"w{a}{b}" for a in "abcdefghij" for b in "klmnopqrst"])
    words.mean_chars = 3.0
    return words
