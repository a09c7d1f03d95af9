"""``VllmVLM``: this project's engine as lm-evaluation-harness's vision-language model (``MULTIMODAL``).

lm-eval 0.4.13 sends a task with images (a YAML with ``doc_to_image``) only to a model class that says
``MULTIMODAL = True``; its own are ``hf-multimodal`` and ``vllm-vlm`` (``lm_eval/models/vllm_vlms.py``,
``VLLM_VLM``). :class:`VllmVLM` is :class:`~vllm_eval.models.generator.lmeval.VllmLM` with ``VLLM_VLM``'s request
handling: its ``generate_until`` (images resized as its ``image_width``/``image_height``/``image_max_side`` say,
``<image>`` placeholders, the processor's chat template), whose engine call runs here on the generator's engine
or replicas, each answer cached under its prompt, its images' pixels and its sampling settings. As lm-eval's
``vllm-vlm``, images reach ``generate_until`` only (a ``loglikelihood`` request's images are not scored there
either); text-only requests are :class:`VllmLM`'s.
"""

from __future__ import annotations

from typing import Any

from ...utils.errors import UsageError
from ..images import image_digest
from .lmeval import VllmLM, _vllm_metadata

with _vllm_metadata():
    from lm_eval.models.vllm_vlms import VLLM_VLM


class VllmVLM(VllmLM, VLLM_VLM):
    """:class:`VllmLM` for tasks with images: ``lm_eval.simple_evaluate(model=VllmVLM(...))``, or
    ``lm_eval --model vllm-eval-vlm`` once ``vllm_eval`` is imported.

    Args:
        pretrained, generator, and the rest: as :class:`VllmLM` (the model must take images: vLLM loads it
            multimodal).
        interleave, max_images, image_width, image_height, image_max_side: as lm-eval's ``vllm-vlm``
            (``max_images``: images per prompt kept; the sizes: each image resized to them before it is sent).

    Raises:
        UsageError: a model vLLM loads as text-only; both ``image_max_side`` and a width or height.
    """

    MULTIMODAL = True
    # VllmLM's chat rendering is the tokenizer's; a vision model's is its processor's, as lm-eval's vllm-vlm renders
    apply_chat_template = VLLM_VLM.apply_chat_template

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        interleave: bool = True,
        max_images: int = 999,
        image_width: int | None = None,
        image_height: int | None = None,
        image_max_side: int | None = None,
        **kwargs: Any,
    ) -> None:
        if image_max_side and (image_width or image_height):
            raise UsageError("give image_max_side or image_width/image_height, not both (lm-eval's rule)")
        super().__init__(pretrained, **kwargs)
        if not self.generator._multimodal:
            self.close()
            raise UsageError(f"model {self.generator.model!r} takes no images (vLLM loads it as a text-only model)")
        from transformers import AutoProcessor

        ref = self.generator.model_ref
        trust = bool(self.generator.engine_kwargs.get("trust_remote_code", False))
        self.processor = AutoProcessor.from_pretrained(ref.path, revision=ref.revision, trust_remote_code=trust)
        self.interleave, self.max_images = interleave, max_images
        self.image_width, self.image_height, self.image_max_side = image_width, image_height, image_max_side
        self.chat_applied = False

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """lm-eval's ``vllm-vlm`` ``generate_until`` for requests with images; :class:`VllmLM`'s for the others."""
        if requests and len(requests[0].args) >= 3:
            return VLLM_VLM.generate_until(self, requests, disable_tqdm=True)
        return VllmLM.generate_until(self, requests, disable_tqdm=disable_tqdm)

    def _multimodal_model_generate(
        self,
        requests: list[Any] | None = None,
        generate: bool = False,
        max_tokens: int | None = None,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """``VLLM_VLM``'s engine call (prompts with ``multi_modal_data``, its ``SamplingParams``) on the generator's
        engine or replicas, through :meth:`VllmLM._generate_cached` (chunks, the output cache) keyed on each prompt
        and its images' pixels."""
        from vllm import SamplingParams

        if not requests:
            return []
        if not generate:  # VLLM_VLM asks only for generations; its prompt log-probabilities, uncached
            params = SamplingParams(temperature=0, prompt_logprobs=1, max_tokens=1, detokenize=False)
            return self.generator._call("generate", requests, params, "a prompt", lambda k: f"prompt {k} with images")
        params = SamplingParams(max_tokens=max_tokens, stop=stop, **kwargs)
        keyed = [
            ["lm-eval generate images", r["prompt"], [image_digest(im) for im in r["multi_modal_data"]["image"]]]
            for r in requests
        ]
        return self._generate_cached(requests, [params] * len(requests), keyed, lambda i: f"prompt {i} with images")
