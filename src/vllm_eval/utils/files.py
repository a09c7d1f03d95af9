"""Reading the files users hand us, checked: text, JSON, and the fields of the project's own JSON formats.

Every failure is one :class:`~vllm_eval.utils.errors.UsageError` (or ``DataUnavailableError`` for a file
that is not there) naming the file, the line or field, and the reason; a UTF-8 byte-order mark, which
spreadsheet programs and Windows editors write, is accepted.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from .errors import DataUnavailableError, UsageError

#: A ``\u`` escape of a UTF-16 surrogate (D800-DFFF): the only way JSON text can hold a lone surrogate. It also
#: matches escaped pairs (emoji) and ``\\ud800`` (an escaped backslash), so a match means "walk", not "refuse".
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def read_bytes(path: str | Path) -> bytes:
    """The bytes of the file at ``path``.

    Raises:
        DataUnavailableError: no such file.
        UsageError: a directory, or a file the system refuses to read (the reason named).
    """
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataUnavailableError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: a directory, not a file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def decode(path: str | Path, data: bytes) -> str:
    """``data`` (the bytes of ``path``) as UTF-8 text, leading byte-order marks dropped (a file saved twice by a tool
    that adds one has two); UTF-16 with its byte-order mark too (a spreadsheet's "Unicode text" export).

    Raises:
        UsageError: bytes that are not UTF-8, or UTF-16 cut mid-character (the line and the byte named).
    """
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return data.decode("utf-16").lstrip("\ufeff")
        except UnicodeDecodeError as exc:
            raise UsageError(f"{path}: not UTF-16 text past byte {exc.start} (the file starts as UTF-16)") from None
    try:
        return data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UsageError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column}; save the file as UTF-8)"
        ) from None


def read_text(path: str | Path) -> str:
    """The UTF-8 text of the file at ``path`` (a byte-order mark dropped).

    Raises:
        DataUnavailableError: no such file.
        UsageError: a directory, an unreadable file, or bytes that are not UTF-8 (line named).
    """
    return decode(path, read_bytes(path))


def parse_json(path: str | Path, text: str, line: int | None = None) -> Any:
    """``text`` parsed as JSON; ``line``: the line of ``path`` that ``text`` is (JSON lines), else the whole file.

    ``NaN`` and ``Infinity`` parse (Python writes them); the caller refuses them where a number must be finite.

    Raises:
        UsageError: not valid JSON (the line, column and the parser's reason named).
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"{path}:{exc.lineno if line is None else line}"
        raise UsageError(f"{where}: not valid JSON: {exc.msg.lower()} (column {exc.colno})") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise UsageError(f"{path}:{line or 1}: not valid JSON: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise UsageError(f"{path}:{line or 1}: not valid JSON: nested too deeply") from None


def read_json(path: str | Path) -> Any:
    """The JSON value in the file at ``path``; lone surrogates (``"\\ud800"``), which no UTF-8 file can hold, are
    refused.

    Raises:
        DataUnavailableError: no such file.
        UsageError: an empty, unreadable or non-UTF-8 file, or not valid JSON (line and reason named).
    """
    text = read_text(path)
    if not text.strip():
        raise UsageError(f"{path}: an empty file, not JSON")
    value = parse_json(path, text)
    # Walking every string of a big file costs seconds; without a surrogate escape in the text there is nothing to find.
    bad = lone_surrogate(value) if SURROGATE_ESCAPE.search(text) else None
    if bad is not None:
        raise UsageError(f"{path}: {bad} holds a lone surrogate escape (\\ud800-\\udfff): not Unicode text")
    return value


def lone_surrogate(value: Any) -> str | None:
    """Where in ``value`` (nested lists and dicts, keys included) a string holds a lone UTF-16 surrogate, as
    ``field 'a'[2]``; None when there is none. JSON's ``\\ud800`` escapes parse to such strings, which cannot be
    encoded as UTF-8 (pyarrow, a tokenizer or a file write fails on them later). Walked with a stack, not by
    recursion: JSON nested as deep as the parser allows must not overflow here."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                return where or "a string"
        elif isinstance(item, dict):
            for key, member in reversed(item.items()):
                if _has_surrogate(key):
                    return f"field name {key!r}"
                stack.append((member, f"{where}.{key!r}" if where else f"field {key!r}"))
        elif isinstance(item, list):
            stack.extend((member, f"{where or 'item'}[{i}]") for i, member in reversed(list(enumerate(item))))
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def is_finite(value: Any) -> bool:
    """Whether ``value`` is an int or float (not a bool) that is a finite float (``1e400`` and huge ints are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def type_names(types: tuple[type, ...]) -> str:
    """``str or int``; ``number`` for int and float, ``null`` for NoneType."""
    names = []
    for t in types:
        name = {type(None): "null", float: "number", dict: "object", list: "list"}.get(t, t.__name__)
        if not (t is int and float in types):
            names.append(name)
    return " or ".join(dict.fromkeys(names))


def check(value: Any, types: tuple[type, ...], label: str) -> Any:
    """``value`` checked to be of ``types``: numbers finite, a bool only where ``bool`` is listed; ``label`` names it
    in the error (``summary.json: field 'scores'[2]``).

    Raises:
        UsageError: a value of another type, or a number that is NaN or infinite.
    """
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise UsageError(f"{label} must be {type_names(types)}, got {_shown(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not is_finite(value):
        raise UsageError(f"{label} is {value!r:.20}, not a finite number")
    return value


def field(obj: dict[str, Any], key: str, types: tuple[type, ...], where: str) -> Any:
    """``obj[key]`` checked as :func:`check` does; a missing field is None when ``types`` has NoneType.

    Raises:
        UsageError: a missing field, or one of another type (``where``, the field and both types named).
    """
    if key not in obj:
        if type(None) not in types:
            raise UsageError(f"{where}: no field {key!r}")
        return None
    return check(obj[key], types, f"{where}: field {key!r}")


def _shown(value: Any) -> str:
    name = type_names((type(value),))
    return f"{name} {value!r:.30}" if isinstance(value, (str, int, float)) else name


def json_object(path: str | Path, value: Any, what: str) -> dict[str, Any]:
    """``value`` (the JSON of ``path``) checked to be an object; ``what`` names the file's kind.

    Raises:
        UsageError: another JSON type.
    """
    if not isinstance(value, dict):
        raise UsageError(f"{path}: {what} must be a JSON object, got {type_names((type(value),))}")
    return value


def list_of(value: Any, types: tuple[type, ...], label: str) -> list[Any]:
    """``value`` checked to be a list whose items are of ``types``, as :func:`check` does.

    Raises:
        UsageError: not a list, or an item of another type (``label`` and its index named).
    """
    if not isinstance(value, list):
        raise UsageError(f"{label} must be a list, got {_shown(value)}")
    for i, item in enumerate(value):
        check(item, types, f"{label}[{i}]")
    return value
