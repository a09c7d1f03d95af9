"""One engine for many checkpoints: a vLLM backend's engine (or replicas) handed to the next backend of a model of
the same shape, with the new weights loaded in place, instead of a new engine per model.

Within :func:`engines_kept` (a sweep: :mod:`vllm_eval.api.sweep`), :meth:`VllmBackend.close
<vllm_eval.models.vllm_backend.VllmBackend.close>` parks its engine or replica pool here instead of shutting it down,
and :meth:`VllmBackend.start <vllm_eval.models.vllm_backend.VllmBackend.start>` takes a parked one whose
:func:`reuse_key` matches its own and loads its model's weights into it (vLLM's ``reload_weights``:
:func:`vllm_eval.engine.build.reload_engine`, on every replica through
:func:`vllm_eval.engine.jobs.reload_job`). What is left parked when the block ends is shut down.

Two checkpoints share an engine when everything but their weights is equal: the architecture and every size in
``config.json``, the tokenizer's and sentence-transformers' files, the engine options, the layout and the kind's
setup. Anything else starts a fresh engine, as a single run would.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Files of a checkpoint that hold weights (the part reloaded) or training state (not read by an engine).
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npy")
_TRAINING = ("trainer_state.json", "training_args.bin", "README.md", ".gitattributes")
#: Keys of a JSON file that name where a checkpoint came from, not what it is.
_PROVENANCE = ("_name_or_path", "name_or_path", "transformers_version")


@dataclass
class _Parked:
    key: str
    llm: Any
    pool: Any
    model: str
    #: What the replicas' engines were built with (:attr:`VllmBackend.built_with`).
    built_with: dict[str, Any] | None = None

    def close(self) -> None:
        from ..engine.build import release_engine
        from ..utils import timeline

        with timeline.phase("shutdown"):  # what VllmBackend.close does, deferred to here
            if self.pool is not None:
                self.pool.close()
            if self.llm is not None:
                release_engine(self.llm)


_LOCK = threading.Lock()
#: None outside :func:`engines_kept`; inside, the engines parked by closed backends.
_PARKED: list[_Parked] | None = None
#: Backends that started on a parked engine, their weights reloaded (:func:`note_reload`), in this process.
_RELOADS = 0


def note_reload() -> None:
    """Count a backend that started on a parked engine (its weights loaded in place)."""
    global _RELOADS
    with _LOCK:
        _RELOADS += 1


def reloads() -> int:
    """How many backends started on a parked engine in this process so far."""
    return _RELOADS


@contextmanager
def engines_kept() -> Iterator[None]:
    """Within: closed vLLM backends park their engines for the next backend of the same shape; on exit, what is
    still parked is shut down (also when the block raises)."""
    global _PARKED
    with _LOCK:
        prior, _PARKED = _PARKED, []
    try:
        yield
    finally:
        with _LOCK:
            parked, _PARKED = _PARKED or [], prior
        for entry in parked:
            entry.close()


def keeping() -> bool:
    """Whether closed backends park their engines now (inside :func:`engines_kept`)."""
    return _PARKED is not None


def park(key: str | None, llm: Any, pool: Any, model: str, built_with: dict[str, Any] | None = None) -> bool:
    """Park a closing backend's engine (``llm``) or replicas (``pool``) under ``key``; False (nothing parked: the
    caller shuts them down) outside :func:`engines_kept` or without a key. One engine is kept: a GPU holds one."""
    with _LOCK:
        if _PARKED is None or key is None:
            return False
        previous, _PARKED[:] = list(_PARKED), [_Parked(key, llm, pool, model, built_with)]
    for entry in previous:
        entry.close()
    return True


def take(key: str | None) -> _Parked | None:
    """The parked engine whose key is ``key`` (taken out), else None; a parked engine of another key (or of any,
    with ``key`` None) is shut down first, so the fresh engine the caller starts has the GPU to itself."""
    with _LOCK:
        if not _PARKED:
            return None
        found = [p for p in _PARKED if key is not None and p.key == key]
        others = [p for p in _PARKED if p.key != key]
        _PARKED[:] = []
    for entry in others:
        logger.info("the next model's shape differs from %s's: its engine is shut down", entry.model)
        entry.close()
    return found[0] if found else None


def reuse_key(model: str, engine_kwargs: dict[str, Any], layout: Any, setup: Any) -> str | None:
    """What must be equal for two models to share an engine (a hash), or None where weights cannot be reloaded in
    place: a model that is not a local folder, weights outside its top folder (a sentence-transformers ``Dense``
    module's, which vLLM loads beside the model), none in safetensors or PyTorch format, or engine options that
    change weights on load (``quantization``)."""
    folder = Path(model)
    if not folder.is_dir() or engine_kwargs.get("quantization"):
        return None
    digest = hashlib.sha256()
    weights = False
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        if path.name.endswith(_WEIGHTS):
            if len(relative.parts) > 1:
                return None
            weights |= path.suffix in (".safetensors", ".bin")
            continue
        if path.name in _TRAINING or path.name.endswith(".index.json") or relative.parts[0].startswith("."):
            continue
        digest.update(str(relative).encode() + b"\0" + _content(path) + b"\0")
    if not weights:
        return None
    shape = {
        "files": digest.hexdigest(),
        "engine": json.dumps(engine_kwargs, sort_keys=True, default=repr),
        "layout": layout.as_json() if hasattr(layout, "as_json") else repr(layout),
        "setup": repr(setup),
    }
    return json.dumps(shape, sort_keys=True, default=repr)


def _content(path: Path) -> bytes:
    """A file's bytes for the key; a JSON object's without the keys naming where it came from."""
    data = path.read_bytes()
    if path.suffix != ".json":
        return data
    try:
        parsed = json.loads(data)
    except ValueError:
        return data
    if isinstance(parsed, dict):
        parsed = {k: v for k, v in parsed.items() if k not in _PROVENANCE}
    return json.dumps(parsed, sort_keys=True).encode()


def read_ahead(model: str) -> None:
    """Ask the kernel to read a local model's weight files into the page cache now (``posix_fadvise``
    ``WILLNEED``, which returns at once), so loading them next does not wait on the disk. Best effort."""
    folder = Path(model)
    if not folder.is_dir() or not hasattr(os, "posix_fadvise"):
        return
    for path in folder.iterdir():
        if path.is_file() and path.name.endswith(_WEIGHTS):
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)
            except OSError:
                continue
