"""Pipelined requests on the in-process engine: a chunk's requests go into the engine before the previous chunk's
outputs are all collected (pooling, and lm-eval's generation and log-likelihood requests).

Why: ``LLM.embed`` is one synchronous call per chunk (add the chunk's requests, step the engine until every one
is out, convert), so with one engine the engine core (a second process on a GPU) idles while this process
converts chunk k and renders and adds chunk k+1, and this process waits while the core computes: on an H100 the
main thread was busy 7.0 s and the core 6.2 s of a 16.6 s encode
(docs/bench/h100-time-to-result/one-engine-profile.md). Here :meth:`EnginePipeline.submit` renders and adds a
chunk's requests and returns a future at once; waiting for that future steps the engine until the chunk's last
request is out, handing outputs of later chunks to their own futures. The pooling stream keeps one chunk in
flight (:attr:`vllm_eval.models.vllm_backend.VllmBackend.max_in_flight`), so chunk k+1 is queued in the core while
chunk k's outputs are collected: at most two chunks are in the engine.

Driving is cooperative: nothing steps the engine in the background, a future's ``result()`` / ``exception()``
does, on the caller's thread (vLLM's ``LLMEngine`` is not thread-safe, and with the engine core in this process
``step()`` runs the model itself). A lock keeps two threads from stepping at once. ``result(timeout)`` steps
until the chunk is out whatever the timeout; ``done()`` is False until some wait has collected the chunk.

For generation (``task`` ``"generate"``: lm-eval's requests, :mod:`vllm_eval.models.generator.lmeval`) the reason
is the engine's batch: ``LLM.generate`` per chunk steps until the chunk's longest request is out, so the batch
thins to a few sequences at each chunk's end. With later chunks already queued it stays full (GSM8K 5-shot on an
H200, an 8B shape: 93.8 s of evaluation in chunks against lm-eval's 76 s all at once). Each request is rendered as
``LLM.generate`` renders it (the same renderer call) and added with a clone of its ``SamplingParams`` whose
``output_kind`` is ``FINAL_ONLY``, as ``LLM._add_request`` sets it.

Outputs equal ``LLM.embed``'s: prompts are rendered as ``LLM.encode`` renders them (parsed with
``parse_model_prompt``, the renderer's completion defaults with the call's tokenization kwargs), the params are
cloned with their task set, and each prompt is one ``LLMEngine.add_request`` with an id from ``LLM``'s own
counter; rows come from each output's pooled tensor as ``EmbeddingOutput.from_base`` reads it.

vLLM APIs relied on, all present in 0.26.0 and 0.32.0 and feature-detected (never version-checked): where one is
missing, :func:`engine_pipeline` is None and the caller runs its synchronous job. ``LLM.llm_engine.add_request
(request_id, prompt, params)`` / ``step()`` / ``has_unfinished_requests()`` / ``abort_request(ids, internal=)``,
``LLM.renderer.render_cmpl(prompts, tok_params)`` / ``.default_cmpl_tok_params.with_kwargs(...)``,
``LLM.request_counter``, ``LLM.runner_type`` / ``supported_tasks`` / ``pooling_task``, ``LLM.model_config``,
``vllm.renderers.inputs.preprocess.parse_model_prompt``. ``VLLMEVAL_PIPELINE=0`` turns the pipeline off (the
synchronous path, for comparison).
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

__all__ = ["ChunkFuture", "EnginePipeline", "drain", "engine_pipeline"]

logger = logging.getLogger(__name__)

#: One pipeline per engine (None: the engine lacks what it needs), dropped with the engine.
_PIPELINES: weakref.WeakKeyDictionary[Any, EnginePipeline | None] = weakref.WeakKeyDictionary()
_PIPELINES_LOCK = threading.Lock()


class ChunkFuture(Future):
    """The future of one submitted chunk: waiting for it (``result``, ``exception``) steps the engine until the
    chunk's last request is out (see the module doc)."""

    def __init__(self, pipeline: EnginePipeline) -> None:
        super().__init__()
        self._pipeline = pipeline

    def result(self, timeout: float | None = None) -> Any:
        self._pipeline.wait(self)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._pipeline.wait(self)
        return super().exception(timeout)

    def cancel(self) -> bool:
        """Abort the chunk's requests still in the engine (nobody will collect them) and cancel the future; False
        when it is done already."""
        self._pipeline.abandon(self)
        return super().cancel()


class _Chunk:
    """One submitted chunk: its outputs by position, the requests still out, its vLLM-internal request ids,
    ``finish(outputs)`` (its value) and its future."""

    def __init__(self, n: int, finish: Callable[[list[Any]], Any], future: ChunkFuture) -> None:
        self.outputs: list[Any] = [None] * n
        self.left = n
        self.internal_ids: list[str] = []
        self.finish, self.future = finish, future


class EnginePipeline:
    """Pooling requests of one in-process ``vllm.LLM``, several chunks in flight (see the module doc).

    Build it with :func:`engine_pipeline`, which checks the engine has what it needs.
    """

    def __init__(self, llm: Any) -> None:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        # Not the LLM itself: the cache's weak key must be the only link, so the engine goes with its last user.
        self._engine = llm.llm_engine
        self._renderer = llm.renderer
        self._model_config = llm.model_config
        self._counter = llm.request_counter
        self._parse = parse_model_prompt
        # Request id (as outputs carry it) -> its chunk and position: every request submitted and not yet out.
        self._owner: dict[str, tuple[_Chunk, int]] = {}
        self._lock = threading.RLock()

    def submit(
        self,
        prompts: Sequence[Any],
        params: Any,
        task: str,
        finish: Callable[[list[Any]], Any],
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> ChunkFuture:
        """Render ``prompts`` (vLLM prompts: text or ``TokensPrompt``) and add one request each with ``params``
        (one for all, or a list aligned with ``prompts``: a ``PoolingParams``, cloned, its task set to ``task``
        where unset; or for ``task`` ``"generate"`` a ``SamplingParams``, cloned, final output only); return at
        once. The future's value is ``finish(outputs)``: the chunk's finished outputs (``PoolingRequestOutput`` or
        ``RequestOutput``) in prompt order (or what it raises).

        Raises:
            VLLMValidationError: vLLM refused a prompt (too long, out-of-vocabulary token ...); none of the
                chunk's requests stays in the engine.
        """
        each = [_own_params(p, task) for p in params] if isinstance(params, list) else None
        one = _own_params(params, task) if each is None else None
        tok_params = self._renderer.default_cmpl_tok_params.with_kwargs(**(tokenization_kwargs or {}))
        with self._lock:
            # The whole chunk is rendered (and so validated) before any of it is added.
            inputs = self._renderer.render_cmpl([self._parse(self._model_config, p) for p in prompts], tok_params)
            future = ChunkFuture(self)
            chunk = _Chunk(len(inputs), finish, future)
            added: list[str] = []
            try:
                for i, engine_input in enumerate(inputs):
                    request_id = str(next(self._counter))
                    mine = one if each is None else each[i]
                    chunk.internal_ids.append(self._engine.add_request(request_id, engine_input, mine))
                    added.append(request_id)
                    self._owner[request_id] = (chunk, i)
            except BaseException:
                for request_id in added:
                    del self._owner[request_id]
                self._abort(chunk.internal_ids)
                raise
            if not inputs:
                self._complete(chunk)
        return future

    def wait(self, future: Future) -> None:
        """Step the engine until ``future`` is done (other chunks' outputs reach their own futures).

        Raises:
            Whatever ``LLMEngine.step`` raises (the engine died, an interrupt); every chunk still in flight then
            fails with it and its requests are aborted.
        """
        with self._lock:
            try:
                while not future.done():
                    self._step()
            except BaseException as exc:  # raised between steps too (a signal: the stall watchdog's, Ctrl-C)
                self._fail_all(exc)
                raise

    def drain(self) -> None:
        """Step the engine until no request of this pipeline is left in it (futures nobody waits for complete too),
        so that a synchronous ``LLM`` call, which steps the engine until it is empty, gets only its own outputs."""
        with self._lock:
            try:
                while self._owner:
                    self._step()
            except BaseException as exc:  # raised between steps too (a signal: the stall watchdog's, Ctrl-C)
                self._fail_all(exc)
                raise

    def abandon(self, future: Future) -> None:
        """Abort the requests of ``future``'s chunk still in the engine and forget them (its caller gave up on it:
        an exception left the stream that submitted it)."""
        with self._lock:
            mine = [(rid, chunk, i) for rid, (chunk, i) in self._owner.items() if chunk.future is future]
            for rid, _, _ in mine:
                del self._owner[rid]
            self._abort([chunk.internal_ids[i] for _, chunk, i in mine])

    def _step(self) -> None:
        if not self._owner:  # a future no longer in flight and not done: nothing left would ever finish it
            raise RuntimeError("vllm-eval pipeline: waited for a chunk that has no request in the engine")
        if not self._engine.has_unfinished_requests():
            # Another caller stepped this engine and took our outputs: fail rather than wait forever.
            n = len(self._owner)
            self._fail_all(RuntimeError(f"vLLM's engine lost {n} pipelined requests (another caller stepped it)"))
            return
        outputs = self._engine.step()
        for out in outputs:
            if not getattr(out, "finished", True) or out.request_id not in self._owner:
                continue  # pooling outputs come finished, once; anything else is not ours to route
            chunk, i = self._owner.pop(out.request_id)
            chunk.outputs[i] = out
            chunk.left -= 1
            if not chunk.left:
                self._complete(chunk)

    @staticmethod
    def _complete(chunk: _Chunk) -> None:
        try:
            chunk.future.set_result(chunk.finish(chunk.outputs))
        except BaseException as exc:  # handed to whoever waits for the chunk
            chunk.future.set_exception(exc)

    def _fail_all(self, exc: BaseException) -> None:
        """Abort every request still in flight and fail its chunk's future with ``exc``."""
        pending = list(self._owner.values())
        self._owner.clear()
        self._abort([chunk.internal_ids[i] for chunk, i in pending])
        for chunk in {id(c): c for c, _ in pending}.values():
            if not chunk.future.done():
                chunk.future.set_exception(exc)

    def _abort(self, internal_ids: list[str]) -> None:
        if not internal_ids:
            return
        try:
            self._engine.abort_request(internal_ids, internal=True)
        except Exception as exc:  # a dead engine: nothing left to abort, and the caller's error matters more
            logger.debug("aborting %d requests raised %s: %s", len(internal_ids), type(exc).__name__, exc)


def _own_params(params: Any, task: str) -> Any:
    """A clone of ``params`` as ``LLM.encode`` / ``LLM.generate`` send it: a pooling task set where unset, or
    a generation's output once, when it is finished."""
    params = params.clone()  # the caller's params are not changed
    if task == "generate":
        from vllm.sampling_params import RequestOutputKind

        params.output_kind = RequestOutputKind.FINAL_ONLY
    elif params.task is None:
        params.task = task
    return params


def _has_api(llm: Any) -> bool:
    """Whether ``llm`` has every vLLM API the pipeline uses, with the signatures it calls them with."""
    engine, renderer = getattr(llm, "llm_engine", None), getattr(llm, "renderer", None)
    if engine is None or renderer is None or not hasattr(llm, "request_counter") or not hasattr(llm, "model_config"):
        return False
    if not all(callable(getattr(engine, m, None)) for m in ("add_request", "step", "has_unfinished_requests")):
        return False
    if not callable(getattr(renderer, "render_cmpl", None)):
        return False
    try:
        from vllm.renderers.inputs.preprocess import parse_model_prompt  # noqa: F401

        add = list(inspect.signature(engine.add_request).parameters)
        abort = inspect.signature(engine.abort_request).parameters
        with_kwargs = renderer.default_cmpl_tok_params.with_kwargs
    except (ImportError, AttributeError, TypeError, ValueError):
        return False
    # Default multimodal LoRAs are chosen per prompt by LLM._resolve_mm_lora, which this path does not do.
    lora = getattr(getattr(engine, "vllm_config", None), "lora_config", None)
    return (
        add[:3] == ["request_id", "prompt", "params"]
        and "internal" in abort
        and callable(with_kwargs)
        and not (lora is not None and getattr(lora, "default_mm_loras", None))
    )


def _serves(llm: Any, task: str) -> bool:
    """Whether ``LLM.encode(pooling_task=task)`` (``LLM.generate`` for ``"generate"``) would accept ``llm`` (else
    its own error should surface)."""
    if task == "generate":
        return getattr(llm, "runner_type", None) == "generate"
    return (
        getattr(llm, "runner_type", None) == "pooling"
        and task in (getattr(llm, "supported_tasks", None) or ())
        and getattr(llm, "pooling_task", None) == task
    )


def engine_pipeline(llm: Any, task: str) -> EnginePipeline | None:
    """The one :class:`EnginePipeline` of ``llm`` (made on first use) for requests of pooling ``task`` (or
    ``"generate"``), or None:
    ``VLLMEVAL_PIPELINE=0``, an engine ``LLM.encode(pooling_task=task)`` would refuse (its own error should
    surface), or one without an API the pipeline needs. None: the caller runs its synchronous job."""
    if os.environ.get("VLLMEVAL_PIPELINE", "1") == "0" or not _serves(llm, task):
        return None
    with _PIPELINES_LOCK:
        try:
            if llm not in _PIPELINES:
                _PIPELINES[llm] = EnginePipeline(llm) if _has_api(llm) else None
            return _PIPELINES[llm]
        except TypeError:  # not weakly referable: not a vllm.LLM
            return None


def drain(llm: Any) -> None:
    """Collect every request ``llm``'s pipeline still has in the engine (nothing when it has none); call before
    anything else steps ``llm`` (``LLM.embed`` ...)."""
    try:
        pipeline = _PIPELINES.get(llm)
    except TypeError:  # not weakly referable: no pipeline was made for it
        return
    if pipeline is not None:
        pipeline.drain()
