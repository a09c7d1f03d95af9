"""Images as model inputs: one normal form (RGB PIL), one pixel digest, and a hashable input for the encoder
stream (deduplicated and cached by its pixels, like a text by its characters)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from .errors import OptionError

__all__ = ["ImageInput", "image_digest", "to_pil"]


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


def image_digest(image: Any) -> str:
    """Hex blake2b (16 bytes) of an image's RGB pixel bytes (what a generator's cache key holds)."""
    return hashlib.blake2b(np.asarray(to_pil(image)).tobytes(), digest_size=16).hexdigest()


class ImageInput:
    """One image of an encoder's input stream: equal (and hashed) by its pixels and size, so repeats are
    embedded once, and keyed in the cache by :meth:`cache_form`.

    Args:
        image: a PIL image or an array (see :func:`to_pil`); kept as RGB.
    """

    __slots__ = ("image", "digest")

    def __init__(self, image: Any) -> None:
        self.image = to_pil(image)
        self.digest = f"{image_digest(self.image)}:{self.image.width}x{self.image.height}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageInput) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"<image {self.digest}>"

    def __getstate__(self) -> tuple[Any, str]:
        return self.image, self.digest

    def __setstate__(self, state: tuple[Any, str]) -> None:
        self.image, self.digest = state

    def cache_form(self) -> dict[str, str]:
        """What the cache keys this input by: its pixel digest and size."""
        return {"image": self.digest}
