"""Readers for the real public datasets that gensim ships in its test data.

Every reader takes its file from ``gensim.test.utils.datapath(name)`` and never touches the
network. The files are old: ``lee.cor`` and ``pang_lee_polarity.cor`` are Windows-1252, not
UTF-8 (``\\xa3`` is a pound sign, ``\\x97`` an em dash), and ``mini_newsgroup`` is a
zlib-compressed Python 2 pickle of a scikit-learn ``Bunch``.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

#: Encoding of the gensim corpora that are not UTF-8 (checked byte by byte: every
#: non-ASCII byte in them decodes to the intended character under cp1252).
LEGACY_ENCODING = "cp1252"


def gensim_file(name: str) -> Path:
    """Path of a file in gensim's shipped test data.

    Raises:
        FileNotFoundError: gensim is installed but the file is not in its test data.
    """
    from gensim.test.utils import datapath

    path = Path(datapath(name))
    if not path.is_file():
        raise FileNotFoundError(f"gensim test data file {name!r} not found at {path}")
    return path


def read_lines(name: str, encoding: str = "utf-8") -> list[str]:
    """Non-empty, stripped lines of a gensim data file decoded with ``encoding``."""
    text = gensim_file(name).read_bytes().decode(encoding)
    return [line.strip() for line in text.splitlines() if line.strip()]


@cache
def lee_documents() -> tuple[str, ...]:
    """The 50 news articles of Lee, Pincombe & Welsh (2005), one string each."""
    docs = tuple(read_lines("lee.cor", LEGACY_ENCODING))
    if len(docs) != 50:
        raise ValueError(f"lee.cor: expected 50 articles, found {len(docs)}")
    return docs


@cache
def lee_background_documents() -> tuple[str, ...]:
    """The 300 background articles shipped with the Lee corpus (used as retrieval distractors)."""
    return tuple(read_lines("lee_background.cor", LEGACY_ENCODING))


@cache
def lee_similarity_matrix() -> np.ndarray:
    """Mean human similarity ratings of the 50 Lee articles, float64 array of shape (50, 50).

    The file stores the upper triangle (diagonal 1.0, zeros below it); ratings are in [0, 1].
    """
    rows = [[float(x) for x in line.split()] for line in read_lines("similarities0-1.txt")]
    matrix = np.asarray(rows, dtype=np.float64)
    if matrix.shape != (50, 50):
        raise ValueError(f"similarities0-1.txt: expected a 50x50 matrix, found {matrix.shape}")
    return matrix


def lee_document_pairs() -> list[tuple[str, str, float]]:
    """The 1,225 distinct pairs (i < j) of Lee articles with their mean human rating."""
    docs, sims = lee_documents(), lee_similarity_matrix()
    n = len(docs)
    return [(docs[i], docs[j], float(sims[i, j])) for i in range(n) for j in range(i + 1, n)]


def word_pairs(name: str) -> list[tuple[str, str, float]]:
    """Word pairs with their mean human score from a tab-separated file with ``#`` comment lines.

    Used for ``simlex999.txt`` (999 pairs, scores 0-10) and ``wordsim353.tsv`` (353 pairs, 0-10).
    """
    pairs = []
    for line in read_lines(name):
        if line.startswith("#"):
            continue
        w1, w2, score = line.split("\t")
        pairs.append((w1, w2, float(score)))
    return pairs


def pang_lee_polarity() -> list[tuple[str, str]]:
    """(sentence, label) pairs from ``pang_lee_polarity.cor``; labels are ``"neg"`` / ``"pos"``.

    Each line is ``__label__neg|pos <tokenised lower-cased sentence>`` (Pang & Lee 2005).
    """
    out = []
    for line in read_lines("pang_lee_polarity.cor", LEGACY_ENCODING):
        label, _, text = line.partition(" ")
        if not label.startswith("__label__"):
            raise ValueError(f"pang_lee_polarity.cor: line without a label: {line[:60]!r}")
        out.append((text.strip(), label.removeprefix("__label__")))
    return out


class _Bunch(dict):
    """Stand-in for ``sklearn.datasets.base.Bunch``: a plain dict filled from the pickled state."""

    def __setstate__(self, state: dict) -> None:
        self.update(state)


def _numpy_reconstruct():
    core = getattr(np, "_core", None) or np.core  # numpy 2 moved it
    return core.multiarray._reconstruct


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that admits exactly the globals ``mini_newsgroup`` needs and nothing else.

    ``pickle.load`` would import and call whatever the file names; this one refuses any other
    global with ``pickle.UnpicklingError``.
    """

    _ALLOWED = {
        ("copy_reg", "_reconstructor"): copyreg._reconstructor,
        ("__builtin__", "dict"): dict,
        ("__builtin__", "object"): object,
        ("sklearn.datasets.base", "Bunch"): _Bunch,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): None,  # resolved lazily below
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"mini_newsgroup: global {module}.{name} is not allowed")
        if (module, name) == ("numpy.core.multiarray", "_reconstruct"):
            return _numpy_reconstruct()
        return self._ALLOWED[(module, name)]


def restricted_loads(data: bytes) -> object:
    """Unpickle ``data`` (a Python 2 pickle) admitting only the globals of a scikit-learn Bunch.

    Raises:
        pickle.UnpicklingError: the pickle names any other global.
    """
    return _RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()


def strip_news_headers(post: str) -> str:
    """Drop the header block (everything before the first blank line) of a Usenet post.

    The headers name the newsgroup (``Newsgroups: sci.space``), which is the label itself;
    scikit-learn's ``fetch_20newsgroups(remove=("headers",))`` strips them the same way.
    """
    _, sep, body = post.partition("\n\n")
    return body.strip() if sep else post.strip()


@dataclass(frozen=True)
class NewsgroupsMini:
    """The 200 posts of gensim's ``mini_newsgroup`` with their group names."""

    texts: tuple[str, ...]
    labels: tuple[str, ...]


@cache
def mini_newsgroups() -> NewsgroupsMini:
    """Load ``mini_newsgroup`` (200 posts from alt.atheism and sci.space), headers removed."""
    raw = zlib.decompress(gensim_file("mini_newsgroup").read_bytes())
    bunch = restricted_loads(raw)
    names = list(bunch["target_names"])
    texts = tuple(strip_news_headers(t) for t in bunch["data"])
    labels = tuple(names[int(i)] for i in bunch["target"])
    return NewsgroupsMini(texts=texts, labels=labels)
