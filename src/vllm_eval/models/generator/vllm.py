"""``VllmGenerator``: chat and vision-language generation through vLLM, deterministic by default.

Messages come from :class:`~vllm_eval.models.generator.base.GeneratorBase`; they are rendered by the
model's chat template (or an override) through ``LLM.chat``. Log-likelihood scoring
(:meth:`VllmGenerator.loglikelihoods`) follows lm-evaluation-harness: the continuation's tokens are
appended to the rendered context and their log-probabilities read from ``prompt_logprobs``;
nothing is generated or parsed. One-token options of one context are scored in one request
(``logprob_token_ids`` at the first generated position), so the context is computed once.

With ``data_parallel_size`` / ``replicas_per_gpu``, every engine call (``LLM.chat``,
``LLM.generate``) is split over engine replicas (:mod:`vllm_eval.replicas.pool`) and the outputs joined in
order; prompts are rendered, tokenized and parsed here, once, as with one engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from ...engine.args import backend_engine_kwargs
from ...engine.forced import forced_engine_kwargs, forced_params, forced_score, split_forced
from ...engine.jobs import call_job, generator_info, submit_generate
from ...utils.errors import UsageError
from ...utils.modelinfo import ModelRef
from ..presets import ModelPreset, resolve_preset
from ..vllm_backend import VllmBackend
from .base import Generation, GeneratorBase, LocalChatTemplate, to_pil

#: vLLM's bound on ``SamplingParams.logprob_token_ids`` (``MAX_LOGPROB_TOKEN_IDS``, 128 in 0.26 and 0.32).
_MAX_SCORED_TOKENS = 128


class VllmGenerator(VllmBackend, LocalChatTemplate, GeneratorBase):
    """Chat / VLM generation over ``LLM.chat`` (``LLM.generate`` for raw prompts).

    Args:
        model: local model directory or hub id.
        revision: hub revision.
        preset: a registered language/multimodal preset name or :class:`ModelPreset`; when None a
            preset whose pattern matches ``model`` is used.
        chat_template: Jinja chat template overriding the tokenizer's.
        chat_template_kwargs: extra chat template variables (``LLM.chat``'s ``chat_template_kwargs``),
            over the preset's.
        think_end_token: the text closing a reasoning model's reasoning (default: the preset's; ``""``
            turns a preset's off).
        system_prompt: system message; merged into the first user turn when the template has no
            system role (Gemma's raises "System role not supported").
        raw_prompts: send the text as is, without a chat template.
        image_position: ``"before"`` or ``"after"`` the text in the user turn (default: the
            preset's, else before).
        max_images_per_prompt: images one prompt may carry (vLLM's ``limit_mm_per_prompt``);
            set it from the data (tasks do). None means a text-only engine.
        largest_image: ``(width, height)`` in pixels that no image of the run exceeds, known from the data before
            the engine starts (eva's tasks): see :func:`image_limits`.
        data_parallel_size: engine replicas over the machine's GPUs (each with
            ``tensor_parallel_size`` GPUs; on the CPU build, over disjoint core sets); each chunk of
            samples is split over them. See :mod:`vllm_eval.replicas.pool`.
        replicas_per_gpu: engines sharing each GPU (group), for models too small to keep one busy. Either left
            out (None): on a GPU machine every GPU is used (:mod:`vllm_eval.replicas.layout`), else 1.
        ray_address: the replicas as actors on this Ray cluster (see :mod:`vllm_eval.replicas.ray`).
        forced_decoding: start the engine able to decode given tokens (:mod:`vllm_eval.engine.forced`), so that
            continuations of several tokens are scored after a context the prefix cache serves (default True).
        sampling: ``SamplingParams`` overrides of :data:`~vllm_eval.models.generator.base.DEFAULT_SAMPLING`.
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
        ReplicaError: a replica failed to start (its reason in the message).
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
        chat_template_kwargs: dict[str, Any] | None = None,
        think_end_token: str | None = None,
        system_prompt: str | None = None,
        raw_prompts: bool = False,
        image_position: Literal["before", "after"] | None = None,
        max_images_per_prompt: int | None = None,
        largest_image: tuple[int, int] | None = None,
        sampling: dict[str, Any] | None = None,
        chunk_size: int = 256,
        show_progress_bar: bool = True,
        trust_remote_code: bool = False,
        data_parallel_size: int | None = None,
        replicas_per_gpu: int | None = None,
        ray_address: str | None = None,
        forced_decoding: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        ref = ModelRef.resolve(model, revision)
        #: how the engine forces a continuation's tokens (:mod:`vllm_eval.engine.forced`), None where it cannot
        self.forced, forcing = forced_engine_kwargs() if forced_decoding else (None, {})
        if forcing.get("logits_processors") and engine_kwargs.get("logits_processors"):  # the user's run as well
            forcing = {"logits_processors": [*engine_kwargs.pop("logits_processors"), *forcing["logits_processors"]]}
        self.preset = p = resolve_preset(ref.path, "generator", preset)
        self.chat_template = chat_template or (p.chat_template if p else None)
        super().__init__(
            model=ref.path,
            model_ref=ref,
            system_prompt=system_prompt if system_prompt is not None else (p.system_prompt if p else None),
            raw_prompts=raw_prompts,
            image_position=image_position or (p.image_position if p else "before"),
            sampling=sampling,
            chat_template_kwargs=_over(p.chat_template_kwargs if p and not raw_prompts else None, chat_template_kwargs),
            think_end_token=think_end_token if think_end_token is not None else (p.think_end_token if p else None),
            chunk_size=chunk_size,
            show_progress_bar=show_progress_bar,
        )
        self.engine_kwargs = backend_engine_kwargs(
            "generate",
            p.engine_kwargs if p else None,
            forcing,
            image_limits(max_images_per_prompt, largest_image),
            engine_kwargs,
            trust_remote_code=trust_remote_code,
            revision=revision,
        )
        with self.closed_on_error():
            info = self.start(ref, generator_info, data_parallel_size, replicas_per_gpu, ray_address)
            self.tokenizer = info["tokenizer"]
            self._max_model_len, self._multimodal = info["max_model_len"], info["is_multimodal"]
            #: the chat template vLLM resolves for the model (what lm-eval's vLLM backend renders with), or None
            self.hf_chat_template = info.get("hf_chat_template")
            self._check_template()

    def identity(self) -> dict[str, Any]:
        """The base identity plus the chat template in use and the engine's dtype, quantization and overrides."""
        return {**super().identity(), "chat_template": self._template(), **self.engine_identity()}

    def image_part(self, image: Any) -> dict[str, Any]:
        """One image as an ``image_pil`` content part (vLLM's offline chat accepts PIL images)."""
        return {"type": "image_pil", "image_pil": to_pil(image)}

    # --- generation ---------------------------------------------------------------------------

    def _generate_chunk(self, chunk: list[tuple[str, Sequence[Any]]], offset: int) -> list[Generation]:
        outputs = self._run(chunk, lambda i: f"sample {offset + i} ({chunk[i][0]!r:.60})")
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

    def _call(self, method: str, prompts: list[Any], params: Any, what: str, describe: Any, **kwargs: Any) -> list[Any]:
        """``LLM.<method>(prompts, params, use_tqdm=False, **kwargs)`` on the engine, or split in order over
        the replicas (``params`` a list aligned with ``prompts``, or one for all).

        Raises:
            UsageError: vLLM refused a request before it ran (``what`` names it).
            EngineError: vLLM failed on a request (``describe(i)`` names it).
            ReplicaError: a replica failed on the job.
        """
        return self.run_split(
            call_job,
            len(prompts),
            lambda lo, hi: (
                method,
                prompts[lo:hi],
                params[lo:hi] if isinstance(params, list) else params,
                what,
                kwargs,
            ),
            describe,
        )

    def _submit_generate(self, prompts: list[Any], params: Any, what: str, describe: Any) -> Any:
        """``LLM.generate(prompts, params)`` started and not waited for: a future of the outputs in order. On the
        in-process engine the requests go into its pipeline (:func:`~vllm_eval.engine.jobs.submit_generate`), so
        those of a later call are in the engine's batch while this call's last ones finish; with replicas, each
        replica's part is queued behind its earlier ones. Raises as :meth:`_call` (from the future)."""
        return self.submit_split(
            call_job,
            len(prompts),
            lambda lo, hi: (
                "generate",
                prompts[lo:hi],
                params[lo:hi] if isinstance(params, list) else params,
                what,
                {},
            ),
            describe,
            pipelined=submit_generate,
        )

    def _check_images(self, images: Sequence[Sequence[Any]]) -> None:
        """Raises UsageError when images are sent to a model vLLM loaded as text-only."""
        if any(images) and not self._multimodal:
            raise UsageError(f"model {self.model!r} takes no images (vLLM loads it as a text-only model)")

    def _run(self, chunk: list[tuple[str, Sequence[Any]]], describe: Any):
        self._check_images([images for _, images in chunk])
        if self.raw_prompts:
            prompts = []
            for text, images in chunk:
                prompt: dict[str, Any] = {"prompt": text}
                if images:
                    prompt["multi_modal_data"] = {"image": [to_pil(im) for im in images]}
                prompts.append(prompt)
            return self._call("generate", prompts, self.sampling, "a prompt", describe)
        conversations = [self.messages(text, images) for text, images in chunk]
        return self._call(
            "chat",
            conversations,
            self.sampling,
            "a prompt",
            describe,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs or None,
            add_generation_prompt=True,
        )

    def _check_lengths(self, token_ids: list[list[int]], names: list[str]) -> None:
        """Raises UsageError naming the first sequence with no position left for the generated token."""
        limit = self._max_model_len
        for ids, name in zip(token_ids, names, strict=True):
            if len(ids) >= limit:
                raise UsageError(
                    f"{name} and its continuation are {len(ids)} tokens; the engine's max_model_len is {limit} "
                    "(raise --max-model-len, or shorten the context)"
                )

    @staticmethod
    def _token_prompt(ids: Sequence[int], images: list[Any]) -> Any:
        """A ``TokensPrompt``; with images, vLLM expands their placeholders in ``ids``."""
        from vllm.inputs import TokensPrompt

        if not images:
            return TokensPrompt(prompt_token_ids=list(ids))
        return TokensPrompt(prompt_token_ids=list(ids), multi_modal_data={"image": images})

    #: Score one-token continuations of one context in one request (see :meth:`_continuation_logprobs`).
    shared_context_scoring: bool = True

    def _continuation_logprobs(
        self,
        token_ids: list[list[int]],
        starts: list[int],
        names: list[str],
        images: list[Sequence[Any]] | None = None,
    ) -> np.ndarray:
        """Log-probabilities of each continuation, read from the engine (nats, float64).

        Options whose continuation is one token (answer letters, ``yes``/``no``, short labels) are
        grouped by context: one request per context, the context as its prompt, asks for the
        log-probabilities of exactly those tokens at the first generated position
        (``SamplingParams.logprob_token_ids``, raw log-softmax of the logits). The context is computed
        once instead of once per option, and without ``prompt_logprobs`` the request may reuse the
        prefix cache (a few-shot prefix shared by every question). Longer continuations are appended
        to the context and read from ``prompt_logprobs`` (lm-evaluation-harness's way).

        With ``images``, each request carries its images (``multi_modal_data``) and vLLM expands the
        context's placeholders into image tokens; the continuation's positions are counted from the
        end of the expanded prompt. Options group only with options of the same image objects.
        """
        from vllm import SamplingParams

        self._check_lengths(token_ids, names)
        scores = np.zeros(len(token_ids), dtype=np.float64)
        shown: list[Sequence[Any]] = list(images) if images is not None else [()] * len(token_ids)
        self._check_images(shown)
        pil: dict[int, Any] = {}  # one conversion per image object, shared by the options that show it

        def prompt(ids: Sequence[int], j: int) -> Any:
            for im in shown[j]:
                if id(im) not in pil:
                    pil[id(im)] = to_pil(im)
            return self._token_prompt(ids, [pil[id(im)] for im in shown[j]])

        # The key holds the image objects' ids: the caller keeps them alive, and equal pixels in two
        # objects only cost a second request.
        keys = [(tuple(ids[:start]), tuple(map(id, shown[j]))) for j, (ids, start) in enumerate(zip(token_ids, starts))]
        groups, rest = one_token_groups(token_ids, starts, keys, enabled=self.shared_context_scoring)
        seed = self.sampling.seed
        if groups:
            contexts = list(groups)
            params = [one_token_params(token_ids, groups[ctx], seed=seed) for ctx in contexts]
            outputs = self._call(
                "generate",
                [prompt(ctx[0], groups[ctx][0]) for ctx in contexts],
                params,
                "a context",
                lambda k: names[groups[contexts[k]][0]],
            )
            for ctx, out in zip(contexts, outputs, strict=True):
                first = out.outputs[0].logprobs[0]
                for j in groups[ctx]:
                    scores[j] = first[token_ids[j][-1]].logprob
        # several tokens after a context, no images: decoded after the context (the prefix cache serves it)
        mode = self.forced if self.shared_context_scoring else None
        forced, _ = split_forced([j for j in rest if not shown[j]], token_ids, starts, mode)
        if forced:
            outputs = self._call(
                "generate",
                [prompt(token_ids[j][: starts[j]], j) for j in forced],
                [forced_params(self.forced, token_ids[j][starts[j] :]) for j in forced],
                "a context",
                lambda k: names[forced[k]],
            )
            for j, out in zip(forced, outputs, strict=True):
                scores[j] = forced_score(out, token_ids[j][starts[j] :], self.forced)[0]
            decoded = set(forced)
            rest = [j for j in rest if j not in decoded]
        if rest:
            params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, seed=seed)
            outputs = self._call(
                "generate", [prompt(token_ids[j], j) for j in rest], params, "a context", lambda k: names[rest[k]]
            )
            for j, out in zip(rest, outputs, strict=True):
                ids = list(out.prompt_token_ids)  # with images: the placeholders expanded
                first = len(ids) - (len(token_ids[j]) - starts[j])
                scores[j] = sum(out.prompt_logprobs[t][ids[t]].logprob for t in range(first, len(ids)))
        return scores


def one_token_groups(
    token_ids: list[list[int]], starts: list[int], keys: list[Any], enabled: bool = True
) -> tuple[dict[Any, list[int]], list[int]]:
    """Split options into groups scored one request each and the rest: an option whose continuation is one token
    (``len(token_ids[j]) - starts[j] == 1``, after a context of at least one token) joins the group of its
    ``keys[j]`` (its context); a group with more distinct tokens than one request may ask for, and every longer
    option, go to the rest (``prompt_logprobs``). ``enabled`` False: all go to the rest."""
    groups: dict[Any, list[int]] = {}
    rest: list[int] = []
    for j, (ids, start) in enumerate(zip(token_ids, starts, strict=True)):
        if enabled and start >= 1 and len(ids) - start == 1:
            groups.setdefault(keys[j], []).append(j)
        else:
            rest.append(j)
    for ctx in [c for c, js in groups.items() if len({token_ids[j][-1] for j in js}) > _MAX_SCORED_TOKENS]:
        rest.extend(groups.pop(ctx))
    return groups, rest


def one_token_params(token_ids: list[list[int]], group: list[int], **extra: Any) -> Any:
    """The request of one group of one-token options: one greedy token, the raw log-probabilities of exactly the
    options' tokens at that position (``SamplingParams.logprob_token_ids``)."""
    from vllm import SamplingParams

    tokens = sorted({token_ids[j][-1] for j in group})
    return SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=tokens, **extra)


def _over(preset: dict[str, Any] | None, user: dict[str, Any] | None) -> dict[str, Any] | None:
    """The user's chat template variables over the preset's, key by key (None when neither sets any).

    A user's non-dict is passed through for :class:`GeneratorBase` to refuse by name."""
    if user is not None and not isinstance(user, dict):
        return user
    return {**(preset or {}), **(user or {})} or None


def image_limits(max_images: int | None, largest: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """vLLM's ``limit_mm_per_prompt`` for prompts of at most ``max_images`` images, or None (text only).

    With ``largest`` (``(width, height)`` in pixels, no image of the run larger), vLLM's start-up profiling and
    multimodal warm-up use a dummy image of that size rather than the model's largest, and videos and audio are
    limited to 0 (modalities a model lacks are ignored by vLLM). Without it, vLLM 0.33 profiles Qwen2.5-VL's encoder
    with a video of its largest feature size, although the run sends images only. The limits are vLLM's own
    per-modality dummy options (``MultiModalConfig.limit_per_prompt``, "configurable format").

    Raises:
        UsageError: ``largest`` not two positive integers.
    """
    if not max_images:
        return None
    if largest is None:
        return {"limit_mm_per_prompt": {"image": int(max_images)}}
    try:
        width, height = (int(v) for v in largest)
    except (TypeError, ValueError):
        raise UsageError(f"largest_image must be (width, height) in pixels, got {largest!r}") from None
    if width < 1 or height < 1:
        raise UsageError(f"largest_image must be (width, height) in pixels, got {largest!r}")
    image = {"count": int(max_images), "width": width, "height": height}
    return {"limit_mm_per_prompt": {"image": image, "video": 0, "audio": 0}}
