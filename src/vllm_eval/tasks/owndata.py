"""Your own data files: JSONL, CSV or Parquet (parsed by :mod:`vllm_eval.tasks.tables`), checked per row.

Each task type has a schema (required fields and their types); a row that breaks it is named by
file, line (JSONL: 1-based line; CSV: 1-based line counting the header; a JSON array or Parquet: row index)
and field. Numbers must be finite (NaN and infinity score nothing); a CSV cell is a number where the schema
wants one (``score``; a ``label`` or ``answer`` column of whole numbers is indices); a ``label`` or ``answer``
column holds one type.

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
* ``transcription``: ``audio`` (an audio file path, relative to the data file, or the file's bytes in Parquet),
  ``text`` (the reference transcript or translation), [``language`` (ISO 639-1 code of the speech), ``id``;
  for headerless PCM (``.raw``): ``sample_rate`` (Hz), ``channels`` (default 1), ``subtype`` (soundfile's name,
  default ``PCM_16``)].

:func:`own_mteb_task` turns an ``sts``, ``pair_classification``, ``reranking``, ``retrieval`` or
``classification`` file into an ordinary mteb task, so mteb's evaluators and result files are used.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from ..utils.errors import DataUnavailableError, UsageError
from ..utils.files import is_finite
from .tables import FORMATS, Table, load_table, where

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
    "transcription": {"audio": (str, bytes), "text": (str,)},
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
    "transcription": {
        "language": (str,),
        "id": (str, int),
        "sample_rate": (int,),
        "channels": (int,),
        "subtype": (str,),
    },
    "corpus": {"title": (str,)},
}
#: Field names other tools use, read as ours (BEIR's ``_id``).
ALIASES = {"_id": "id"}
#: Fields whose values must share one type in a file: a label given as a name in one row and as an index in
#: another names two different things.
ONE_TYPE = ("label", "answer")

_INT = re.compile(r"\s*[+-]?[0-9]+\s*")
_FLOAT = re.compile(
    r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*|\s*[+-]?(?:nan|inf|infinity)\s*", re.I
)
_DECIMAL_COMMA = re.compile(r"\s*[+-]?[0-9]+,[0-9]+\s*")


def read_rows(path: str | Path, schema: str) -> list[dict[str, Any]]:
    """The rows of a data file, each checked against ``schema`` (see module doc).

    Returns:
        One dict per row with the schema's fields (other columns are kept too).

    Raises:
        DataUnavailableError: the file does not exist.
        UsageError: an unknown extension or schema, an unreadable or empty file, or a row whose field is
            missing, empty, of the wrong type or a number that is NaN or infinite; a label (or answer) column
            of two types (file, line and field named).
    """
    path = Path(path)
    if schema not in SCHEMAS:
        raise UsageError(f"unknown data schema {schema!r}; known: {', '.join(SCHEMAS)}")
    if not path.exists():
        raise DataUnavailableError(f"--data {str(path)!r}: no such file")
    table = load_table(path)
    for alias, name in ALIASES.items():
        if alias in table.columns and name not in table.columns:
            table.rows = [{(name if k == alias else k): v for k, v in r.items()} for r in table.rows]
            table.columns = [name if c == alias else c for c in table.columns]
    fields = SCHEMAS[schema]
    optional = OPTIONAL.get(schema, {})
    missing = [f for f in fields if f not in table.columns]
    if missing:
        raise UsageError(
            f"{where(path, 0)}: no field {missing[0]!r} ({schema} rows need {', '.join(fields)}; "
            f"the file has {', '.join(map(repr, table.columns)) or 'none'})"
        )
    if table.text_cells:
        _type_cells(table, {**fields, **optional})
    for i, row in enumerate(table.rows):
        _check_row(path, i, row, fields, optional)
    _check_one_type(path, table.rows, [f for f in ONE_TYPE if f in fields])
    return table.rows


def _cell_number(text: str, decimal_comma: bool) -> int | float | None:
    if _INT.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # more digits than Python converts: not a finite float either
            return float("inf")
    if _FLOAT.fullmatch(text):
        return float(text)
    if decimal_comma and _DECIMAL_COMMA.fullmatch(text):
        return float(text.replace(",", "."))
    return None


def _type_cells(table: Table, fields: dict[str, tuple[type, ...]]) -> None:
    """CSV cells as the schema wants them: numbers where it wants numbers; a column that takes a name or an
    index (``label``, ``answer``) is indices only when every cell is a whole number; ids stay text. Cells that
    do not convert stay str, for :func:`_check_row` to name."""
    for name, types in fields.items():
        if int not in types or (str in types and name not in ONE_TYPE):
            continue  # text, and ids: "007" names another document than "7"
        numbers = {
            i: _cell_number(r[name], table.decimal_comma)
            for i, r in enumerate(table.rows)
            if isinstance(r.get(name), str)
        }
        if str in types and not all(isinstance(n, int) for n in numbers.values()):
            continue
        for i, number in numbers.items():
            if number is not None:
                table.rows[i][name] = number


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
            raise UsageError(f"{where(path, i)}: field {field!r} is missing or empty")
        if isinstance(value, float) and int in types and float not in types and value.is_integer():
            value = row[field] = int(value)  # 1.0: how pandas writes an int column that had a gap
        _check_value(path, i, field, value, types)
    for field, types in optional.items():
        value = row.get(field)
        if value is not None:
            _check_value(path, i, field, value, types)


def _check_value(path: Path, i: int, field: str, value: Any, types: tuple[type, ...]) -> None:
    if isinstance(value, bool) or not isinstance(value, types):
        names = " or ".join(t.__name__ for t in types)
        shown = f" {value!r:.30}" if isinstance(value, str) else ""
        raise UsageError(f"{where(path, i)}: field {field!r} must be {names}, got {type(value).__name__}{shown}")
    if isinstance(value, (int, float)) and not is_finite(value):
        raise UsageError(f"{where(path, i)}: field {field!r} is {value!r:.20}, not a finite number")


def _check_one_type(path: Path, rows: list[dict[str, Any]], fields: list[str]) -> None:
    for field in fields:
        first = type(rows[0][field])
        for i, row in enumerate(rows):
            if type(row[field]) is not first:
                raise UsageError(
                    f"{where(path, i)}: field {field!r} is {type(row[field]).__name__} {row[field]!r:.30}, but "
                    f"{where(path, 0)} gives {first.__name__} (one type per column: names or indices)"
                )


def check_str_list(path: str | Path, rows: list[dict[str, Any]], field: str, *, min_len: int = 0) -> None:
    """Every row's ``field`` is a list of non-empty str with at least ``min_len`` items.

    Raises:
        UsageError: naming the file, line and field.
    """
    path = Path(path)
    for i, row in enumerate(rows):
        items = row[field]
        if len(items) < min_len:
            raise UsageError(f"{where(path, i)}: field {field!r} needs at least {min_len} items, got {len(items)}")
        for item in items:
            if not isinstance(item, str) or not item.strip():
                raise UsageError(f"{where(path, i)}: field {field!r} must list non-empty str, got {item!r:.40}")


def find_table(directory: Path, stem: str) -> Path | None:
    """``directory/stem.{jsonl,csv,tsv,parquet}``, or BEIR's ``qrels/test.tsv`` for ``qrels``; None if absent."""
    for ext in FORMATS:
        if (directory / f"{stem}{ext}").is_file():
            return directory / f"{stem}{ext}"
    if stem == "qrels":
        for split in ("test", "dev", "train"):
            if (directory / "qrels" / f"{split}.tsv").is_file():
                return directory / "qrels" / f"{split}.tsv"
    return None


def image_path(path: str | Path, index: int, value: str, field: str = "image") -> Path:
    """The file a row's ``field`` (an image, an audio) names: relative to the data file ``path`` (or absolute).

    Raises:
        UsageError: no such file, or a value that is no path (a NUL byte, a name too long): file, line and value named.
    """
    try:
        image = (Path(path).parent / value).resolve()
        found = image.is_file()
    except (OSError, ValueError) as exc:
        raise UsageError(f"{where(path, index)}: field {field!r} {value!r:.60} is not a usable path ({exc})") from None
    if not found:
        raise UsageError(f"{where(path, index)}: field {field!r} {value!r:.60}: no such file ({image})")
    return image


def load_image(path: str | Path, index: int, value: str | bytes) -> Any:
    """The RGB PIL image of row ``index``'s ``image`` field: a file path (see :func:`image_path`) or the bytes.

    Raises:
        UsageError: a missing file, or one PIL cannot read (file, line and PIL's reason named).
    """
    source = io.BytesIO(value) if isinstance(value, bytes) else image_path(path, index, value)
    return pil_read(source, lambda im: im.convert("RGB"), f"{where(path, index)}: field 'image'")


def pil_read(source: Any, read: Any, culprit: str) -> Any:
    """``read(image)`` of the image PIL opens from ``source`` (a path or a binary file), e.g. its ``size`` (the
    header only: PIL opens lazily) or ``convert("RGB")``.

    Raises:
        UsageError: PIL cannot read it: ``culprit`` (the file, row or field), then PIL's reason, on one line.
    """
    from PIL import Image

    try:
        with Image.open(source) as im:
            return read(im)
    except Exception as exc:  # PIL raises many types for a damaged file: OSError, SyntaxError, ValueError ...
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise UsageError(f"{culprit} is not an image PIL reads ({reason})") from None


def load_images(path: str | Path, rows: list[dict[str, Any]]) -> list[Any]:
    """The RGB PIL images of rows' ``image`` fields (file paths, or bytes), in row order.

    Raises:
        UsageError: a missing file, or one PIL cannot read (file, line named).
    """
    return [load_image(path, i, r["image"]) for i, r in enumerate(rows)]
