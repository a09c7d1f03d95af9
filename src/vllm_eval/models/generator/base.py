"""``GeneratorBase``: what every generator backend shares — chat messages, sampling defaults, the streamed loop.

The counterpart of kaiko's eva ``VLLMTextModel``/``VLLMMultimodalModel`` wrappers, as one base:
prompts are built as chat messages in one place (:meth:`GeneratorBase.messages`: system prompt,
images before or after the text) and streamed to the backend in chunks with a progress display.
Sampling defaults are the evaluation ones (greedy, ``top_p=1``, fixed seed), each overridable by
its ``SamplingParams`` name. A backend implements :meth:`~GeneratorBase._generate_chunk`,
:meth:`~GeneratorBase.image_part` and :meth:`~GeneratorBase.render`, and declares whether it can
score log-likelihoods (:attr:`~GeneratorBase.supports_loglikelihood`).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from ...utils.errors import OptionError, UsageError
from ...utils.progress import input_bar
from ..base import BackendBase
from ..images import image_digest, to_pil  # noqa: F401  (to_pil: part of this module's API)
from ..streaming import chunked

logger = logging.getLogger(__name__)

#: Evaluation sampling defaults: greedy and reproducible. ``max_tokens`` bounds an answer.
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 256, "seed": 0}


@dataclass(frozen=True)
class Generation:
    """One generated answer: the prompt as rendered for the model, the raw output text, token counts."""

    prompt: str
    output: str
    prompt_tokens: int
    output_tokens: int


def sampling_params(overrides: dict[str, Any] | None = None):
    """``vllm.SamplingParams`` from :data:`DEFAULT_SAMPLING` updated with ``overrides``.

    Raises:
        OptionError: an override that is not a ``SamplingParams`` field (named in the message).
        UsageError: a value vLLM rejects (its reason in the message).
    """
    import inspect

    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError  # not a ValueError from vLLM 0.27 on

    params = {**DEFAULT_SAMPLING, **(overrides or {})}
    known = set(inspect.signature(SamplingParams).parameters) | set(getattr(SamplingParams, "__struct_fields__", ()))
    bad = sorted(set(params) - known)
    if bad:
        raise OptionError(f"unknown SamplingParams option(s): {', '.join(bad)}")
    try:
        return SamplingParams(**params)
    except (ValueError, TypeError, VLLMValidationError) as exc:
        raise UsageError(f"sampling options {overrides}: {' '.join(str(exc).split())}") from None


class GeneratorBase(BackendBase, ABC):
    """Base of the generator backends: the chat messages of a sample, and the streamed generate loop.

    Args:
        model: the resolved model path, hub id or served name.
        system_prompt: system message; merged into the user turn when :attr:`system_role` is off.
        raw_prompts: send the text as is, without a chat template (and so without a system turn).
        image_position: ``"before"`` or ``"after"`` the text in the user turn.
        sampling: ``SamplingParams`` overrides of :data:`DEFAULT_SAMPLING` (validated here).
        chat_template_kwargs: extra variables for the chat template (vLLM's ``LLM.chat`` and
            ``/v1/chat/completions`` name), e.g. ``{"enable_thinking": False}`` for Qwen3.
        think_end_token: for reasoning models, the text that closes the reasoning; tasks read the
            answer after its last occurrence (:func:`~vllm_eval.tasks.multiple_choice.split_reasoning`).
            Only parsing changes: the raw output is generated and cached as before. ``""``: none.
        chunk_size: samples handed to the backend per step.
        show_progress_bar: show a progress bar over the samples.

    Raises:
        UsageError: a bad ``image_position`` or ``chunk_size``, sampling values vLLM rejects, or
            ``chat_template_kwargs`` with raw prompts (no template to take them).
        OptionError: an unknown sampling option; ``chat_template_kwargs`` that is not a dict with
            str keys, or a ``think_end_token`` that is not a str.
    """

    kind: ClassVar[str] = "generator"
    #: The backend can score continuations by log-likelihood (:meth:`loglikelihoods`).
    supports_loglikelihood: ClassVar[bool] = False
    #: The backend takes images in prompts.
    supports_images: ClassVar[bool] = True
    #: A Hugging Face tokenizer, for backends that tokenize here (log-likelihoods need one).
    tokenizer: Any = None

    def __init__(
        self,
        *,
        model: str,
        system_prompt: str | None = None,
        raw_prompts: bool = False,
        image_position: Literal["before", "after"] = "before",
        sampling: dict[str, Any] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        think_end_token: str | None = None,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
        model_ref: Any = None,
    ) -> None:
        if image_position not in ("before", "after"):
            raise UsageError(f"image_position must be 'before' or 'after', got {image_position!r}")
        if chat_template_kwargs is not None and (
            not isinstance(chat_template_kwargs, dict) or not all(isinstance(k, str) for k in chat_template_kwargs)
        ):
            raise OptionError(
                f"chat_template_kwargs must be a dict of template variable names, got {chat_template_kwargs!r}"
            )
        if chat_template_kwargs and raw_prompts:
            raise UsageError("chat_template_kwargs are chat template variables; raw prompts use no template")
        if think_end_token is not None and not isinstance(think_end_token, str):
            raise OptionError(f"think_end_token must be a str, got {think_end_token!r}")
        super().__init__(model=model, chunk_size=chunk_size, show_progress_bar=show_progress_bar, model_ref=model_ref)
        self.system_prompt = system_prompt
        self.raw_prompts = raw_prompts
        #: False when the chat template has no system turn: the system prompt joins the user turn.
        self.system_role = not raw_prompts
        self.image_position = image_position
        self.sampling = sampling_params(sampling)
        self.sampling_overrides = dict(sampling or {})
        self.chat_template_kwargs: dict[str, Any] = dict(chat_template_kwargs or {})
        self.think_end_token = think_end_token or None  # "" turns a preset's off

    @abstractmethod
    def image_part(self, image: Any) -> dict[str, Any]:
        """One image as a chat content part (in-process: ``image_pil``; remote: a data URL)."""

    @abstractmethod
    def render(self, text: str, images: Sequence[Any] = (), **template_kwargs: Any) -> str:
        """The prompt of a sample as recorded in the samples file (images as placeholders or a note);
        ``template_kwargs`` override :attr:`chat_template_kwargs` where the template is applied here."""

    @abstractmethod
    def _generate_chunk(self, chunk: list[tuple[str, Sequence[Any]]], offset: int) -> list[Generation]:
        """One :class:`Generation` per ``(text, images)`` sample of ``chunk`` (``offset``: index of its first)."""

    def _continuation_logprobs(
        self,
        token_ids: list[list[int]],
        starts: list[int],
        names: list[str],
        images: list[Sequence[Any]] | None = None,
    ) -> np.ndarray:
        """The log-likelihood hook: for each sequence, the sum over positions ``t >= starts[i]`` of
        log P(token_ids[i][t] | token_ids[i][:t]), float64 (n,), in nats. ``names`` name the inputs
        in errors. ``images[i]`` (when given) are the images of sequence ``i``, whose context holds
        one placeholder per image for the backend to expand. Backends that declare
        :attr:`supports_loglikelihood` implement it (with images if they declare :attr:`supports_images`)."""
        raise NotImplementedError

    def loglikelihoods(
        self,
        contexts: Sequence[str],
        continuations: Sequence[str],
        images: Sequence[Sequence[Any]] | None = None,
    ) -> np.ndarray:
        """Sum of log P(continuation tokens | rendered context), float64 (n,), in nats.

        As lm-evaluation-harness does it: each context is rendered with the chat template (unless
        ``raw_prompts``), the continuation is tokenized on its own and appended, and the backend
        reads the log-probabilities of the continuation's tokens (:meth:`_continuation_logprobs`);
        nothing is generated or parsed. ``images[i]``, when given, are shown with context ``i``
        (placed as in generation; lmms-eval's vLLM backend scores no images this way). With a cache
        in use, stored scores of the same identity, rendered context, images and continuation are reused.

        Raises:
            UsageError: the backend cannot score log-likelihoods (:attr:`supports_loglikelihood`)
                or show images (:attr:`supports_images`), an empty continuation, mismatched lengths,
                or a chat template that starts the model's reasoning where the option would be read
                (see :meth:`LocalChatTemplate.scoring_template_kwargs`).
        """
        images = self._check_loglikelihood_inputs(contexts, continuations, images)
        shown: Sequence[Sequence[Any]] = images if images is not None else [()] * len(contexts)
        rendered = [self.render_for_scoring(ctx, ims) for ctx, ims in zip(contexts, shown)]
        self._record(zip(contexts, continuations, strict=True))
        inputs: list[list[Any]] = [["loglikelihood", r, c] for r, c in zip(rendered, continuations)]
        if images is not None and self.cache is not None:  # text-only keys stay as they were
            digests: dict[int, list[str]] = {}  # the options of one question share its image list
            for key, ims in zip(inputs, shown):
                if id(ims) not in digests:
                    digests[id(ims)] = self._sample_input("", ims)["images"]
                key.append(digests[id(ims)])
        keys, hits = self._cached(inputs)
        n = len(contexts)
        scores = np.zeros(n, dtype=np.float64)
        started, tokens_before = time.perf_counter(), self.counters.compute_tokens
        self.counters.inputs += n
        self.counters.distinct += n

        def score(positions: list[int]) -> np.ndarray:
            return self._score_options(positions, rendered, contexts, continuations, None if images is None else shown)

        with input_bar("loglikelihood", n, "options", enabled=self.show_progress_bar) as advance:
            for lo in range(0, n, self.chunk_size):
                hi = min(lo + self.chunk_size, n)
                scores[lo:hi] = self._merge_cached(
                    keys[lo:hi],
                    hits,
                    hi - lo,
                    lambda miss, lo=lo: score([lo + j for j in miss]),
                    store=lambda v: np.asarray([v], dtype=np.float64),
                    load=lambda stored: stored[0],
                )
                advance(hi - lo)
        self.counters.add_compute(time.perf_counter() - started)
        self.counters.tokens += self.counters.compute_tokens - tokens_before
        return scores

    def _score_options(
        self,
        positions: list[int],
        rendered: list[str],
        contexts: Sequence[str],
        continuations: Sequence[str],
        shown: Sequence[Sequence[Any]] | None,
    ) -> np.ndarray:
        """Log-likelihoods (float64, nats) of the options at ``positions``: context tokens plus continuation
        tokens through :meth:`_continuation_logprobs`, counted as computed.

        Raises:
            UsageError: an empty continuation, or a context that renders to no tokens.
        """
        token_ids, starts = [], []
        for i in positions:
            ctx_ids = list(self.tokenizer(rendered[i], add_special_tokens=False)["input_ids"])
            cont_ids = list(self.tokenizer(continuations[i], add_special_tokens=False)["input_ids"])
            if not cont_ids:
                raise UsageError(f"continuation {continuations[i]!r} has no tokens")
            if not ctx_ids:  # the first token has no prediction to read
                raise UsageError(f"context {contexts[i]!r:.60} renders to no tokens")
            token_ids.append(ctx_ids + cont_ids)
            starts.append(len(ctx_ids))
            self.counters.compute_tokens += len(ctx_ids) + len(cont_ids)
        names = [f"context {contexts[i]!r:.60}" for i in positions]
        chunk_images = None if shown is None else [shown[i] for i in positions]
        return np.asarray(self._continuation_logprobs(token_ids, starts, names, chunk_images), dtype=np.float64)

    def _generate_counted(self, chunk: list[tuple[str, Sequence[Any]]], offset: int) -> list[Generation]:
        """:meth:`_generate_chunk`, its prompt and output tokens counted as computed."""
        fresh = self._generate_chunk(chunk, offset)
        self.counters.compute_tokens += sum(g.prompt_tokens + g.output_tokens for g in fresh)
        return fresh

    def _check_loglikelihood_inputs(
        self, contexts: Sequence[str], continuations: Sequence[str], images: Sequence[Sequence[Any]] | None
    ) -> Sequence[Sequence[Any]] | None:
        """``images``, or None when no context shows one; raises the UsageErrors of :meth:`loglikelihoods`."""
        if not self.supports_loglikelihood:
            raise UsageError(
                f"{type(self).__name__} cannot score log-likelihoods (exact prompt token log-probabilities "
                "need a local model); use generation scoring"
            )
        if len(contexts) != len(continuations) or (images is not None and len(images) != len(contexts)):
            n_images = "" if images is None else f" and {len(images)} image lists"
            raise UsageError(f"{len(contexts)} contexts but {len(continuations)} continuations{n_images}")
        if images is None or not any(images):
            return None
        if not self.supports_images:
            raise UsageError(f"{type(self).__name__} is text-only; its log-likelihoods cannot show images")
        return images

    def scoring_template_kwargs(self) -> dict[str, Any]:
        """Chat template variables for log-likelihood contexts: :attr:`chat_template_kwargs`, plus what
        keeps the model from starting to reason where the option is read. Backends that render
        prompts here implement the check (:class:`LocalChatTemplate`)."""
        return dict(self.chat_template_kwargs)

    def render_for_scoring(self, text: str, images: Sequence[Any] = ()) -> str:
        """The context as log-likelihood scoring renders it (:meth:`scoring_template_kwargs`)."""
        return self.render(text, images, **self.scoring_template_kwargs())

    def messages(self, text: str, images: Sequence[Any] = (), *, placeholders: bool = False) -> list[dict[str, Any]]:
        """The chat messages for one sample: system prompt (or merged), images, text.

        Images become content parts (:meth:`image_part`, or ``{"type": "image"}`` with
        ``placeholders``: what Hugging Face chat templates render as the model's image token)
        placed before or after the text.

        Raises:
            OptionError: ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise OptionError(f"prompt text must be a str, got {type(text).__name__}")
        if self.system_prompt and not self.system_role:
            text = f"{self.system_prompt}\n\n{text}"
        if images:
            parts: list[dict[str, Any]] = [{"type": "image"} if placeholders else self.image_part(im) for im in images]
            text_part = {"type": "text", "text": text}
            content: Any = parts + [text_part] if self.image_position == "before" else [text_part] + parts
        else:
            content = text
        msgs = [{"role": "user", "content": content}]
        if self.system_prompt and self.system_role:
            msgs.insert(0, {"role": "system", "content": self.system_prompt})
        return msgs

    def identity(self) -> dict[str, Any]:
        """The base identity plus sampling, system prompt (and whether it is a turn of its own),
        raw prompts and image position: what turns a sample into tokens and tokens into an answer."""
        sampling = {k: getattr(self.sampling, k, None) for k in ("temperature", "top_p", "top_k", "max_tokens", "seed")}
        out = {
            **super().identity(),
            "sampling": {**sampling, **self.sampling_overrides},
            "system_prompt": self.system_prompt,
            "system_role": self.system_role,
            "raw_prompts": self.raw_prompts,
            "image_position": self.image_position,
        }
        if self.chat_template_kwargs:  # absent when unused, so earlier runs' cached answers still match
            out["chat_template_kwargs"] = self.chat_template_kwargs
        return out

    @contextmanager
    def sampled(self, overrides: dict[str, Any]) -> Iterator[None]:
        """Generate under ``overrides`` (``SamplingParams`` values over the evaluation defaults) inside the block,
        for callers whose requests each carry their own sampling (lmms-eval's ``gen_kwargs``): the output cache
        keys on the sampling (:meth:`identity`), so its key is re-derived for the block and restored after. One
        block at a time per generator.

        Raises:
            OptionError: a value ``SamplingParams`` refuses.
        """
        kept = self.sampling, self.sampling_overrides
        self.sampling, self.sampling_overrides = sampling_params(overrides), dict(overrides)
        self.use_cache(self.cache)
        try:
            yield
        finally:
            self.sampling, self.sampling_overrides = kept
            self.use_cache(self.cache)

    def deterministic(self) -> bool:
        """Whether a sample's answer is fixed (greedy, or a fixed seed), so it may be cached."""
        return self.sampling.temperature == 0 or self.sampling.seed is not None

    def _sample_input(self, text: str, images: Sequence[Any]) -> dict[str, Any]:
        """A sample as the cache keys it: the text and a digest of each image's pixels."""
        return {"text": text, "images": [image_digest(im) for im in images]}

    def generate(self, samples: Iterable[tuple[str, Sequence[Any]]], total: int | None = None) -> list[Generation]:
        """Generate one answer per ``(text, images)`` sample, in order, in one streamed pass.

        With a cache in use and deterministic sampling, answers stored by an earlier run of the
        same identity are read back instead of generated; new ones are stored per chunk.

        Returns:
            One :class:`Generation` per sample.

        Raises:
            EngineError: the engine failed on a sample (named).
            EndpointError: a server refused a sample (named) or could not be reached.
        """
        results: list[Generation] = []
        use_cache = self.cache is not None and self.deterministic()
        start = time.perf_counter()
        with input_bar("generate", total, "samples", enabled=self.show_progress_bar) as advance:
            for chunk in chunked(samples, self.chunk_size):
                if use_cache:
                    keys, hits = self._cached([self._sample_input(t, ims) for t, ims in chunk])
                else:
                    keys, hits = [], {}
                    self.counters.cache_misses += len(chunk)
                done = self._merge_cached(
                    keys,
                    hits,
                    len(chunk),
                    lambda miss, chunk=chunk: self._generate_counted([chunk[i] for i in miss], len(results) + miss[0]),
                    store=asdict,
                    load=lambda stored: Generation(**stored),
                )
                results.extend(done)
                self.counters.inputs += len(chunk)
                self.counters.distinct += len(chunk)
                self.counters.tokens += sum(g.prompt_tokens + g.output_tokens for g in done)
                advance(len(chunk))
        self.counters.add_compute(time.perf_counter() - start)
        return results


class LocalChatTemplate:
    """Prompt rendering for backends that hold the model's tokenizer (in-process vLLM, transformers):
    the tokenizer's chat template or an override (with ``chat_template_kwargs``), and the check that
    the template exists and whether it takes a system turn (Gemma's raises "System role not
    supported": the system prompt then joins the user turn). Used with :class:`GeneratorBase`; needs
    ``tokenizer``, ``chat_template``, ``chat_template_kwargs``, ``raw_prompts``, ``system_prompt``,
    ``system_role`` and ``think_end_token``."""

    tokenizer: Any
    chat_template: str | None
    chat_template_kwargs: dict[str, Any]
    model: str
    raw_prompts: bool
    system_prompt: str | None
    system_role: bool
    think_end_token: str | None

    def _template(self) -> str | None:
        return self.chat_template or getattr(self.tokenizer, "chat_template", None)

    def _check_template(self) -> None:
        """Raises UsageError when there is no chat template and prompts are not raw."""
        if self.raw_prompts:
            return
        if not self._template():
            raise UsageError(
                f"model {self.model!r} has no chat template; pass chat_template=... (--chat-template) "
                "or raw_prompts=True (--raw-prompts) to send the text as is"
            )
        if self.system_prompt:
            try:
                self.tokenizer.apply_chat_template(
                    [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                    chat_template=self.chat_template,
                    tokenize=False,
                    add_generation_prompt=True,
                    **self.chat_template_kwargs,
                )
            except Exception as exc:  # jinja raise_exception("System role not supported") and kin
                logger.info("chat template rejects a system turn (%s); merging it into the user turn", exc)
                self.system_role = False

    def render(self, text: str, images: Sequence[Any] = (), **template_kwargs: Any) -> str:
        """The text prompt the model sees (chat template applied), one image placeholder per image
        (raw prompts carry their own)."""
        if self.raw_prompts:
            return text
        messages = self.messages(text, images, placeholders=True)  # type: ignore[attr-defined]
        return self._apply_template(messages, **template_kwargs)

    def _apply_template(self, messages: list[dict[str, Any]], **overrides: Any) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=True,
            **{**self.chat_template_kwargs, **overrides},
        )

    def scoring_template_kwargs(self) -> dict[str, Any]:
        """Chat template variables for log-likelihood contexts, worked out once.

        Log-likelihood scoring reads the option right after the prompt, so the prompt must not hand
        over to the model's reasoning. A template whose ``enable_thinking`` switch is on by default
        (rendering differs with it off, as Qwen3's) gets ``enable_thinking=False`` for scoring
        (logged), unless the caller set ``enable_thinking`` itself.

        Raises:
            UsageError: ``enable_thinking`` set on by the caller, or a prompt that still ends with the
                reasoning's opening tag (templates that always think, as DeepSeek-R1's).
        """
        cached = getattr(self, "_scoring_template_kwargs", None)
        if cached is not None:
            return dict(cached)
        kwargs = dict(self.chat_template_kwargs)
        if not self.raw_prompts:
            probe = [{"role": "user", "content": "?"}]
            prompt = self._apply_template(probe)
            off = self._apply_template(probe, enable_thinking=False)
            if prompt != off:
                if "enable_thinking" in kwargs:
                    raise UsageError(
                        "log-likelihood scoring reads the option right after the prompt; with enable_thinking "
                        f"{kwargs['enable_thinking']!r} {self.model!r} starts reasoning there: score by generation"
                    )
                logger.warning(
                    "log-likelihood scoring: %s's chat template starts reasoning by default; contexts are "
                    "rendered with enable_thinking=False so the option is read where the answer begins",
                    self.model,
                )
                kwargs["enable_thinking"] = False
                prompt = off
            opening = reasoning_opening(self.think_end_token)
            if opening and prompt.rstrip().endswith(opening):
                raise UsageError(
                    f"log-likelihood scoring reads the option right after the prompt, but {self.model!r}'s chat "
                    f"template ends it with {opening!r} (the model's reasoning starts there); score by "
                    "generation, or give --raw-prompts / another --chat-template"
                )
        self._scoring_template_kwargs = kwargs
        return dict(kwargs)


def reasoning_opening(think_end_token: str | None) -> str | None:
    """The tag that opens a reasoning block closed by ``think_end_token``: ``"<think>"`` for
    ``"</think>"`` (and when none is set), None for a closing text that is not an XML-style tag."""
    token = think_end_token or "</think>"
    return "<" + token[2:] if token.startswith("</") and len(token) > 3 else None
