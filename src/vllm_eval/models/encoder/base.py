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
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from mteb.models.abs_encoder import AbsEncoder
from mteb.types import PromptType

from ..images import texts_or_images
from ..pooling import TextPoolingBase
from ..prompts import PromptResolver, inputs_from
from ..streaming import BatchTokenizer, flatten, loader_len


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
        """Embed every text, or every image, of an mteb ``DataLoader`` (mteb's ``EncoderProtocol.encode``): a batch
        of ``{"image": [...]}`` (mteb's image tasks) is embedded image by image (an image model: CLIP, SigLIP).

        Returns:
            float32 array of shape (n_texts, dim), rows in input order, normalised as the
            model's pooler config says (or as ``normalize`` was set).

        Raises:
            OptionError: an input that is not a str (named by index), or an image of a bad shape.
            UsageError: a batch of images and texts together (a fused input this encoder does not take).
        """
        # Progress is the backend's own setting: mteb's encode_kwargs show_progress_bar drives mteb's bars.
        show = self.show_progress_bar
        batches = inputs_from(inputs, self.prompting.prefix(task_metadata, prompt_type), self._model_inputs)
        return self._pooled_stream(flatten(batches), total=loader_len(inputs), show_progress_bar=show)

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
        :class:`~vllm_eval.models.images.ImageInput`), or image+text pairs (a fused input; refused here, taken by an
        encoder that prompts a vision-language model).

        Raises:
            UsageError: images with texts.
        """
        from ...utils.errors import UsageError
        from ..images import ImageInput

        if images is None:
            return texts or []
        if texts is not None:
            raise UsageError(f"{self.name} embeds a text or an image, not both in one input (a fused image+text task)")
        return [ImageInput(image) for image in images]

    def _pool_chunk(self, texts: list[str], ids: list[list[int]]) -> np.ndarray:
        return self._embed_chunk(texts, ids)

    def _output_width(self) -> int:
        return self.mteb_model_meta.embed_dim or 0
