"""Data files as rows: JSON lines or a JSON array, CSV or TSV, Parquet; one parser per format, checked here.

What each format accepts beyond the strict standard, because spreadsheet programs and editors write it: a UTF-8
byte-order mark (or UTF-16 with its mark); CRLF line ends; blank lines (and CSV lines of empty cells) anywhere;
a ``.csv`` separated by ``;`` or tabs (read from the header line, which then holds no comma), whose numbers may
have a decimal comma; empty trailing columns and header names padded with spaces. What each refuses, naming the
file, the line (JSON lines, CSV: 1-based, counting the header) or row (a JSON array or Parquet: 0-based) and the
reason: bytes that are not UTF-8, a line that does not parse, a JSON string holding a lone surrogate escape
(``"\\ud800"``: no UTF-8 text can hold it, and pyarrow fails on it later), one JSON object spread over lines (not
rows), a header naming a column twice, a row with more values than the header has columns, and a file without
rows. Schemas are checked by :mod:`vllm_eval.tasks.owndata`.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.errors import DataUnavailableError, UsageError
from ..utils.files import lone_surrogate, parse_json, read_text

#: Extension -> parser.
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
#: Physical line of each row of the files read so far (absent for a JSON array or Parquet: rows are named by index).
_LINES: dict[str, list[int]] = {}
#: csv's default cap (128 KiB per field) refuses a long document of a corpus; a field still has to fit in memory.
_FIELD_LIMIT = 1 << 30


@dataclass
class Table:
    """A data file's rows (dicts) and column names, in file order.

    Attributes:
        text_cells: every value is a str or None (CSV, TSV): the schema decides which are numbers.
        decimal_comma: numbers may be written ``4,5`` (a file separated by ``;`` or tabs).
    """

    columns: list[str]
    rows: list[dict[str, Any]]
    text_cells: bool = False
    decimal_comma: bool = False

    @property
    def column_names(self) -> list[str]:
        """The column names (as ``datasets.Dataset.column_names``)."""
        return self.columns


def where(path: str | Path, index: int) -> str:
    """``file:line`` (or ``file row N`` for a JSON array or Parquet) of row ``index`` (0-based) of a data file."""
    lines = _LINES.get(str(path))
    if lines is not None and index < len(lines):
        return f"{path}:{lines[index]}"
    return f"{path} row {index}"


def load_table(path: str | Path) -> Table:
    """A data file's rows, parsed but not checked against a schema: JSON lines (or a JSON array), CSV, TSV
    (standard library) or Parquet (pyarrow), by extension.

    Raises:
        DataUnavailableError: no such file.
        UsageError: an unknown extension, a directory, a file that cannot be parsed, or one without rows (file,
            line and reason named: ``reviews.jsonl:2: not valid JSON: unterminated string starting at (column 14)``).
    """
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(f"--data {str(path)!r}: use a .jsonl, .json, .csv, .tsv or .parquet file")
    if path.is_dir():
        raise UsageError(f"{path}: a directory, not a data file")
    if not path.is_file():
        raise DataUnavailableError(f"--data {str(path)!r}: no such file")
    lines: list[int] | None = None
    table = Table([], [])
    if fmt == "parquet":
        table.rows, table.columns = _read_parquet(path)
    elif fmt == "json":
        table.rows, lines = _read_json(path, read_text(path))
    else:
        table.rows, lines, delimiter = _read_csv(path, read_text(path), path.suffix.lower() == ".tsv")
        table.text_cells, table.decimal_comma = True, delimiter != ","
    if fmt != "parquet":
        table.columns = list(dict.fromkeys(k for r in table.rows for k in r))
    if lines is None:
        _LINES.pop(str(path), None)
    else:
        _LINES[str(path)] = lines
    if not table.rows:
        raise UsageError(f"{path}: no rows (an empty file{', or a header line only' if fmt == 'csv' else ''})")
    return table


def _read_parquet(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        return table.to_pylist(), [str(c) for c in table.column_names]
    except Exception as exc:  # pyarrow raises several types; the user needs the file and the reason
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise UsageError(f"{path}: not a readable Parquet file: {reason}") from None


def _read_json(path: Path, text: str) -> tuple[list[dict[str, Any]], list[int] | None]:
    """JSON lines (one object per line, blank lines skipped), or one JSON array of objects."""
    if text.lstrip().startswith("["):
        rows = parse_json(path, text)
        for i, row in enumerate(rows):
            _check_object(f"{path} row {i}", row, "")
        return rows, None
    if text.lstrip().startswith("{") and "\n" in text.strip() and isinstance(_whole(text), dict):
        raise UsageError(f"{path}: one JSON object; a data file is JSON lines (an object per line) or an array of them")
    rows, lines = [], []
    # Lines end at "\n" only: str.splitlines() would also split inside a string holding U+2028 or U+0085,
    # which JSON writes unescaped.
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        row = parse_json(path, line, line=n)
        _check_object(f"{path}:{n}", row, " (one object per line)")
        rows.append(row)
        lines.append(n)
    return rows, lines


def _whole(text: str) -> Any:
    """``text`` as one JSON value, or None: JSON lines of two objects or more are not one (the parse stops at the
    second, so this costs a line)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _check_object(where: str, row: Any, hint: str) -> None:
    if not isinstance(row, dict):
        name = {list: "list", str: "string", type(None): "null", bool: "boolean"}.get(type(row), "number")
        raise UsageError(f"{where}: not a JSON object but {name}{hint}")
    bad = lone_surrogate(row)
    if bad is not None:
        raise UsageError(
            f"{where}: {bad} holds a lone surrogate escape (\\ud800-\\udfff), which is not Unicode text "
            "(write the character itself, or its escaped surrogate pair)"
        )


def _delimiter(first_line: str, tsv: bool) -> str:
    """Tab for ``.tsv``; for ``.csv`` the header's separator: a comma, else ``;`` or a tab (spreadsheet programs
    in many locales write ``;``)."""
    if tsv:
        return "\t"
    for candidate in (",", ";", "\t"):
        if candidate in first_line:
            return candidate
    return ","


def _read_csv(path: Path, text: str, tsv: bool) -> tuple[list[dict[str, Any]], list[int], str]:
    """CSV/TSV with a header line; every value a str (None for an empty cell), typed later by the schema."""
    delimiter = _delimiter(text.split("\n", 1)[0], tsv)
    if csv.field_size_limit() < _FIELD_LIMIT:
        csv.field_size_limit(_FIELD_LIMIT)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows, lines = [], []
    try:
        names = _header(path, next(reader, []))
        start = reader.line_num + 1
        for values in reader:
            line, start = start, reader.line_num + 1  # a quoted value may span lines: name the first
            if not any(v.strip() for v in values):
                continue
            rows.append(_csv_row(path, line, names, values))
            lines.append(line)
    except csv.Error as exc:
        raise UsageError(f"{path}:{reader.line_num}: not valid CSV: {exc}") from None
    return rows, lines, delimiter


def _header(path: Path, header: list[str]) -> list[str | None]:
    """Column names of a header line; None for an unnamed column (a spreadsheet's empty trailing columns)."""
    names = [h.strip() or None for h in header]
    if not any(names):
        raise UsageError(f"{path}:1: no header line (the first line names the columns)")
    seen = set()
    for name in names:
        if name is not None and name in seen:
            raise UsageError(f"{path}:1: the header names column {name!r} twice")
        seen.add(name)
    return names


def _csv_row(path: Path, line: int, names: list[str | None], values: list[str]) -> dict[str, Any]:
    if len(values) > len(names) and not any(v.strip() for v in values[len(names) :]):
        values = values[: len(names)]  # empty cells past the last column: a spreadsheet's padding
    if len(values) != len(names):
        raise UsageError(f"{path}:{line}: {len(values)} fields, the header has {len(names)}")
    row: dict[str, Any] = {}
    for j, (name, value) in enumerate(zip(names, values)):
        if name is None:
            if value.strip():
                raise UsageError(f"{path}:{line}: column {j + 1} holds {value!r:.40} but has no name in the header")
            continue
        row[name] = value if value != "" else None
    return row
