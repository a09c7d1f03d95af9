"""The offline real-data suite: mteb tasks over datasets that gensim ships, no network.

Each class is an ordinary mteb 2.x task (``mteb.evaluate(model, [LeeDocSimilarity()])`` works) whose
``load_data`` reads gensim's test data (see :mod:`vllm_eval.tasks.data`) instead of the hub. The
``dataset.revision`` of each task is a content hash of the files it reads, so a changed file shows up
as a different revision in the result JSON.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from datasets import Dataset, DatasetDict
from mteb.abstasks import AbsTaskClassification, AbsTaskClustering, AbsTaskRetrieval, AbsTaskSTS
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
from mteb.abstasks.task_metadata import TaskMetadata

from . import data


def _revision(*names: str) -> str:
    """Short content hash of gensim data files, used as the mteb dataset revision."""
    h = hashlib.sha256()
    for name in names:
        h.update(data.gensim_file(name).read_bytes())
    return h.hexdigest()[:12]


def _dataset(name: str, *files: str) -> dict[str, str]:
    return {"path": f"gensim-test-data/{name}", "revision": _revision(*files)}


_COMMON: dict[str, Any] = dict(
    eval_splits=["test"],
    eval_langs=["eng-Latn"],
    dialect=[],
    modalities=["text"],
    is_public=True,
)

_LEE_CITATION = r"""@inproceedings{lee2005empirical,
  author = {Lee, Michael D. and Pincombe, Brandon and Welsh, Matthew},
  title = {An Empirical Evaluation of Models of Text Document Similarity},
  booktitle = {Proceedings of the 27th Annual Conference of the Cognitive Science Society},
  pages = {1254--1259},
  year = {2005},
}"""


class _OfflineTask:
    """Mixin: ``load_data`` builds ``self.dataset`` from gensim files once per task object."""

    def _build(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        """Fill ``self.dataset`` as ``{"default": {"test": ...}}`` from gensim's files (no network)."""
        if self.data_loaded:
            return
        self.dataset = {"default": self._build()}
        self.data_loaded = True


def _sts_split(pairs: list[tuple[str, str, float]]) -> DatasetDict:
    s1, s2, score = zip(*pairs)
    return DatasetDict(
        {"test": Dataset.from_dict({"sentence1": list(s1), "sentence2": list(s2), "score": list(score)})}
    )


class LeeDocSimilarity(_OfflineTask, AbsTaskSTS):
    """Document-level STS: the 1,225 pairs of 50 news articles rated by students (0-1)."""

    min_score = 0.0
    max_score = 1.0
    metadata = TaskMetadata(
        name="LeeDocSimilarity",
        description=(
            "50 short Australian news articles (ABC, 2001-2002); every pair of the 1,225 was rated for "
            "similarity by about 10 students on a 1-5 scale, the mean rescaled to 0-1. Read from gensim's "
            "lee.cor and similarities0-1.txt. Lee et al. report r=0.60 for LSA and 0.605 between raters."
        ),
        reference="https://mindmodeling.org/cogsci2005/papers/0476/paper0476.pdf",
        dataset=_dataset("lee", "lee.cor", "similarities0-1.txt"),
        type="STS",
        category="t2t",
        main_score="pearson",
        date=("2001-01-01", "2002-12-31"),
        domains=["News", "Written"],
        task_subtypes=[],
        license="not specified",
        annotations_creators="human-annotated",
        sample_creation="found",
        bibtex_citation=_LEE_CITATION,
        **_COMMON,
    )

    def _build(self) -> DatasetDict:
        return _sts_split(data.lee_document_pairs())


class SimLex999(_OfflineTask, AbsTaskSTS):
    """Word-pair similarity (not relatedness): 999 pairs with mean ratings 0-10."""

    min_score = 0.0
    max_score = 10.0
    metadata = TaskMetadata(
        name="SimLex999",
        description=(
            "SimLex-999: 999 English word pairs (nouns, verbs, adjectives) rated for genuine similarity, "
            "as opposed to association, by 500 annotators; mean score 0-10. Read from gensim's simlex999.txt."
        ),
        reference="https://fh295.github.io/simlex.html",
        dataset=_dataset("simlex999", "simlex999.txt"),
        type="STS",
        category="t2t",
        main_score="spearman",
        date=("2014-01-01", "2015-12-31"),
        domains=["Written"],
        task_subtypes=[],
        license="not specified",
        annotations_creators="human-annotated",
        sample_creation="created",
        bibtex_citation=r"""@article{hill2015simlex,
  author = {Hill, Felix and Reichart, Roi and Korhonen, Anna},
  title = {{SimLex-999}: Evaluating Semantic Models With (Genuine) Similarity Estimation},
  journal = {Computational Linguistics},
  volume = {41},
  number = {4},
  pages = {665--695},
  year = {2015},
}""",
        **_COMMON,
    )

    def _build(self) -> DatasetDict:
        return _sts_split(data.word_pairs("simlex999.txt"))


class WordSim353(_OfflineTask, AbsTaskSTS):
    """Word-pair relatedness: 353 pairs with mean ratings 0-10."""

    min_score = 0.0
    max_score = 10.0
    metadata = TaskMetadata(
        name="WordSim353",
        description=(
            "WordSimilarity-353: 353 English word pairs rated for relatedness by 13-16 annotators; "
            "mean score 0-10. Read from gensim's wordsim353.tsv."
        ),
        reference="https://gabrilovich.com/resources/data/wordsim353/wordsim353.html",
        dataset=_dataset("wordsim353", "wordsim353.tsv"),
        type="STS",
        category="t2t",
        main_score="spearman",
        date=("2001-01-01", "2002-12-31"),
        domains=["Written"],
        task_subtypes=[],
        license="not specified",
        annotations_creators="human-annotated",
        sample_creation="created",
        bibtex_citation=r"""@article{finkelstein2002placing,
  author = {Finkelstein, Lev and Gabrilovich, Evgeniy and Matias, Yossi and Rivlin, Ehud and
            Solan, Zach and Wolfman, Gadi and Ruppin, Eytan},
  title = {Placing Search in Context: The Concept Revisited},
  journal = {ACM Transactions on Information Systems},
  volume = {20},
  number = {1},
  pages = {116--131},
  year = {2002},
}""",
        **_COMMON,
    )

    def _build(self) -> DatasetDict:
        return _sts_split(data.word_pairs("wordsim353.tsv"))


class PangLeePolarity(_OfflineTask, AbsTaskClassification):
    """Sentence polarity (negative/positive), 5-fold cross-validated logistic regression.

    The 200 sentences come without a train split, so mteb's cross-validation mode is used on the one
    split, with every training-fold sentence given to the classifier.
    """

    is_cross_validation = True
    n_splits = 5
    train_split = "test"
    samples_per_label = 1000  # > any class size: train on the whole fold, not an 8-shot sample
    metadata = TaskMetadata(
        name="PangLeePolarity",
        description=(
            "200 movie-review snippets (Rotten Tomatoes) from Pang & Lee's sentence polarity dataset v1.0, "
            "100 negative and 100 positive, lower-cased and tokenised. Read from gensim's "
            "pang_lee_polarity.cor (Windows-1252 text)."
        ),
        reference="https://www.cs.cornell.edu/people/pabo/movie-review-data/",
        dataset=_dataset("pang_lee_polarity", "pang_lee_polarity.cor"),
        type="Classification",
        category="t2c",
        main_score="accuracy",
        date=("2002-01-01", "2005-12-31"),
        domains=["Reviews", "Written"],
        task_subtypes=["Sentiment/Hate speech"],
        license="not specified",
        annotations_creators="derived",
        sample_creation="found",
        bibtex_citation=r"""@inproceedings{pang2005seeing,
  author = {Pang, Bo and Lee, Lillian},
  title = {Seeing Stars: Exploiting Class Relationships for Sentiment Categorization with Respect to Rating Scales},
  booktitle = {Proceedings of the 43rd Annual Meeting of the Association for Computational Linguistics},
  pages = {115--124},
  year = {2005},
}""",
        **_COMMON,
    )

    def _build(self) -> DatasetDict:
        rows = data.pang_lee_polarity()
        names = sorted({label for _, label in rows})
        return DatasetDict(
            {"test": Dataset.from_dict({"text": [t for t, _ in rows], "label": [names.index(lab) for _, lab in rows]})}
        )


class TwentyNewsgroupsMini(_OfflineTask, AbsTaskClustering):
    """Clustering of 200 Usenet posts from two groups (alt.atheism, sci.space), headers removed."""

    max_fraction_of_documents_to_embed = None  # mteb's default embeds 4%: 8 of 200 posts
    metadata = TaskMetadata(
        name="TwentyNewsgroupsMini",
        description=(
            "200 posts of the 20 Newsgroups corpus from alt.atheism and sci.space, clustered by group. "
            "Read from gensim's mini_newsgroup (a zlib-compressed pickle, loaded with a restricted "
            "unpickler); header blocks, which name the group, are removed."
        ),
        reference="http://qwone.com/~jason/20Newsgroups/",
        dataset=_dataset("mini_newsgroup", "mini_newsgroup"),
        type="Clustering",
        category="t2c",
        main_score="v_measure",
        date=("1993-01-01", "1993-12-31"),
        domains=["Social", "Written"],
        task_subtypes=["Thematic clustering"],
        license="not specified",
        annotations_creators="derived",
        sample_creation="found",
        bibtex_citation=r"""@inproceedings{lang1995newsweeder,
  author = {Lang, Ken},
  title = {NewsWeeder: Learning to Filter Netnews},
  booktitle = {Proceedings of the Twelfth International Conference on Machine Learning},
  pages = {331--339},
  year = {1995},
}""",
        **_COMMON,
    )

    def _build(self) -> DatasetDict:
        news = data.mini_newsgroups()
        return DatasetDict({"test": Dataset.from_dict({"sentences": list(news.texts), "labels": list(news.labels)})})


_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr gen sen rep gov lt col sgt prof no vs etc inc co corp ltd "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
# A sentence ends at . ! or ? (maybe closing quotes/brackets), then space, then a capital or digit.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_first_sentence(text: str) -> tuple[str, str]:
    """Split an article after its first sentence: ``(first sentence, rest)``.

    A full stop after an initialism (``U.S.``) or a common abbreviation (``Mr.``, ``Sept.``) does
    not end a sentence. Text with no sentence break is returned as ``(text, "")``.
    """
    for m in _SENTENCE_END.finditer(text):
        word = text[: m.start() + 1].split()[-1]
        if text[m.start()] == "." and (
            word.rstrip(".").lower() in _ABBREVIATIONS or re.fullmatch(r"(?:[A-Za-z]\.)+", word)
        ):
            continue
        return text[: m.end()].strip(), text[m.end() :].strip()
    return text.strip(), ""


class LeeKnownItemRetrieval(_OfflineTask, AbsTaskRetrieval):
    """Known-item search: the first sentence of a Lee article finds the rest of that article.

    Two of the 50 articles (37 and 45) are a single sentence and cannot be split: they stay in the
    corpus whole, as distractors, and have no query. So: 48 queries, 350 documents (48 article
    remainders, 2 whole articles, 300 background articles), one relevant document per query.
    """

    metadata = TaskMetadata(
        name="LeeKnownItemRetrieval",
        description=(
            "Queries are the first sentences of the Lee news articles; the corpus holds each article "
            "without its first sentence plus gensim's 300 lee_background.cor articles as distractors. "
            "The relevant document of a query is the rest of its own article. The two single-sentence "
            "articles have no query and stay whole in the corpus: 48 queries, 350 documents."
        ),
        reference="https://mindmodeling.org/cogsci2005/papers/0476/paper0476.pdf",
        dataset=_dataset("lee-known-item", "lee.cor", "lee_background.cor"),
        type="Retrieval",
        category="t2t",
        main_score="ndcg_at_10",
        date=("2001-01-01", "2002-12-31"),
        domains=["News", "Written"],
        task_subtypes=["Article retrieval"],
        license="not specified",
        annotations_creators="derived",
        sample_creation="found",
        bibtex_citation=_LEE_CITATION,
        **_COMMON,
    )

    def _build(self) -> dict[str, RetrievalSplitData]:
        qids, queries, dids, docs, qrels = [], [], [], [], {}
        for i, article in enumerate(data.lee_documents()):
            first, rest = split_first_sentence(article)
            if not rest:
                dids.append(f"lee-d{i}")
                docs.append(article)
                continue
            qids.append(f"lee-q{i}")
            queries.append(first)
            dids.append(f"lee-d{i}")
            docs.append(rest)
            qrels[f"lee-q{i}"] = {f"lee-d{i}": 1}
        for j, article in enumerate(data.lee_background_documents()):
            dids.append(f"lee-bg{j}")
            docs.append(article)
        return {
            "test": RetrievalSplitData(
                corpus=Dataset.from_dict({"id": dids, "text": docs}),
                queries=Dataset.from_dict({"id": qids, "text": queries}),
                relevant_docs=qrels,
                top_ranked=None,
            )
        }


#: Every offline task, in the order the CLI runs them.
OFFLINE_TASKS: tuple[type, ...] = (
    LeeDocSimilarity,
    SimLex999,
    WordSim353,
    PangLeePolarity,
    TwentyNewsgroupsMini,
    LeeKnownItemRetrieval,
)
