"""Small files in each of kaiko-eva's published on-disk layouts, for tests and demos (no package ships the data).

Each builder writes under ``root`` the files eva's dataset class reads (see :mod:`vllm_eval.tasks.eva_data`), with
seeded random content: PatchCamelyon's HDF5 pair per split, PathMMU's ``data.json`` with PNG images, and
``datasets.save_to_disk`` folders for PubMedQA and Quilt-VQA. Plumbing data: the answers mean nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def build_patch_camelyon(root: str | Path, per_class: int = 4, seed: int = 0) -> Path:
    """``camelyonpatch_level_2_split_{valid,test}_{x,y}.h5``: ``x`` (2·per_class, 96, 96, 3) uint8, ``y``
    (2·per_class, 1, 1, 1) uint8 alternating 0/1 (eva's shapes and dtypes). Returns ``root``."""
    import h5py

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n = 2 * per_class
    for split in ("valid", "test"):
        with h5py.File(root / f"camelyonpatch_level_2_split_{split}_x.h5", "w") as fh:
            fh.create_dataset("x", data=rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8))
        with h5py.File(root / f"camelyonpatch_level_2_split_{split}_y.h5", "w") as fh:
            fh.create_dataset("y", data=(np.arange(n) % 2).astype(np.uint8).reshape(n, 1, 1, 1))
    return root


def build_path_mmu_atlas(root: str | Path, n: int = 4, seed: int = 0) -> Path:
    """``path_mmu_hf/data.json`` (``Atlas`` val and test, ``n`` each: options "A) ..." to "D) ...", answers "B) ..."
    as PathMMU writes them) and 64×64 PNGs under ``arch/books_set/images``. Returns ``root``."""
    from PIL import Image

    root = Path(root)
    images = root / "arch" / "books_set" / "images"
    images.mkdir(parents=True, exist_ok=True)
    (root / "path_mmu_hf").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    atlas = {}
    for split in ("val", "test"):
        rows = []
        for i in range(n):
            name = f"{split}-{i}.png"
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(images / name)
            options = [f"{letter}) tissue type {k}" for k, letter in enumerate("ABCD")]
            answer = options[int(rng.integers(0, 4))]
            rows.append(
                {
                    "question": f"Which tissue is shown ({split} {i})?",
                    "options": options,
                    "answer": answer,
                    "source_img": f"books_set/images/{name}",
                    "explanation": "",
                }
            )
        atlas[split] = rows
    (root / "path_mmu_hf" / "data.json").write_text(json.dumps({"Atlas": atlas}))
    return root


def build_pubmedqa(root: str | Path, n: int = 6) -> Path:
    """``<root>/{val,test}``: ``save_to_disk`` folders with PQA-L's columns (QUESTION, CONTEXTS, final_decision,
    LONG_ANSWER, YEAR ...). Returns ``root``."""
    from datasets import Dataset

    root = Path(root)
    decisions = ["no", "yes", "maybe"]
    for split in ("val", "test"):
        Dataset.from_dict(
            {
                "QUESTION": [f"Does treatment {i} help ({split})?" for i in range(n)],
                "CONTEXTS": [[f"Context {i}a.", f"Context {i}b."] for i in range(n)],
                "final_decision": [decisions[i % 3] for i in range(n)],
                "LONG_ANSWER": ["" for _ in range(n)],
                "YEAR": ["2020" for _ in range(n)],
            }
        ).save_to_disk(str(root / split))
    return root


def build_quilt_vqa(root: str | Path, n: int = 4, seed: int = 0) -> Path:
    """``<root>/test``: a ``save_to_disk`` folder with Quilt_VQA's columns (image, question, answer, answer_type,
    context). Returns ``root``."""
    from datasets import Dataset, Features, Image, Value
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    root = Path(root)
    features = Features(
        {
            "image": Image(),
            "question": Value("string"),
            "answer": Value("string"),
            "answer_type": Value("string"),
            "context": Value("string"),
        }
    )
    Dataset.from_dict(
        {
            "image": [PILImage.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in range(n)],
            "question": [f"What is seen in region {i}?" for i in range(n)],
            "answer": [f"tissue {i}" for i in range(n)],
            "answer_type": ["open" for _ in range(n)],
            "context": ["" for _ in range(n)],
        },
        features=features,
    ).save_to_disk(str(root / "test"))
    return root
