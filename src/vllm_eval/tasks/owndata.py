"""Your own data files: JSONL, CSV or Parquet, read through Hugging Face ``datasets``, checked per row.

Each task type has a schema (required fields and their types); a row that breaks it is named by
file, line (JSONL: 1-based line; CSV: 1-based line counting the header; Parquet: row index) and field.

Schemas:

* ``classification``: ``text`` (str), ``label`` (str or int: the class name, or its index in the
  model's ``id2label``).
* ``ner``: ``tokens`` (list of words), ``tags`` (list of IOB2/BIO tags, one per word). CoNLL files
  (``.conll``, ``.txt``: one ``word ... tag`` line per token, blank lines between sentences) are read
  by :func:`vllm_eval.tasks.ner.read_conll`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import DataUnavailableError, UsageError

#: Per task type: field -> the Python types it accepts.
SCHEMAS: dict[str, dict[str, tuple[type, ...]]] = {
    "classification": {"text": (str,), "label": (str, int)},
    "ner": {"tokens": (list,), "tags": (list,)},
}

_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def _where(path: Path, index: int) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return f"{path}:{index + 1}"
    if suffix == ".csv":
        return f"{path}:{index + 2}"  # line 1 is the header
    return f"{path} row {index}"


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
    builder = _BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise UsageError(f"--data {str(path)!r}: use a .jsonl, .csv or .parquet file")
    import datasets

    try:
        table = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=None)
    except Exception as exc:  # pyarrow / json parse errors: say which file, keep the parser's reason
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--data {str(path)!r} cannot be read as {builder}: {reason}") from None
    fields = SCHEMAS[schema]
    missing = [f for f in fields if f not in table.column_names]
    if missing:
        raise UsageError(
            f"{_where(path, 0)}: no field {missing[0]!r} ({schema} rows need {', '.join(fields)}; "
            f"the file has {', '.join(table.column_names) or 'none'})"
        )
    rows = table.to_list()
    for i, row in enumerate(rows):
        for field, types in fields.items():
            value = row.get(field)
            if value is None or (isinstance(value, str) and not value.strip() and field != "text"):
                raise UsageError(f"{_where(path, i)}: field {field!r} is missing or empty")
            if isinstance(value, bool) or not isinstance(value, types):
                names = " or ".join(t.__name__ for t in types)
                raise UsageError(f"{_where(path, i)}: field {field!r} must be {names}, got {type(value).__name__}")
    if not rows:
        raise UsageError(f"--data {str(path)!r} has no rows")
    return rows
