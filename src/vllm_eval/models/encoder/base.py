"""``EncoderBase``: what every encoder backend shares (mteb's ``EncoderProtocol``).

A backend implements one hook, :meth:`EncoderBase._embed_chunk` (distinct texts in, float32 rows
out), and passes what it knows to the constructor: its mteb metadata, token limit, tokenizer and
prompts. The base does the rest the same way for every backend: prompts and instructions per task,
input checks, deduplication within a call, chunking with the next chunk tokenized while the current
one is embedded, the progress display and the truncation report. This is the one place where inputs
reach a backend, so what sits between (a cache) attaches here once for every backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
from mteb.models.abs_encoder import AbsEncoder
from mteb.types import PromptType

from ..images import texts_or_images
from ..pooling import TextPoolingBase
from ..prompts import PromptResolver, inputs_from
from ..streaming import BatchTokenizer, loader_len


class EncoderBase(AbsEncoder, TextPoolingBase, ABC):
    """Base of the encoder backends: mteb ``encode`` over one hook, :meth:`_embed_chunk`.

    Args:
        model: the resolved model path, hub id or served name (recorded in results).
        meta: mteb ``ModelMeta`` of the model (names the result folder, gives the similarity).
        prompting: the task prompts (see :func:`vllm_eval.models.prompts.resolve_prompting`).
        max_length: token limit including special tokens (None: unknown, e.g. a server that
            does not say).
        tokenizer: a :class:`~vllm_eval.models.streaming.BatchTokenizer`; required when the class
            declares ``tokenizes_locally``.
        chunk_size: texts tokenized and handed to the backend per step.
        show_progress_bar: show a progress bar over each call's texts.

    Raises:
        UsageError: ``chunk_size`` < 1, or no tokenizer for a backend that tokenizes locally.
    """

    kind: ClassVar[str] = "encoder"
    #: A fused image+text input is embedded as the sum of its text's and its image's vectors (a two-tower model,
    #: CLIP or SigLIP, set by the backend once it knows the model); False refuses such inputs.
    sums_fused: bool = False

    def __init__(
        self,
        *,
        model: str,
        meta: Any,
        prompting: PromptResolver,
        max_length: int | None,
        tokenizer: BatchTokenizer | None = None,
        chunk_size: int = 1024,
        show_progress_bar: bool = True,
        model_ref: Any = None,
    ) -> None:
        super().__init__(
            model=model,
            model_ref=model_ref,
            meta=meta,
            prompting=prompting,
            max_length=max_length,
            tokenizer=tokenizer,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )

    @abstractmethod
    def _embed_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        """Embed distinct ``texts`` (with their token ids when :attr:`tokenizes_locally`, else ``[]``).

        Returns:
            float32 array (len(texts), dim), one row per text, in order.
        """

    def encode(
        self,
        inputs: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Embed every text, image, or image with its text, of an mteb ``DataLoader`` (mteb's
        ``EncoderProtocol.encode``): a batch of ``{"image": [...]}`` (mteb's image tasks) is embedded image by image
        (an image model: CLIP, SigLIP); a batch of ``{"text": [...], "image": [...]}`` (a fused task) by a
        two-tower encoder (:attr:`sums_fused`) as each text's vector plus its image's, the vectors this
        encoder gives each alone, summed without normalising again. That is mteb's own fusion for these
        models: ``text_embeddings + image_embeddings`` of the raw ``get_text_features`` and
        ``get_image_features`` in ``CLIPModel.encode`` (mteb/models/model_implementations/clip_models.py)
        and ``SiglipModelWrapper.encode`` (siglip_models.py), which our backends match when ``normalize``
        is left unset (raw projections). Text and image are cached and deduplicated apart.

        Returns:
            float32 array of shape (n_inputs, dim), rows in input order, normalised as the
            model's pooler config says (or as ``normalize`` was set).

        Raises:
            OptionError: an input that is not a str (named by index), or an image of a bad shape.
            UsageError: a batch of images and texts together for an encoder that does not fuse them, or one with
                more texts than images or the reverse.
        """
        # Progress is the backend's own setting: mteb's encode_kwargs show_progress_bar drives mteb's bars.
        show = self.show_progress_bar
        batches = inputs_from(inputs, self.prompting.prefix(task_metadata, prompt_type), self._model_inputs)
        total = loader_len(inputs)
        if total is not None and self.sums_fused and _is_fused(inputs):
            total *= 2  # the stream counts a fused input's text and image apart
        spans: list[tuple[int, int, bool]] = []
        rows = self._pooled_stream(_unfused(batches, spans), total=total, show_progress_bar=show)
        return _summed(rows, spans)

    def encode_texts(self, texts: Sequence[Any], *, show_progress_bar: bool | None = None) -> np.ndarray:
        """Embed ``texts`` exactly as given (no prompt or instruction), float32 (n_texts, dim); items that are
        :class:`~vllm_eval.models.images.ImageInput` are embedded as images (an image model), rows kept in order.

        Raises:
            OptionError: an item that is neither a str nor an image input (named by index).
        """
        items = texts_or_images(texts)
        show = self.show_progress_bar if show_progress_bar is None else show_progress_bar
        return self._pooled_stream(iter(items), total=len(items), show_progress_bar=show)

    def _model_inputs(self, texts: list[str] | None, images: list[Any] | None) -> list[Any]:
        """One batch of mteb inputs as model inputs: texts alone (as they are), images alone (each an
        :class:`~vllm_eval.models.images.ImageInput`), or image+text pairs (each a
        :class:`~vllm_eval.models.images.FusedInput` where :attr:`sums_fused`; a backend that prompts a
        vision-language model overrides this).

        Raises:
            UsageError: images with texts for an encoder that does not fuse them, or a batch with more texts than
                images or the reverse.
        """
        from ...utils.errors import UsageError
        from ..images import FusedInput, ImageInput

        if images is None:
            return texts or []
        if texts is None:
            return [ImageInput(image) for image in images]
        if not self.sums_fused:
            raise UsageError(f"{self.name} embeds a text or an image, not both in one input (a fused image+text task)")
        if len(texts) != len(images):
            raise UsageError(f"a fused image+text batch of {len(texts)} texts and {len(images)} images")
        return [FusedInput(t, ImageInput(im)) for t, im in zip(texts, images, strict=True)]

    def _pool_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        return self._embed_chunk(texts, ids)

    def _output_width(self) -> int:
        return self.mteb_model_meta.embed_dim or 0


def _is_fused(inputs: Any) -> bool:
    """Whether an mteb ``DataLoader``'s rows hold a text and an image each (its dataset's columns say)."""
    features = getattr(getattr(inputs, "dataset", None), "features", None) or {}
    return "text" in features and "image" in features


def _unfused(batches: Iterable[list[Any]], spans: list[tuple[int, int, bool]]) -> Iterator[Any]:
    """The stream's items of each batch of model inputs, recording ``(first row, inputs, fused)`` per batch in
    ``spans``: a fused batch as its texts, then its images (runs of one kind, which the stream chunks whole)."""
    from ..images import FusedInput

    row = 0
    for items in batches:
        fused = bool(items) and isinstance(items[0], FusedInput)
        spans.append((row, len(items), fused))
        if fused:
            yield from (x.text for x in items)
            yield from (x.image for x in items)
        else:
            yield from items
        row += len(items) * (2 if fused else 1)


def _summed(rows: Any, spans: list[tuple[int, int, bool]]) -> Any:
    """One row per input from the stream's rows (see :func:`_unfused`): a fused input's text row plus its
    image row, in float32; the rows themselves when no batch was fused."""
    if not any(fused for _, _, fused in spans):
        return rows
    first = np.concatenate([np.arange(start, start + n) for start, n, _ in spans])
    out = rows[first]
    at, second, done = [], [], 0
    for start, n, fused in spans:
        if fused:
            at.append(np.arange(done, done + n))
            second.append(np.arange(start + n, start + 2 * n))
        done += n
    out[np.concatenate(at)] += rows[np.concatenate(second)]
    return out
