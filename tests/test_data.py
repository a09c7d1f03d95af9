"""The offline datasets: real gensim files, decoded correctly, loaded safely."""

from __future__ import annotations

import pickle
import zlib

import numpy as np
import pytest

from vllm_eval.tasks import data
from vllm_eval.tasks.offline import LeeKnownItemRetrieval, split_first_sentence


def test_lee_corpus_shapes_and_legacy_encoding():
    docs = data.lee_documents()
    assert len(docs) == 50
    # lee.cor is cp1252: byte 0xA3 is a pound sign, which UTF-8 decoding would reject.
    assert any("\u00a33,000" in d for d in docs)
    sims = data.lee_similarity_matrix()
    assert sims.shape == (50, 50)
    assert np.allclose(np.diag(sims), 1.0)
    assert np.all((sims >= 0) & (sims <= 1))
    pairs = data.lee_document_pairs()
    assert len(pairs) == 1225
    assert pairs[0] == (docs[0], docs[1], sims[0, 1])


def test_word_pairs_and_polarity():
    simlex = data.word_pairs("simlex999.txt")
    ws = data.word_pairs("wordsim353.tsv")
    assert len(simlex) == 999 and len(ws) == 353
    assert ("old", "new", 1.58) == simlex[0]
    rows = data.pang_lee_polarity()
    assert len(rows) == 200
    assert {label for _, label in rows} == {"neg", "pos"}
    # 0x97 in cp1252 is an em dash; latin-1 would give a C1 control character instead.
    assert any("\u2014" in text for text, _ in rows)
    assert not any("\x97" in text for text, _ in rows)


def test_mini_newsgroups_headers_removed():
    news = data.mini_newsgroups()
    assert len(news.texts) == 200
    assert set(news.labels) == {"alt.atheism", "sci.space"}
    assert not any(t.startswith("Newsgroups:") or "\nNewsgroups:" in t[:200] for t in news.texts)


def test_restricted_unpickler_refuses_other_globals():
    class Evil:
        def __reduce__(self):
            import os

            return (os.system, ("echo unsafe",))

    payload = pickle.dumps(Evil(), protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        data.restricted_loads(payload)
    # ...while the real file loads.
    raw = zlib.decompress(data.gensim_file("mini_newsgroup").read_bytes())
    assert len(data.restricted_loads(raw)["data"]) == 200


def test_split_first_sentence_keeps_initialisms():
    first, rest = split_first_sentence("U.S. intelligence cannot say so. Mr. Bush said otherwise.")
    assert first == "U.S. intelligence cannot say so."
    assert rest == "Mr. Bush said otherwise."
    assert split_first_sentence("One sentence only.") == ("One sentence only.", "")


def test_known_item_retrieval_layout():
    task = LeeKnownItemRetrieval()
    task.load_data()
    split = task.dataset["default"]["test"]
    assert len(split["queries"]) == 48
    assert len(split["corpus"]) == 350
    corpus = dict(zip(split["corpus"]["id"], split["corpus"]["text"]))
    for qid, text in zip(split["queries"]["id"], split["queries"]["text"]):
        (did,) = split["relevant_docs"][qid]
        article = data.lee_documents()[int(qid.removeprefix("lee-q"))]
        assert article == f"{text} {corpus[did]}" or article.startswith(text)
        assert text not in corpus[did]
