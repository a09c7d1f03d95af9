"""``VllmEncoder``: mteb's ``EncoderProtocol`` over vLLM's pooling runner (``embed``).

``mteb.evaluate(VllmEncoder("path/or/org-name"), tasks)`` works unchanged. Compared with mteb's own
``VllmEncoderWrapper`` (mteb/models/vllm_wrapper.py): static prompts reach the model, model metadata
is read offline, ``trust_remote_code`` defaults to False, texts are tokenized in batches (here, or by each replica
for its share of a chunk) and sent as token ids (truncation counted and reported), and the engine is shared and
shut down.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, ClassVar

import numpy as np

from ...engine.args import backend_engine_kwargs
from ...engine.jobs import embed_job, embed_texts_job, encoder_info, submit_embed
from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef, build_model_meta, model_modules
from ..images import ImageInput, cache_form, prompted_inputs
from ..presets import ImagePrompts
from ..prompts import InstructionTemplate, resolve_prompting
from ..streaming import BatchTokenizer
from ..vllm_backend import VllmBackend
from .base import EncoderBase
from .search import CorpusSearch


class VllmEncoder(VllmBackend, CorpusSearch, EncoderBase):
    """mteb ``EncoderProtocol`` over vLLM's pooling runner (``LLM.embed``); retrieval tasks search the corpus
    with :class:`~vllm_eval.models.encoder.search.CorpusSearch` (one stream of encode calls, scored on the GPU).

    Args:
        model: local model directory or hub id; defaults to the packaged all-MiniLM-L6-v2.
        revision: hub revision (also recorded in results).
        preset: an embedding preset name (``"e5"``, see ``vllm-eval models``); when None, a preset
            whose pattern matches ``model`` applies. Its prompts, instruction template and engine
            options fill what is not given here.
        model_name: name recorded in results (``org/name``); read from the files when None.
        prompts, instruction_template, instructions, apply_instruction_to_documents: see
            :mod:`vllm_eval.models.prompts`.
        image_prompts: how a vision-language embedder (a generative VLM pooled at its last token: E5-V,
            VLM2Vec, Qwen-VL embedders) is prompted for a text, an image and an image with text
            (:class:`~vllm_eval.models.presets.ImagePrompts` or a dict of its fields); default: the preset's, else
            ``ImagePrompts()`` (the text as it is, the model's image placeholder, the placeholder then the
            text). Not used by CLIP and SigLIP, which embed an image alone, and an image with text as the sum
            of the two vectors, as mteb's wrappers of them do (see
            :meth:`~vllm_eval.models.encoder.base.EncoderBase.encode`).
        dimensions: matryoshka output width, sent as ``PoolingParams(dimensions=...)``.
        normalize: force L2 normalisation on/off (``PoolingParams.use_activation``); None follows
            the model's pooler config (sentence-transformers ``Normalize`` module); for an image-text model
            (CLIP, SigLIP) without one, None is off, as its reference implementations give raw projections.
        chunk_size: texts tokenized and handed to the engine per step (mteb's ``batch_size`` is
            too small for vLLM's continuous batching and is not used).
        show_progress_bar: progress bar per ``encode`` call.
        pretokenize: send token ids tokenized here (default, faster); False sends text and lets
            vLLM tokenize (its own path, kept for comparison and parity tests). Always token ids for SigLIP,
            whose texts are padded to its 64 positions as it was trained (vLLM does not pad them).
        data_parallel_size: engine replicas over the machine's GPUs (each with
            ``tensor_parallel_size`` GPUs), or over disjoint core sets on the CPU build; chunks are
            spread over them and results kept in input order. See :mod:`vllm_eval.replicas.pool`.
        replicas_per_gpu: engines sharing each GPU (group), for models too small to keep one busy;
            ``gpu_memory_utilization`` is divided among them unless given. Either left out (None): on a GPU
            machine, chosen for the model and the GPUs (:mod:`vllm_eval.replicas.layout`), else 1.
        ray_address: run the ``data_parallel_size`` × ``replicas_per_gpu`` replicas as actors on the Ray
            cluster there (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``); see :mod:`vllm_eval.replicas.ray`.
        device: part of mteb's signature; vLLM's build decides the device.
        trust_remote_code: run the model repository's own code (default False).
        **engine_kwargs: vLLM ``EngineArgs`` by their names (``dtype``, ``max_model_len``,
            ``max_num_seqs``, ``tensor_parallel_size``, ``gpu_memory_utilization``,
            ``enforce_eager``, ``hf_overrides``, ``pooler_config``, ``seed`` ...), plus
            ``head_dtype`` (the pooling head's dtype). CPU defaults come from
            :func:`vllm_eval.engine.build.default_engine_kwargs`.

    Raises:
        ModelNotFoundError: a model path that does not exist.
        OptionError: an unknown engine option or one with a bad value.
        UsageError: ``dimensions`` for a model without matryoshka support, or out of range; more
            replicas than GPUs or cores; an unknown preset.
        EngineError: vLLM failed to start.
        ReplicaError: a replica failed to start (its reason in the message).
    """

    engine_options: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        model: str | ModelRef | None = None,
        revision: str | None = None,
        *,
        preset: Any = None,
        model_name: str | None = None,
        prompts: dict[str, str] | None = None,
        instruction_template: InstructionTemplate | None = None,
        instructions: dict[str, str] | None = None,
        apply_instruction_to_documents: bool = False,
        image_prompts: ImagePrompts | dict[str, str] | None = None,
        dimensions: int | None = None,
        normalize: bool | None = None,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        pretokenize: bool = True,
        data_parallel_size: int | None = None,
        replicas_per_gpu: int | None = None,
        ray_address: str | None = None,
        device: str | None = None,
        trust_remote_code: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        del device  # part of mteb's EncoderProtocol signature; vLLM's build decides the device
        if dimensions is not None and (
            isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
        ):
            raise UsageError(f"dimensions must be a positive int, got {dimensions!r}")
        ref = ModelRef.resolve(model, revision)
        prompting, found = resolve_prompting(
            ref.path,
            "encoder",
            preset=preset,
            prompts=prompts,
            instruction_template=instruction_template,
            instructions=instructions,
            apply_instruction_to_documents=apply_instruction_to_documents,
        )
        self.preset = found
        self.dimensions = dimensions
        self.normalize = normalize
        self.pretokenize = pretokenize
        self.engine_kwargs = backend_engine_kwargs(
            "pooling",
            found.engine_kwargs if found else None,
            engine_kwargs,
            convert="embed",
            trust_remote_code=trust_remote_code,
            revision=revision,
        )
        with self.closed_on_error():
            info = self.start(ref, encoder_info, data_parallel_size, replicas_per_gpu, ray_address)
            self._check_dimensions(ref.path, info)
            self.image_prompts = None
            if info["image_placeholder"] is not None:  # a VLM: every input is a prompt around the placeholder
                self.image_prompts = ImagePrompts.resolve(image_prompts, found)
                self._placeholder = info["image_placeholder"]
            elif info["is_multimodal"]:  # two towers into one space (CLIP, SigLIP): a fused input is a sum
                self.sums_fused = True
                if normalize is None and not _st_normalizes(ref.path):
                    # CLIP-like models give raw projections in transformers, sentence-transformers and mteb's
                    # wrappers; vLLM's embed pooler would L2-normalise them (a linear probe then scores otherwise).
                    self.normalize = False
            max_length = info["max_model_len"]
            if info["pads_text"]:  # vLLM's own text path does not pad: SigLIP's texts go as padded ids
                self.pretokenize = True
            meta = build_model_meta(
                ref,
                revision=revision,
                model_name=model_name,
                embed_dim=dimensions,
                max_model_len=max_length,
                use_instructions=prompting.instruction_template is not None,
                modalities=["text", "image"] if info["is_multimodal"] else None,
            )
            self._engine_facts = {k: info[k] for k in ("dtype", "quantization", "pooler")}
            super().__init__(
                model=ref.path,
                model_ref=ref,
                meta=meta,
                prompting=prompting,
                max_length=max_length,
                tokenizer=BatchTokenizer(
                    info["tokenizer"], max_length, info["do_lower_case"], pad_to_max_length=info["pads_text"]
                ),
                chunk_size=chunk_size,
                show_progress_bar=show_progress_bar,
            )

    def identity(self) -> dict[str, Any]:
        """The base identity plus the engine's dtype, quantization, pooler and overrides, and the
        per-request ``dimensions`` / ``normalize``."""
        facts = self._engine_facts
        return {
            **super().identity(),
            "dtype": facts["dtype"],
            "quantization": facts["quantization"],
            "pooler": facts["pooler"],
            "hf_overrides": self.engine_kwargs.get("hf_overrides"),
            "dimensions": self.dimensions,
            "normalize": self.normalize,
            "image_prompts": vars_of(self.image_prompts),
            "tokenizer": self.tokenizer.fingerprint() if self.tokenizer is not None else None,
        }

    def _tokenized_remotely(self) -> bool:
        # Replicas tokenize their own share of each chunk (embed_texts_job): the process feeding them all does no
        # per-token work. The ids are the ones it would make (the same tokenizer files and settings).
        return self.pool is not None and self.pretokenize

    def _cache_inputs(self, fresh: list[Any], ids: list[list[int]]) -> list[Any]:
        # A text keys its own output (the identity carries the tokenizer's fingerprint): the same key whether the
        # ids were made here or in a replica.
        return [cache_form(x) for x in fresh]

    def _model_inputs(self, texts: list[str] | None, images: list[Any] | None) -> list[Any]:
        """A vision-language embedder's inputs: each text, image or image+text pair in its prompt
        (:class:`~vllm_eval.models.presets.ImagePrompts`); otherwise as
        :class:`~vllm_eval.models.encoder.base.EncoderBase`."""
        if self.image_prompts is None:
            return super()._model_inputs(texts, images)
        return prompted_inputs(self.image_prompts, texts, images, self._placeholder)

    def _check_dimensions(self, model: str, info: dict[str, Any]) -> None:
        if self.dimensions is None:
            return
        if not info["is_matryoshka"]:
            raise UsageError(
                f"model {model!r} does not support matryoshka embeddings, so dimensions="
                f"{self.dimensions} cannot be applied; leave dimensions unset (or, if the model was "
                "trained for it, pass hf_overrides={'matryoshka_dimensions': [...]})"
            )
        allowed = info["matryoshka_dimensions"]
        width = info["embedding_size"]
        if allowed and self.dimensions not in allowed:
            raise UsageError(f"model {model!r} supports dimensions {list(allowed)}, not {self.dimensions}")
        if not 1 <= self.dimensions <= width:
            raise UsageError(f"dimensions must be in [1, {width}] for model {model!r}, got {self.dimensions}")

    def _payload(self, texts: list[Any], ids: list[list[int]]) -> tuple[list[Any], int | None, bool | None]:
        if texts and isinstance(texts[0], ImageInput):  # CLIP, SigLIP: an empty prompt; a VLM: its image prompt
            prompts = [x.engine_prompt() for x in texts]
            return prompts, self.dimensions, self.normalize
        return (ids if self.pretokenize else texts), self.dimensions, self.normalize

    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        return self._submit_chunk(texts, ids).result()

    def _submit_chunk(self, texts: list[str], ids: list[list[int]]) -> Future:
        # Not waited for: with replicas, or the in-process engine's pipeline (submit_embed), the next chunk is
        # prepared and handed over meanwhile.
        if texts and not ids and isinstance(texts[0], str) and self._tokenized_remotely():
            settings = self.tokenizer.settings()
            return self.submit_split(
                embed_texts_job,
                len(texts),
                lambda lo, hi: (texts[lo:hi], self.dimensions, self.normalize, settings),
                lambda i: f"input {texts[i]!r:.80}",
            )
        return self.submit_split(
            embed_job,
            len(texts),
            lambda lo, hi: self._payload(texts[lo:hi], ids[lo:hi]),
            lambda i: f"input {texts[i]!r:.80}",
            pipelined=submit_embed,
        )


def vars_of(recipe: ImagePrompts | None) -> dict[str, Any] | None:
    """A recipe's fields as a dict (what results record), or None."""
    from dataclasses import asdict

    return asdict(recipe) if recipe is not None else None


def _st_normalizes(model: str) -> bool:
    """Whether the model directory's sentence-transformers modules end with ``Normalize``.

    Raises:
        UsageError: a ``modules.json`` that is not a list of modules (:func:`~vllm_eval.utils.modelinfo.model_modules`).
    """
    return any(str(m.get("type") or "").endswith("Normalize") for m in model_modules(model))
