"""``VllmGenerator``: chat and vision-language generation through vLLM, deterministic by default.

Messages come from :class:`~vllm_eval.generator.base.GeneratorBase`; they are rendered by the
model's chat template (or an override) through ``LLM.chat``. Log-likelihood scoring
(:meth:`VllmGenerator.loglikelihoods`) follows lm-evaluation-harness: the continuation's tokens are
appended to the rendered context and their log-probabilities read from ``prompt_logprobs``;
nothing is generated or parsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from ..engine import EngineUser, merge_engine_kwargs, raise_on_request_errors
from ..modelinfo import ModelRef
from ..presets import ModelPreset, resolve_preset
from .base import Generation, GeneratorBase, LocalChatTemplate, to_pil


class VllmGenerator(EngineUser, LocalChatTemplate, GeneratorBase):
    """Chat / VLM generation over ``LLM.chat`` (``LLM.generate`` for raw prompts).

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        preset: a registered language/multimodal preset name or :class:`ModelPreset`; when None a
            preset whose pattern matches ``model`` is used.
        chat_template: Jinja chat template overriding the tokenizer's.
        system_prompt: system message; merged into the first user turn when the template has no
            system role (Gemma's raises "System role not supported").
        raw_prompts: send the text as is, without a chat template.
        image_position: ``"before"`` or ``"after"`` the text in the user turn (default: the
            preset's, else before).
        max_images_per_prompt: images one prompt may carry (vLLM's ``limit_mm_per_prompt``);
            set it from the data (tasks do). None means a text-only engine.
        sampling: ``SamplingParams`` overrides of :data:`~vllm_eval.generator.base.DEFAULT_SAMPLING`.
        chunk_size: conversations handed to the engine per call.
        show_progress_bar: progress bar over the samples.
        trust_remote_code: run the model repository's own code (default False).
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``max_model_len`` ...), merged over the
            preset's (``hf_overrides`` key by key).

    Raises:
        UsageError: the model has no chat template and neither ``chat_template`` nor
            ``raw_prompts`` was given; a bad ``image_position``; an unknown preset.
        OptionError: unknown engine or sampling options.
        EngineError: vLLM failed to start.
    """

    supports_loglikelihood: ClassVar[bool] = True
    engine_options: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        model: str | ModelRef,
        revision: str | None = None,
        *,
        preset: str | ModelPreset | None = None,
        chat_template: str | None = None,
        system_prompt: str | None = None,
        raw_prompts: bool = False,
        image_position: Literal["before", "after"] | None = None,
        max_images_per_prompt: int | None = None,
        sampling: dict[str, Any] | None = None,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
        trust_remote_code: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        ref = ModelRef.resolve(model, revision)
        self.preset = p = resolve_preset(ref.path, "generator", preset)
        self.chat_template = chat_template or (p.chat_template if p else None)
        super().__init__(
            model=ref.path,
            model_ref=ref,
            system_prompt=system_prompt if system_prompt is not None else (p.system_prompt if p else None),
            raw_prompts=raw_prompts,
            image_position=image_position or (p.image_position if p else "before"),
            sampling=sampling,
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )
        kwargs = merge_engine_kwargs(
            p.engine_kwargs if p else None,
            engine_kwargs,
            {"revision": revision} if revision is not None else None,
            {"limit_mm_per_prompt": {"image": int(max_images_per_prompt)}} if max_images_per_prompt else None,
        )
        self.engine_kwargs = {"runner": "generate", "trust_remote_code": trust_remote_code, **kwargs}
        self._start_engine(ref)
        with self.closed_on_error():
            self.tokenizer = self.llm.get_tokenizer()
            self._check_template()

    def identity(self) -> dict[str, Any]:
        """The base identity plus the chat template in use and the engine's dtype, quantization and overrides."""
        return {**super().identity(), "chat_template": self._template(), **self.engine_identity()}

    def image_part(self, image: Any) -> dict[str, Any]:
        """One image as an ``image_pil`` content part (vLLM's offline chat accepts PIL images)."""
        return {"type": "image_pil", "image_pil": to_pil(image)}

    # --- generation ---------------------------------------------------------------------------

    def _generate_chunk(self, chunk: list[tuple[str, Sequence[Any]]], offset: int) -> list[Generation]:
        outputs = self._run(chunk)
        raise_on_request_errors(outputs, lambda i: f"sample {offset + i} ({chunk[i][0]!r:.60})")
        results = []
        for out in outputs:
            completion = out.outputs[0]
            prompt = out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids)
            results.append(
                Generation(
                    prompt=prompt,
                    output=completion.text,
                    prompt_tokens=len(out.prompt_token_ids or ()),
                    output_tokens=len(completion.token_ids),
                )
            )
        return results

    def _run(self, chunk: list[tuple[str, Sequence[Any]]]):
        if self.raw_prompts:
            prompts = []
            for text, images in chunk:
                prompt: dict[str, Any] = {"prompt": text}
                if images:
                    prompt["multi_modal_data"] = {"image": [to_pil(im) for im in images]}
                prompts.append(prompt)
            return self.llm.generate(prompts, self.sampling, use_tqdm=False)
        conversations = [self.messages(text, images) for text, images in chunk]
        return self.llm.chat(
            conversations, self.sampling, use_tqdm=False, chat_template=self.chat_template, add_generation_prompt=True
        )

    def _continuation_logprobs(self, token_ids: list[list[int]], starts: list[int], names: list[str]) -> np.ndarray:
        """Read from ``prompt_logprobs`` of the joined ids (one generated token, discarded)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, seed=self.sampling.seed)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=x) for x in token_ids], params, use_tqdm=False)
        raise_on_request_errors(outputs, lambda j: names[j])
        return np.array(
            [
                sum(out.prompt_logprobs[t][ids[t]].logprob for t in range(start, len(ids)))
                for out, ids, start in zip(outputs, token_ids, starts, strict=True)
            ],
            dtype=np.float64,
        )
