"""Offline image tasks from scikit-learn's handwritten digits (1,797 images of 8×8 pixels, 16 grey levels, ten
classes; the UCI "Optical Recognition of Handwritten Digits" test set), as ordinary mteb 2.x tasks:

* :class:`DigitsZeroShot` — zero-shot classification: each image against the ten prompts "a photo of the
  digit {name}" (mteb's ``AbsTaskZeroShotClassification``, category ``i2t``);
* :class:`DigitsImageClassification` — a linear probe on the image vectors (``AbsTaskClassification`` with
  an image column, category ``i2c``);
* :class:`DigitsTextToImageRetrieval` — ten text queries ("a photo of the digit {name}"), every image of that
  digit relevant (``AbsTaskRetrieval``, category ``t2i``).

Images are scaled to 0-255, upsampled to :data:`IMAGE_SIZE` px (nearest neighbour) and made RGB, so any image
model's processor takes them. The split is fixed: the first :data:`TRAIN` images train the probe, the next
:data:`TEST` are evaluated. Data ships with scikit-learn: no network.
"""

from __future__ import annotations

import hashlib
from typing import Any

from datasets import Dataset, DatasetDict
from mteb.abstasks import AbsTaskClassification, AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
from mteb.abstasks.task_metadata import TaskMetadata
from mteb.abstasks.zeroshot_classification import AbsTaskZeroShotClassification

from .offline import _OfflineTask

#: Side of the square images handed to models, px (the 8×8 digits upsampled).
IMAGE_SIZE = 32
#: Images that train the linear probe, and images evaluated (after them), of the 1,797.
TRAIN, TEST = 1000, 300
NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

_CITATION = r"""@misc{alpaydin1998optical,
  author = {Alpaydin, E. and Kaynak, C.},
  title = {Optical Recognition of Handwritten Digits},
  year = {1998},
  publisher = {UCI Machine Learning Repository},
}"""


def digits(lo: int, hi: int) -> tuple[list[Any], list[int]]:
    """scikit-learn's digits ``[lo, hi)`` as RGB PIL images of :data:`IMAGE_SIZE` px, and their labels 0-9."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    images = [
        Image.fromarray((im * 255 / 16).astype(np.uint8)).resize((IMAGE_SIZE, IMAGE_SIZE), Image.NEAREST).convert("RGB")
        for im in data.images[lo:hi]
    ]
    return images, [int(t) for t in data.target[lo:hi]]


#: Per task: description, mteb type, category, modalities, and fields beyond the shared ones.
_SPECS: dict[str, tuple[str, str, str, list[str], dict[str, Any]]] = {
    "DigitsZeroShot": (
        "Zero-shot classification of 300 handwritten digits against ten text prompts.",
        "ZeroShotClassification", "i2t", ["image", "text"], {},
    ),
    "DigitsImageClassification": (
        "Linear-probe classification of handwritten digit images (1,000 to train, 300 to evaluate).",
        "ImageClassification", "i2c", ["image"], {},
    ),
    "DigitsTextToImageRetrieval": (
        "Text-to-image retrieval: ten digit-name queries over 300 handwritten digit images.",
        "Any2AnyRetrieval", "t2i", ["text", "image"],
        {"main_score": "ndcg_at_10", "task_subtypes": ["Image Text Retrieval"]},
    ),
}  # fmt: skip


def _metadata(name: str) -> TaskMetadata:
    import sklearn

    description, type_, category, modalities, extra = _SPECS[name]
    revision = hashlib.sha256(f"sklearn-{sklearn.__version__}-{IMAGE_SIZE}-{TRAIN}-{TEST}".encode()).hexdigest()[:12]
    fields: dict[str, Any] = {"main_score": "accuracy", "task_subtypes": ["Object recognition"], **extra}
    return TaskMetadata(
        name=name,
        description=description + " scikit-learn's handwritten digits (no network).",
        reference="https://archive.ics.uci.edu/dataset/80/optical+recognition+of+handwritten+digits",
        dataset={"path": "sklearn/digits", "revision": revision},
        type=type_,
        category=category,
        modalities=modalities,
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        dialect=[],
        date=("1998-01-01", "1998-12-31"),
        domains=["Scene"],
        license="cc-by-4.0",
        annotations_creators="human-annotated",
        sample_creation="found",
        is_public=True,
        bibtex_citation=_CITATION,
        **fields,
    )


def prompt(label: int) -> str:
    """The text of one class: ``"a photo of the digit {name}"``."""
    return f"a photo of the digit {NAMES[label]}"


class DigitsZeroShot(_OfflineTask, AbsTaskZeroShotClassification):
    """Each of 300 digit images classified by its nearest prompt among the ten "a photo of the digit {name}"."""

    metadata = _metadata("DigitsZeroShot")

    def _build(self) -> DatasetDict:
        images, labels = digits(TRAIN, TRAIN + TEST)
        return DatasetDict({"test": Dataset.from_dict({"image": images, "label": labels})})

    def get_candidate_labels(self) -> list[str]:
        """The ten prompts, in label order."""
        return [prompt(k) for k in range(10)]


class DigitsImageClassification(_OfflineTask, AbsTaskClassification):
    """A logistic-regression probe on the vectors of digit images: trained on 1,000, evaluated on 300."""

    input_column_name = "image"
    samples_per_label = 100
    metadata = _metadata("DigitsImageClassification")

    def _build(self) -> DatasetDict:
        train, train_labels = digits(0, TRAIN)
        test, test_labels = digits(TRAIN, TRAIN + TEST)
        return DatasetDict(
            {
                "train": Dataset.from_dict({"image": train, "label": train_labels}),
                "test": Dataset.from_dict({"image": test, "label": test_labels}),
            }
        )


class DigitsTextToImageRetrieval(_OfflineTask, AbsTaskRetrieval):
    """Ten text queries ("a photo of the digit {name}") over 300 digit images; every image of the digit is relevant."""

    metadata = _metadata("DigitsTextToImageRetrieval")

    def _build(self) -> dict:
        images, labels = digits(TRAIN, TRAIN + TEST)
        ids = [f"digit-{i}" for i in range(len(images))]
        qrels = {f"q{k}": {d: 1 for d, label in zip(ids, labels) if label == k} for k in range(10)}
        return {
            "test": RetrievalSplitData(
                corpus=Dataset.from_dict({"id": ids, "image": images}),
                queries=Dataset.from_dict({"id": list(qrels), "text": [prompt(k) for k in range(10)]}),
                relevant_docs=qrels,
                top_ranked=None,
            )
        }


#: The offline image tasks, in the order the CLI runs them.
IMAGE_TASKS: tuple[type, ...] = (DigitsZeroShot, DigitsImageClassification, DigitsTextToImageRetrieval)
