"""Your own data files: JSONL, CSV or Parquet, read with the standard library (pyarrow for Parquet), checked per row.

Each task type has a schema (required fields and their types); a row that breaks it is named by
file, line (JSONL: 1-based line; CSV: 1-based line counting the header; Parquet: row index) and field.

Schemas (fields in brackets are optional):

* ``classification``: ``text`` (str), ``label`` (str or int: the class name, or its index in the
  model's ``id2label``).
* ``image_classification``: ``image`` (an image file path, relative to the data file, or the file's bytes in
  Parquet), ``label`` (str or int).
* ``ner``: ``tokens`` (list of words), ``tags`` (list of IOB2/BIO tags, one per word). CoNLL files
  (``.conll``, ``.txt``: one ``word ... tag`` line per token, blank lines between sentences) are read
  by :func:`vllm_eval.tasks.ner.read_conll`.
* ``sts``: ``sentence1``, ``sentence2`` (str), ``score`` (number).
* ``pair_classification``: ``sentence1``, ``sentence2`` (str), ``label`` (0 or 1).
* ``reranking``: ``query`` (str), ``positive`` and ``negative`` (lists of str: the candidates to rank).
* ``retrieval``: a directory in BEIR's layout, ``corpus``, ``queries`` and ``qrels`` files (each
  ``.jsonl``, ``.csv``, ``.tsv`` or ``.parquet``; ``qrels/test.tsv`` as BEIR ships it also works):
  corpus rows ``_id`` or ``id``, ``text``, [``title``] (or ``image`` instead of ``text``: an image corpus, as
  ``image_classification`` gives images); query rows ``_id`` or ``id``, ``text``; qrels
  rows ``query-id``, ``corpus-id``, ``score`` (relevance, > 0 relevant).
* ``multiple_choice``: ``question`` (str), ``options`` (list of str), ``answer`` (the option's
  text, letter or 0-based index: one form per file, as a column has one type),
  [``image``: an image file path, relative to the data file].
* ``preference``: ``prompt``, ``chosen``, ``rejected`` (str), [``subset`` (str): accuracy is also
  reported per subset].

:func:`own_mteb_task` turns an ``sts``, ``pair_classification``, ``reranking``, ``retrieval`` or
``classification`` file into an ordinary mteb task, so mteb's evaluators and result files are used.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.errors import DataUnavailableError, UsageError

#: Per task type: field -> the Python types it accepts.
SCHEMAS: dict[str, dict[str, tuple[type, ...]]] = {
    "classification": {"text": (str,), "label": (str, int)},
    "image_classification": {"image": (str, bytes), "label": (str, int)},
    "ner": {"tokens": (list,), "tags": (list,)},
    "sts": {"sentence1": (str,), "sentence2": (str,), "score": (int, float)},
    "pair_classification": {"sentence1": (str,), "sentence2": (str,), "label": (int,)},
    "reranking": {"query": (str,), "positive": (list,), "negative": (list,)},
    "multiple_choice": {"question": (str,), "options": (list,), "answer": (str, int)},
    "preference": {"prompt": (str,), "chosen": (str,), "rejected": (str,)},
    # The three files of a retrieval directory.
    "corpus": {"id": (str, int), "text": (str,)},
    "image_corpus": {"id": (str, int), "image": (str, bytes)},
    "queries": {"id": (str, int), "text": (str,)},
    "qrels": {"query-id": (str, int), "corpus-id": (str, int), "score": (int, float)},
}
#: Optional fields, checked when present.
OPTIONAL: dict[str, dict[str, tuple[type, ...]]] = {
    "multiple_choice": {"image": (str,)},
    "preference": {"subset": (str,)},
    "corpus": {"title": (str,)},
}
#: Field names other tools use, read as ours (BEIR's ``_id``).
ALIASES = {"_id": "id"}

_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}
#: Physical line of each row of the files read so far (absent for Parquet: rows are named by index).
_LINES: dict[str, list[int]] = {}


@dataclass
class Table:
    """A data file's rows (dicts) and column names, in file order."""

    columns: list[str]
    rows: list[dict[str, Any]]

    @property
    def column_names(self) -> list[str]:
        """The column names (as ``datasets.Dataset.column_names``)."""
        return self.columns


def _where(path: Path, index: int) -> str:
    lines = _LINES.get(str(path))
    if lines is not None and index < len(lines):
        return f"{path}:{lines[index]}"
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return f"{path}:{index + 1}"
    if suffix in (".csv", ".tsv"):
        return f"{path}:{index + 2}"  # line 1 is the header
    return f"{path} row {index}"


def _read_json(path: Path, text: str) -> tuple[list[dict[str, Any]], list[int] | None]:
    """JSON lines (one object per line, blank lines skipped), or one JSON array of objects."""
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg.lower()} (column {exc.colno})") from None
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise UsageError(f"{path} row {i}: not a JSON object but {type(row).__name__}")
        return rows, None
    rows, lines = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{n}: not valid JSON: {exc.msg.lower()} (column {exc.colno})") from None
        if not isinstance(row, dict):
            raise UsageError(f"{path}:{n}: not a JSON object but {type(row).__name__} (one object per line)")
        rows.append(row)
        lines.append(n)
    return rows, lines


def _number(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def _read_csv(path: Path, text: str, delimiter: str) -> tuple[list[dict[str, Any]], list[int]]:
    """CSV/TSV with a header line; a column whose values all read as numbers is numbers (as pandas would)."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = next(reader, None)
    if not header:
        raise UsageError(f"{path}:1: no header line")
    raw, lines = [], []
    for values in reader:
        if not any(v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise UsageError(f"{path}:{reader.line_num}: {len(values)} fields, the header has {len(header)}")
        raw.append(values)
        lines.append(reader.line_num)
    columns: list[list[Any]] = []
    for j in range(len(header)):
        cells = [r[j] for r in raw]
        numbers = [_number(c) for c in cells if c != ""]
        numeric = all(not isinstance(x, str) for x in numbers)
        columns.append([None if c == "" else (_number(c) if numeric else c) for c in cells])
    rows = [{name: columns[j][i] for j, name in enumerate(header)} for i in range(len(raw))]
    return rows, lines


def load_table(path: str | Path) -> Table:
    """A data file's rows, unchecked: JSON lines (or a JSON array), CSV, TSV (standard library) or Parquet
    (pyarrow), by extension.

    Raises:
        UsageError: an unknown extension, or a file that cannot be parsed (file, line and reason named:
            ``reviews.jsonl:2: not valid JSON: unterminated string starting at (column 14)``).
    """
    path = Path(path)
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(f"--data {str(path)!r}: use a .jsonl, .csv, .tsv or .parquet file")
    lines: list[int] | None = None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types; the user needs the file and the reason
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise UsageError(f"{path}: not a readable Parquet file: {reason}") from None
        rows, columns = table.to_pylist(), list(table.column_names)
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"{path}: not UTF-8 text (byte {exc.start})") from None
        if fmt == "json":
            rows, lines = _read_json(path, text)
        else:
            rows, lines = _read_csv(path, text, "\t" if path.suffix.lower() == ".tsv" else ",")
        columns = list(dict.fromkeys(k for r in rows for k in r))
    if lines is None:
        _LINES.pop(str(path), None)
    else:
        _LINES[str(path)] = lines
    return Table(columns, rows)


def read_rows(path: str | Path, schema: str) -> list[dict[str, Any]]:
    """The rows of a data file, each checked against ``schema`` (see module doc).

    Returns:
        One dict per row with the schema's fields (other columns are kept too).

    Raises:
        DataUnavailableError: the file does not exist.
        UsageError: an unknown extension or schema, an unreadable file, or a row whose field is
            missing, empty or of the wrong type (file, line and field named).
    """
    path = Path(path)
    if schema not in SCHEMAS:
        raise UsageError(f"unknown data schema {schema!r}; known: {', '.join(SCHEMAS)}")
    if not path.is_file():
        raise DataUnavailableError(f"--data {str(path)!r}: no such file")
    table = load_table(path)
    rows = table.rows
    for alias, name in ALIASES.items():
        if alias in table.columns and name not in table.columns:
            rows = [{(name if k == alias else k): v for k, v in r.items()} for r in rows]
            table = Table([name if c == alias else c for c in table.columns], rows)
    fields = SCHEMAS[schema]
    optional = OPTIONAL.get(schema, {})
    missing = [f for f in fields if f not in table.columns]
    if missing:
        raise UsageError(
            f"{_where(path, 0)}: no field {missing[0]!r} ({schema} rows need {', '.join(fields)}; "
            f"the file has {', '.join(table.columns) or 'none'})"
        )
    for i, row in enumerate(rows):
        _check_row(path, i, row, fields, optional)
    if not rows:
        raise UsageError(f"--data {str(path)!r} has no rows")
    return rows


def _check_row(
    path: Path,
    i: int,
    row: dict[str, Any],
    fields: dict[str, tuple[type, ...]],
    optional: dict[str, tuple[type, ...]],
) -> None:
    for field, types in fields.items():
        value = row.get(field)
        if value is None or (isinstance(value, str) and not value.strip() and field != "text"):
            raise UsageError(f"{_where(path, i)}: field {field!r} is missing or empty")
        if isinstance(value, bool) or not isinstance(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise UsageError(f"{_where(path, i)}: field {field!r} must be {names}, got {type(value).__name__}")
    for field, types in optional.items():
        value = row.get(field)
        if value is not None and not isinstance(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise UsageError(f"{_where(path, i)}: field {field!r} must be {names}, got {type(value).__name__}")


def check_str_list(path: str | Path, rows: list[dict[str, Any]], field: str, *, min_len: int = 0) -> None:
    """Every row's ``field`` is a list of non-empty str with at least ``min_len`` items.

    Raises:
        UsageError: naming the file, line and field.
    """
    path = Path(path)
    for i, row in enumerate(rows):
        items = row[field]
        if len(items) < min_len:
            raise UsageError(f"{_where(path, i)}: field {field!r} needs at least {min_len} items, got {len(items)}")
        for item in items:
            if not isinstance(item, str) or not item.strip():
                raise UsageError(f"{_where(path, i)}: field {field!r} must list non-empty str, got {item!r:.40}")


def where(path: str | Path, index: int) -> str:
    """``file:line`` (or ``file row N`` for Parquet) of row ``index`` (0-based) of a data file."""
    return _where(Path(path), index)


def find_table(directory: Path, stem: str) -> Path | None:
    """``directory/stem.{jsonl,csv,tsv,parquet}``, or BEIR's ``qrels/test.tsv`` for ``qrels``; None if absent."""
    for ext in _FORMATS:
        if (directory / f"{stem}{ext}").is_file():
            return directory / f"{stem}{ext}"
    if stem == "qrels":
        for split in ("test", "dev", "train"):
            if (directory / "qrels" / f"{split}.tsv").is_file():
                return directory / "qrels" / f"{split}.tsv"
    return None


def image_path(path: str | Path, index: int, value: str) -> Path:
    """The image file a row's ``image`` field names: relative to the data file ``path`` (or absolute).

    Raises:
        UsageError: no such file (file, line and the path named).
    """
    image = (Path(path).parent / value).resolve()
    if not image.is_file():
        raise UsageError(f"{_where(Path(path), index)}: field 'image' {value!r}: no such file ({image})")
    return image


def load_images(path: str | Path, rows: list[dict[str, Any]]) -> list[Any]:
    """The RGB PIL images of rows' ``image`` fields (file paths, or bytes), in row order.

    Raises:
        UsageError: a missing file, or one PIL cannot read (file, line named).
    """
    from PIL import Image, UnidentifiedImageError

    out = []
    for i, r in enumerate(rows):
        value = r["image"]
        source = io.BytesIO(value) if isinstance(value, bytes) else image_path(path, i, value)
        try:
            with Image.open(source) as im:
                out.append(im.convert("RGB"))
        except (UnidentifiedImageError, OSError) as e:
            raise UsageError(f"{_where(Path(path), i)}: field 'image' is not an image PIL reads ({e})") from None
    return out
