"""Images as model inputs: one normal form (RGB pixels, uint8 (H, W, 3)), one pixel digest, and a hashable input
for the encoder stream (deduplicated and cached by its pixels, like a text by its characters)."""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np

from ..utils.errors import OptionError

__all__ = [
    "FusedInput",
    "ImageInput",
    "cache_form",
    "content_parts",
    "image_data_url",
    "image_digest",
    "prompt_of",
    "prompted_inputs",
    "rgb_pixels",
    "texts_or_images",
    "to_pil",
    "with_prompt",
]


def to_pil(image: Any):
    """A PIL image from a PIL image or an array (H, W) / (H, W, C), uint8 or float in [0, 1].

    Raises:
        OptionError: an array of another shape.
    """
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        arr = np.clip(arr * (255.0 if arr.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    if arr.ndim == 2:
        return Image.fromarray(arr, mode="L").convert("RGB")
    if arr.ndim == 3 and arr.shape[-1] in (1, 3, 4):
        return Image.fromarray(arr.squeeze(-1) if arr.shape[-1] == 1 else arr).convert("RGB")
    raise OptionError(f"image of shape {arr.shape} is neither (H, W) nor (H, W, C)")


def rgb_pixels(image: Any) -> np.ndarray:
    """An image's RGB pixels (anything :func:`to_pil` takes) as a read-only C-contiguous uint8 array (H, W, 3)."""
    pixels = np.ascontiguousarray(np.asarray(to_pil(image)), dtype=np.uint8)
    pixels.setflags(write=False)
    return pixels


def _digest(pixels: np.ndarray) -> str:
    return hashlib.blake2b(pixels.data, digest_size=16).hexdigest()


def image_digest(image: Any) -> str:
    """Hex blake2b (16 bytes) of an image's RGB pixel bytes (what a generator's cache key holds)."""
    return _digest(rgb_pixels(image))


def image_data_url(image: Any) -> str:
    """A PNG ``data:`` URL of an image (anything :func:`to_pil` takes), as OpenAI-style servers take images."""
    import base64
    import io

    buf = io.BytesIO()
    to_pil(image).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class ImageInput:
    """One image of an encoder's input stream, with the prompt it goes with: equal (and hashed) by its pixels,
    size and prompt, so repeats are embedded once, and keyed in the cache by :meth:`cache_form`.

    Held as its RGB pixels (:attr:`pixels`, the array its digest is computed from): that is what crosses a process
    boundary (to a replica or task process) when it is pickled, a copy of the array, where a PIL image pickles
    through ``Image.tobytes`` (2.3x the time for a 224 px image, and on an H200 host the pickling of images in the
    command's process was the longest part of feeding 8 CLIP replicas: py-spy, docs/bench/h200-images).

    Args:
        image: a PIL image or an array (see :func:`to_pil`); kept as RGB.
        prompt: the text prompt sent with it, holding the model's image placeholder (a vision-language
            embedder, see :class:`~vllm_eval.models.presets.ImagePrompts`); empty for CLIP and SigLIP, which take
            an image alone.

    Attributes:
        pixels: uint8 (H, W, 3), read-only.
        digest: hex blake2b of the pixels, then ``:WxH``.
    """

    __slots__ = ("pixels", "digest", "prompt")

    def __init__(self, image: Any, prompt: str = "") -> None:
        self.pixels = rgb_pixels(image)
        height, width = self.pixels.shape[:2]
        self.digest = f"{_digest(self.pixels)}:{width}x{height}"
        self.prompt = prompt

    @property
    def image(self):
        """The image as a new RGB PIL image (built from :attr:`pixels` at each access)."""
        from PIL import Image

        return Image.fromarray(self.pixels)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageInput) and (other.digest, other.prompt) == (self.digest, self.prompt)

    def __hash__(self) -> int:
        return hash((self.digest, self.prompt))

    def __repr__(self) -> str:
        return f"<image {self.digest}{' ' + repr(self.prompt) if self.prompt else ''}>"

    def __getstate__(self) -> tuple[np.ndarray, str, str]:
        return self.pixels, self.digest, self.prompt

    def __setstate__(self, state: tuple[np.ndarray, str, str]) -> None:
        pixels, self.digest, self.prompt = state
        if isinstance(pixels, np.ndarray):
            pixels.setflags(write=False)
        else:  # pickled by an earlier release, which sent the PIL image
            pixels = rgb_pixels(pixels)
        self.pixels = pixels

    def with_prompt(self, prompt: str) -> ImageInput:
        """The same image with another prompt (the pixels are neither copied nor hashed again)."""
        out = ImageInput.__new__(ImageInput)
        out.pixels, out.digest, out.prompt = self.pixels, self.digest, prompt
        return out

    def engine_prompt(self) -> dict[str, Any]:
        """This input as a vLLM prompt: its prompt text with the image as ``multi_modal_data``, and its pixel digest
        as the image's ``multi_modal_uuids`` entry: vLLM then keys its processor cache by that digest instead of
        hashing the pixels again in every replica's front end (about 1 ms of an image's ~3 ms of CPU there for a
        ViT-B/32, py-spy on an H100). vLLM still hashes where processor kwargs change the output."""
        return {
            "prompt": self.prompt,
            "multi_modal_data": {"image": self.image},
            "multi_modal_uuids": {"image": self.digest},
        }

    def cache_form(self) -> dict[str, str]:
        """What the cache keys this input by: its pixel digest and size, and its prompt when it has one."""
        return {"image": self.digest, "prompt": self.prompt} if self.prompt else {"image": self.digest}


class FusedInput(NamedTuple):
    """An image and its text as one input (mteb's fused image+text tasks), for an encoder whose towers embed each
    on its own (CLIP, SigLIP): its vector is the sum of the two (see
    :meth:`~vllm_eval.models.encoder.base.EncoderBase.encode`).

    Attributes:
        text: the text, with the task's prompt when it has one.
        image: the image, without a prompt.
    """

    text: str
    image: ImageInput


def prompt_of(model_input: Any) -> str:
    """The text of a model input: a text itself, an image input its prompt."""
    return model_input.prompt if isinstance(model_input, ImageInput) else model_input


def with_prompt(model_input: Any, text: str) -> Any:
    """``model_input`` with its text replaced: a text becomes ``text``, an image input keeps its image."""
    return model_input.with_prompt(text) if isinstance(model_input, ImageInput) else text


def cache_form(model_input: Any) -> Any:
    """What the cache keys an input by: a text itself, an image input its pixels (and prompt)."""
    return model_input.cache_form() if isinstance(model_input, ImageInput) else model_input


def content_parts(model_input: Any) -> list[dict[str, Any]]:
    """An image input as OpenAI-style content parts for a server: its image as an ``image_url`` part holding a
    PNG data URL, then its prompt as a ``text`` part when it has one. The server puts the model's image
    placeholder in front of the text (vLLM: where the text does not hold one), so a prompt that holds a
    placeholder itself is not for this path."""
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": image_data_url(model_input.image)}}]
    if model_input.prompt:
        parts.append({"type": "text", "text": model_input.prompt})
    return parts


def prompted_inputs(recipe: Any, texts: list[str] | None, images: list[Any] | None, placeholder: str) -> list[Any]:
    """One mteb batch (texts, images, or both: fused) as model inputs in the prompts of ``recipe`` (an
    :class:`~vllm_eval.models.presets.ImagePrompts`): a text as a str, an image (with its text) as an
    :class:`ImageInput`
    holding its prompt.

    Raises:
        UsageError: an image with text when the recipe takes no fused input.
    """
    if images is None:
        return [recipe.format(t, False, placeholder) for t in texts or []]
    if texts is None:
        return [ImageInput(im, recipe.format(None, True, placeholder)) for im in images]
    return [ImageInput(im, recipe.format(t, True, placeholder)) for t, im in zip(texts, images, strict=True)]


def texts_or_images(items: Any) -> list[Any]:
    """``items`` as a list of str and :class:`ImageInput`.

    Raises:
        OptionError: a single str, or an item of another type (named by index).
    """
    from .prompts import check_texts

    if isinstance(items, str):
        return check_texts(items)
    items = list(items)
    for i, x in enumerate(items):
        if not isinstance(x, (str, ImageInput)):
            check_texts(items[i : i + 1], i)  # names the item
    return items
