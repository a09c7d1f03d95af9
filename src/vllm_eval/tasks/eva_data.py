"""kaiko-eva's pathology datasets read from eva's own on-disk layouts, with eva's prompts and targets.

One reader per layout, each an eva split: ``len()``, ``load_target(i)`` (what eva's samplers read), ``prompt(i)``
(the user message eva renders) and ``images(i)`` (PIL images, as eva hands them to vLLM):

* PatchCamelyon: ``<root>/camelyonpatch_level_2_split_{valid,test}_{x,y}.h5`` (uncompressed; ``x`` (N, 96, 96, 3)
  uint8, ``y`` (N, 1, 1, 1) 0/1), from https://zenodo.org/records/2546921 (CC0).
* PathMMU Atlas: ``<root>/path_mmu_hf/data.json`` (``["Atlas"][split]``: question, options, answer "B) ...",
  source_img) and the ARCH book set's images under ``<root>/arch/`` (CC-BY-ND-4.0 and CC-BY-NC-SA-4.0).
* PubMedQA: ``<root>/<split>``, a ``datasets.save_to_disk`` folder of PQA-L fold 0 (bigbio/pubmed_qa; MIT),
  read by eva's own :class:`eva.language.data.datasets.PubMedQA`.
* Quilt-VQA: ``<root>/test`` (or ``<root>``), a ``save_to_disk`` folder of wisdomik/Quilt_VQA (CC-BY-NC-ND-3.0).

The prompt of each sample is rendered by eva's code: its prompt templates with each dataset class's own render
kwargs, and PathMMU's and Quilt-VQA's ``load_text``/``load_target`` run as eva wrote them
(:mod:`vllm_eval.utils.eva_source` where the class cannot be imported). A missing file is named in one line with
where it comes from, before any engine starts. eva's loguru messages are off unless ``VLLMEVAL_EVA_LOGS`` is set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..utils.errors import DataUnavailableError, UsageError
from ..utils.eva_source import class_attribute, class_function, local_litellm_cost_map

PCAM = "multimodal/data/datasets/multiple_choice/patch_camelyon.py"
PCAM_VISION = "vision/data/datasets/classification/patch_camelyon.py"
PATH_MMU = "multimodal/data/datasets/multiple_choice/path_mmu_atlas.py"
QUILT = "multimodal/data/datasets/free_form/quilt_vqa.py"


def eva_templates() -> Any:
    """``eva.language.prompts.templates`` (imports without torchvision); litellm's cost map is read locally, so
    the import makes no network call."""
    local_litellm_cost_map()
    from eva.language.prompts import templates
    from loguru import logger

    if not os.environ.get("VLLMEVAL_EVA_LOGS"):  # eva's per-answer warnings; samples.jsonl keeps every answer
        logger.disable("eva")

    return templates


def _missing(path: Path, task: str, source: str) -> DataUnavailableError:
    return DataUnavailableError(f"{task}: no {path} (eva's layout: {source})")


class PatchCamelyonSplit:
    """One split of PatchCamelyon in eva's HDF5 layout, prompted as eva's multimodal ``PatchCamelyon``.

    Args:
        root: the folder of the ``.h5`` files. split: ``val`` or ``test`` (``val`` reads the ``valid`` files).
        answer_format: eva's ``ANSWER_FORMAT`` (``json``, ``xml``, ``boxed``, ``raw``).

    Raises:
        DataUnavailableError: a file of the split is missing (named). UsageError: a file that is not eva's layout.
    """

    #: Every image's ``(width, height)`` in eva's layout.
    IMAGE_SIZE = (96, 96)

    @staticmethod
    def check_files(root: str | Path, split: str) -> tuple[Path, Path]:
        """The split's ``x`` and ``y`` files (eva's names), checked to exist.

        Raises:
            DataUnavailableError: one is missing (named, with where it comes from).
        """
        h5_file = class_function(PCAM_VISION, "PatchCamelyon", "_h5_file")
        this = SimpleNamespace(_root=str(root), _split=split)
        x_path, y_path = Path(h5_file(this, "x")), Path(h5_file(this, "y"))
        for path in (x_path, y_path):
            if not path.is_file():
                raise _missing(
                    path, "PatchCamelyon", "the uncompressed HDF5 files of https://zenodo.org/records/2546921"
                )
        return x_path, y_path

    def __init__(self, root: str | Path, split: str, answer_format: str = "json") -> None:
        import h5py

        self.split = split
        self.x_path, y_path = self.check_files(root, split)
        try:
            with h5py.File(y_path, "r") as fh:
                self.targets = [int(v) for v in fh["y"][:].reshape(-1)]
            self._x = h5py.File(self.x_path, "r")["x"]
        except (OSError, KeyError) as exc:
            raise UsageError(f"PatchCamelyon: {y_path} or {self.x_path} is not eva's HDF5 layout ({exc})") from None
        if self._x.shape[0] != len(self.targets) or tuple(self._x.shape[1:]) != (96, 96, 3):
            raise UsageError(
                f"PatchCamelyon: {self.x_path} holds {tuple(self._x.shape)}, not ({len(self.targets)}, 96, 96, 3)"
            )
        template = eva_templates().MultipleChoicePromptTemplate(answer_format=answer_format)
        self.text = template.render(**class_attribute(PCAM, "PatchCamelyon", "_default_render_kwargs"))

    def __len__(self) -> int:
        return len(self.targets)

    def load_target(self, index: int) -> int:
        return self.targets[index]

    def prompt(self, index: int) -> str:
        return self.text

    def images(self, index: int) -> list[Any]:
        from PIL import Image

        return [Image.fromarray(self._x[index])]

    def image_sizes(self, index: int) -> list[tuple[int, int]]:
        """``(width, height)`` of each image of sample ``index``, without decoding it (the layout's)."""
        return [self.IMAGE_SIZE]


class PathMMUAtlasSplit:
    """One split of PathMMU's Atlas subset (``val``, ``test``, ``test_tiny``), prompted by eva's ``PathMMUAtlas``
    code (its option-letter stripping, its template and render kwargs).

    Raises:
        DataUnavailableError: ``data.json`` or an image is missing (named). UsageError: no such split in it.
    """

    #: The images' sizes vary: read from their headers.
    IMAGE_SIZE = None

    @staticmethod
    def check_files(root: str | Path, split: str) -> Path:
        """The dataset's ``data.json``, checked to exist (its images are checked when the split is read).

        Raises:
            DataUnavailableError: it is missing (named, with where it comes from).
        """
        data_json = Path(root) / "path_mmu_hf" / "data.json"
        if not data_json.is_file():
            raise _missing(data_json, "PathMMUAtlas", "data.json of the hub dataset jamessyx/PathMMU")
        return data_json

    def __init__(self, root: str | Path, split: str, answer_format: str = "json") -> None:
        root = Path(root)
        data_json = self.check_files(root, split)
        try:
            atlas = json.loads(data_json.read_text(encoding="utf-8"))["Atlas"]
            samples = atlas[split]
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"PathMMUAtlas: {data_json} has no Atlas split {split!r} ({exc!r})") from None
        self.split, self.arch = split, root / "arch"
        for i, s in enumerate(samples):
            image = self.arch / str(s.get("source_img", "")) if isinstance(s, dict) else None
            if image is None or not image.is_file():
                raise _missing(
                    image or data_json, "PathMMUAtlas", f"image of Atlas {split} sample {i}: the ARCH book set"
                )
        templates = eva_templates()
        self._eva = SimpleNamespace(
            _samples=samples,
            _prompt_template=templates.MultipleChoicePromptTemplate(answer_format=answer_format),
            _prompt_render_kwargs=dict(class_attribute(PATH_MMU, "PathMMUAtlas", "_default_render_kwargs")),
            class_to_idx={c: i for i, c in enumerate("ABCDE")},
            _strip_letter_prefix=class_function(PATH_MMU, "PathMMUAtlas", "_strip_letter_prefix"),
        )
        self._load_text = class_function(PATH_MMU, "PathMMUAtlas", "load_text")
        self._load_target = class_function(PATH_MMU, "PathMMUAtlas", "load_target")

    def __len__(self) -> int:
        return len(self._eva._samples)

    def load_target(self, index: int) -> int:
        try:
            return int(self._load_target(self._eva, index))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise UsageError(f"PathMMUAtlas: Atlas {self.split} sample {index}: {exc}") from None

    def prompt(self, index: int) -> str:
        return str(self._load_text(self._eva, index)[0].content)

    def images(self, index: int) -> list[Any]:
        return [self._open(index, lambda im: im.convert("RGB"))]

    def image_sizes(self, index: int) -> list[tuple[int, int]]:
        """``(width, height)`` of each image of sample ``index``, read from the file's header (PIL opens lazily)."""
        return [self._open(index, lambda im: im.size)]

    def _open(self, index: int, read: Any) -> Any:
        """``read(image)`` of sample ``index``'s image file.

        Raises:
            UsageError: PIL cannot read the file (named, with PIL's reason).
        """
        from .owndata import pil_read

        path = self.arch / self._eva._samples[index]["source_img"]
        return pil_read(path, read, f"PathMMUAtlas: {path}")


class PubMedQASplit:
    """One split of PubMedQA (PQA-L fold 0) through eva's own ``PubMedQA`` dataset class.

    Raises:
        DataUnavailableError: ``<root>/<split>`` is missing.
    """

    IMAGE_SIZE = None

    @staticmethod
    def check_files(root: str | Path, split: str) -> Path:
        """The split's ``save_to_disk`` folder, checked to hold ``dataset_info.json``.

        Raises:
            DataUnavailableError: it does not (named, with where it comes from).
        """
        folder = Path(root) / split
        if not (folder / "dataset_info.json").is_file():
            raise _missing(folder, "PubMedQA", "a datasets.save_to_disk folder of bigbio/pubmed_qa, PQA-L fold 0")
        return folder

    def __init__(self, root: str | Path, split: str, answer_format: str = "json") -> None:
        folder = self.check_files(root, split)
        templates = eva_templates()
        from eva.language.data.datasets import PubMedQA

        self.split = split
        self._eva = PubMedQA(
            root=str(root), split=split, prompt_template=templates.MultipleChoicePromptTemplate(answer_format)
        )
        try:
            self._eva.prepare_data()
        except RuntimeError as exc:
            raise UsageError(f"PubMedQA: {folder}: {' '.join(str(exc).split())}") from None

    def __len__(self) -> int:
        return len(self._eva)

    def load_target(self, index: int) -> int:
        return int(self._eva.load_target(index))

    def prompt(self, index: int) -> str:
        return str(self._eva.load_text(index)[0].content)

    def images(self, index: int) -> list[Any]:
        return []

    def image_sizes(self, index: int) -> list[tuple[int, int]]:
        return []


class QuiltVQASplit:
    """Quilt-VQA's test split (free form), prompted by eva's ``QuiltVQA.load_text`` with its template.

    Raises:
        DataUnavailableError: no ``save_to_disk`` folder at ``<root>/test`` or ``<root>``.
    """

    IMAGE_SIZE = None

    @staticmethod
    def check_files(root: str | Path, split: str = "test") -> Path:
        """The ``save_to_disk`` folder (``<root>/test``, else ``<root>``), checked to hold ``dataset_info.json``.

        Raises:
            DataUnavailableError: it does not (named, with where it comes from).
        """
        root = Path(root)
        folder = root / "test" if (root / "test").exists() else root
        if not (folder / "dataset_info.json").is_file():
            raise _missing(folder, "QuiltVQA", "a datasets.save_to_disk folder of the hub dataset wisdomik/Quilt_VQA")
        return folder

    def __init__(self, root: str | Path, split: str = "test", answer_format: str = "raw") -> None:
        from datasets import load_from_disk

        folder = self.check_files(root, split)
        templates = eva_templates()
        self.split, self.folder = split, folder
        self._eva = SimpleNamespace(
            dataset=load_from_disk(str(folder)),
            prompt_template=class_attribute(QUILT, "QuiltVQA", "_default_prompt_template", {"templates": templates}),
            prompt_render_kwargs=class_attribute(QUILT, "QuiltVQA", "_default_render_kwargs"),
        )
        missing = {"question", "answer", "image"} - set(self._eva.dataset.column_names)
        if missing:
            raise UsageError(f"QuiltVQA: {folder} has no column(s) {', '.join(sorted(missing))}")
        self._load_text = class_function(QUILT, "QuiltVQA", "load_text")
        self._undecoded: Any = None

    def __len__(self) -> int:
        return len(self._eva.dataset)

    def load_target(self, index: int) -> str:
        return str(self._eva.dataset[index]["answer"])

    def prompt(self, index: int) -> str:
        return str(self._load_text(self._eva, index)[0].content)

    def images(self, index: int) -> list[Any]:
        return [self._eva.dataset[index]["image"]]

    def image_sizes(self, index: int) -> list[tuple[int, int]]:
        """``(width, height)`` of each image of sample ``index``, from the image's header where the column is
        ``datasets``' ``Image`` feature (else decoded)."""
        from io import BytesIO

        from .owndata import pil_read

        if self._undecoded is None:
            import datasets

            dataset = self._eva.dataset
            decoded = not isinstance(dataset.features.get("image"), datasets.Image)
            self._undecoded = dataset if decoded else dataset.cast_column("image", datasets.Image(decode=False))
        item = self._undecoded[index]["image"]
        if not isinstance(item, dict):
            return [item.size]
        source = BytesIO(item["bytes"]) if item.get("bytes") else item["path"]
        return [pil_read(source, lambda im: im.size, f"QuiltVQA: {self.folder} row {index}")]
