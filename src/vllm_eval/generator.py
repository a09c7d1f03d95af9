"""``VllmGenerator``: chat and vision-language generation through vLLM, deterministic by default.

The counterpart of kaiko's eva ``VLLMTextModel``/``VLLMMultimodalModel`` wrappers, as one class:
prompts are built as chat messages in one place (:meth:`VllmGenerator.messages`: system prompt,
images before or after the text), rendered by the model's chat template (or an override) through
``LLM.chat``, and streamed to the engine in chunks with a progress bar. Sampling defaults are the
evaluation ones (greedy, ``top_p=1``, fixed seed), each overridable by its ``SamplingParams`` name.

Log-likelihood scoring (:meth:`VllmGenerator.loglikelihoods`) follows lm-evaluation-harness: the
continuation's tokens are appended to the rendered context and their log-probabilities read from
``prompt_logprobs``; nothing is generated or parsed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from .engine import EngineUser, Resource, acquire_engine, merge_engine_kwargs, raise_on_request_errors, resolve_model
from .registry import ModelPreset, find_preset, get_preset

logger = logging.getLogger(__name__)

#: Evaluation sampling defaults: greedy and reproducible. ``max_tokens`` bounds an answer.
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 256, "seed": 0}


@dataclass(frozen=True)
class Generation:
    """One generated answer: the prompt as rendered for the model, and the raw output text."""

    prompt: str
    output: str
    prompt_tokens: int
    output_tokens: int


def sampling_params(overrides: dict[str, Any] | None = None):
    """``vllm.SamplingParams`` from :data:`DEFAULT_SAMPLING` updated with ``overrides``.

    Raises:
        TypeError: an override that is not a ``SamplingParams`` field (named in the message).
    """
    import inspect

    from vllm import SamplingParams

    params = {**DEFAULT_SAMPLING, **(overrides or {})}
    known = set(inspect.signature(SamplingParams).parameters) | set(getattr(SamplingParams, "__struct_fields__", ()))
    bad = sorted(set(params) - known)
    if bad:
        raise TypeError(f"unknown SamplingParams option(s): {', '.join(bad)}")
    return SamplingParams(**params)


def to_pil(image: Any):
    """A PIL image from a PIL image or an array (H, W) / (H, W, C), uint8 or float in [0, 1]."""
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
    raise TypeError(f"image of shape {arr.shape} is neither (H, W) nor (H, W, C)")


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    buf: list[Any] = []
    for item in items:
        buf.append(item)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


class ChatPrompter(Resource):
    """What every generator backend shares: the chat messages of a sample, and the streamed loop.

    Subclasses set ``system_prompt``, ``system_role`` (False: the template has no system turn, so
    the system prompt is merged into the user turn), ``image_position``, ``chunk_size``,
    ``show_progress_bar``, and implement :meth:`image_part` and :meth:`_generate_chunk`.
    """

    system_prompt: str | None = None
    system_role: bool = True
    image_position: str = "before"
    chunk_size: int = 256
    show_progress_bar: bool = True

    def image_part(self, image: Any) -> dict[str, Any]:
        """One image as a chat content part (in-process: ``image_pil``; remote: a data URL)."""
        return {"type": "image_pil", "image_pil": to_pil(image)}

    def messages(self, text: str, images: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """The chat messages for one sample: system prompt (or merged), images, text.

        Images become content parts (:meth:`image_part`) placed before or after the text.

        Raises:
            TypeError: ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f"prompt text must be a str, got {type(text).__name__}")
        if self.system_prompt and not self.system_role:
            text = f"{self.system_prompt}\n\n{text}"
        if images:
            parts: list[dict[str, Any]] = [self.image_part(im) for im in images]
            text_part = {"type": "text", "text": text}
            content: Any = parts + [text_part] if self.image_position == "before" else [text_part] + parts
        else:
            content = text
        msgs = [{"role": "user", "content": content}]
        if self.system_prompt and self.system_role:
            msgs.insert(0, {"role": "system", "content": self.system_prompt})
        return msgs

    def generate(self, samples: Iterable[tuple[str, Sequence[Any]]], total: int | None = None) -> list[Generation]:
        """Generate one answer per ``(text, images)`` sample, in order, in one streamed pass.

        Returns:
            One :class:`Generation` per sample.
        """
        results: list[Generation] = []
        with tqdm(total=total, desc="generate", unit="sample", disable=not self.show_progress_bar) as bar:
            for chunk in _chunks(samples, self.chunk_size):
                results.extend(self._generate_chunk(chunk, len(results)))
                bar.update(len(chunk))
        return results

    def _generate_chunk(self, chunk: list[tuple[str, Sequence[Any]]], offset: int) -> list[Generation]:  # pragma: no cover
        raise NotImplementedError


class VllmGenerator(EngineUser, ChatPrompter):
    """Chat / VLM generation over ``LLM.chat`` (``LLM.generate`` for raw prompts).

    Args:
        model: local model directory or hub id.
        preset: a registered language/multimodal preset name or :class:`ModelPreset`; when None a
            preset whose pattern matches ``model`` is used.
        chat_template: Jinja chat template overriding the tokenizer's.
        system_prompt: system message; merged into the first user turn when the template has no
            system role (Gemma's raises "System role not supported").
        raw_prompts: send the text as is, without a chat template.
        image_position: ``"before"`` or ``"after"`` the text in the user turn.
        max_images_per_prompt: images one prompt may carry (vLLM's ``limit_mm_per_prompt``);
            set it from the data (tasks do). None means a text-only engine.
        sampling: ``SamplingParams`` overrides of :data:`DEFAULT_SAMPLING`.
        chunk_size: conversations handed to the engine per call.
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``max_model_len`` ...), merged over the
            preset's (``hf_overrides`` key by key).

    Raises:
        ValueError: the model has no chat template and neither ``chat_template`` nor
            ``raw_prompts`` was given; a bad ``image_position``.
        TypeError: unknown engine or sampling options.
    """

    def __init__(
        self,
        model: str,
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
        self.model = resolve_model(model)
        if isinstance(preset, str):
            preset = get_preset(preset)
        self.preset = preset or find_preset(model, "language") or find_preset(model, "multimodal")
        p = self.preset
        self.chat_template = chat_template or (p.chat_template if p else None)
        self.system_prompt = system_prompt if system_prompt is not None else (p.system_prompt if p else None)
        self.image_position = image_position or (p.image_position if p else "before")
        if self.image_position not in ("before", "after"):
            raise ValueError(f"image_position must be 'before' or 'after', got {self.image_position!r}")
        self.raw_prompts = raw_prompts
        self.sampling = sampling_params(sampling)
        self.sampling_overrides = dict(sampling or {})
        self.chunk_size = int(chunk_size)
        self.show_progress_bar = show_progress_bar
        kwargs = merge_engine_kwargs(
            p.engine_kwargs if p else None,
            engine_kwargs,
            {"revision": revision} if revision is not None else None,
            {"limit_mm_per_prompt": {"image": int(max_images_per_prompt)}} if max_images_per_prompt else None,
        )
        self.engine_kwargs = {"runner": "generate", "trust_remote_code": trust_remote_code, **kwargs}
        self.llm = acquire_engine(self.model, **self.engine_kwargs)
        try:
            self.tokenizer = self.llm.get_tokenizer()
            self._check_template()
        except BaseException:
            self.close()
            raise

    # --- prompt formatting: the one place -----------------------------------------------------

    def _template(self) -> str | None:
        return self.chat_template or getattr(self.tokenizer, "chat_template", None)

    def _check_template(self) -> None:
        if self.raw_prompts:
            self.system_role = False
            return
        if not self._template():
            raise ValueError(
                f"model {self.model!r} has no chat template; pass chat_template=... (--chat-template) "
                "or raw_prompts=True (--raw-prompts) to send the text as is"
            )
        self.system_role = True
        if self.system_prompt:
            try:
                self.tokenizer.apply_chat_template(
                    [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                    chat_template=self.chat_template, tokenize=False, add_generation_prompt=True,
                )
            except Exception as exc:  # jinja raise_exception("System role not supported") and kin
                logger.info("chat template rejects a system turn (%s); merging it into the user turn", exc)
                self.system_role = False

    def render(self, text: str) -> str:
        """The text prompt the model sees for a text-only sample (chat template applied)."""
        if self.raw_prompts:
            return text
        return self.tokenizer.apply_chat_template(
            self.messages(text), chat_template=self.chat_template, tokenize=False, add_generation_prompt=True
        )

    # --- generation ---------------------------------------------------------------------------

    def _generate_chunk(self, chunk: list[tuple[str, Sequence[Any]]], offset: int) -> list[Generation]:
        outputs = self._run(chunk)
        raise_on_request_errors(outputs, lambda i: f"sample {offset + i} ({chunk[i][0]!r:.60})")
        results = []
        for out in outputs:
            completion = out.outputs[0]
            prompt = out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids)
            results.append(Generation(prompt=prompt, output=completion.text,
                                      prompt_tokens=len(out.prompt_token_ids or ()),
                                      output_tokens=len(completion.token_ids)))
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
        return self.llm.chat(conversations, self.sampling, use_tqdm=False, chat_template=self.chat_template,
                             add_generation_prompt=True)

    def loglikelihoods(self, contexts: Sequence[str], continuations: Sequence[str]) -> np.ndarray:
        """Sum of log P(continuation tokens | rendered context), float64 (n,), in nats.

        Each context is rendered with the chat template (unless ``raw_prompts``), the continuation
        is tokenized on its own and appended (as lm-evaluation-harness does), and the engine is
        asked only for ``prompt_logprobs`` of the joined ids (one generated token, discarded).

        Raises:
            ValueError: an empty continuation or mismatched lengths.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if len(contexts) != len(continuations):
            raise ValueError(f"{len(contexts)} contexts but {len(continuations)} continuations")
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, seed=self.sampling.seed)
        out_scores: list[float] = []
        pairs = list(zip(contexts, continuations))
        with tqdm(total=len(pairs), desc="loglikelihood", unit="option", disable=not self.show_progress_bar) as bar:
            for chunk in _chunks(pairs, self.chunk_size):
                prompts, spans = [], []
                for ctx, cont in chunk:
                    ctx_ids = self.tokenizer(self.render(ctx), add_special_tokens=False)["input_ids"]
                    cont_ids = self.tokenizer(cont, add_special_tokens=False)["input_ids"]
                    if not cont_ids:
                        raise ValueError(f"continuation {cont!r} has no tokens")
                    prompts.append(TokensPrompt(prompt_token_ids=list(ctx_ids) + list(cont_ids)))
                    spans.append((len(ctx_ids), list(cont_ids)))
                for out, (start, cont_ids) in zip(self.llm.generate(prompts, params, use_tqdm=False), spans):
                    total = 0.0
                    for pos, tok in enumerate(cont_ids, start=start):
                        total += out.prompt_logprobs[pos][tok].logprob
                    out_scores.append(total)
                bar.update(len(chunk))
        return np.asarray(out_scores, dtype=np.float64)

