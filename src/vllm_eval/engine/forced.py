"""Forced decoding: a continuation's log-likelihood read by decoding its own tokens after the context.

lm-evaluation-harness scores a continuation of several tokens with ``prompt_logprobs`` over context + continuation:
a full prefill per option, log-probabilities over the vocabulary at every prompt position, and vLLM's prefix cache
serves no such request (measured: ``scripts/prompt_logprob_cache.py``, docs/generative.md). Decoding the continuation
instead, its tokens forced one step at a time, gives the same log-probabilities (each token's raw log-softmax at its
position, vLLM's default ``logprobs_mode="raw_logprobs"``, read before any logits processor), and the context is a
plain prompt the prefix cache serves: the options of one question share one prefill.

vLLM has this natively from 0.32 on Model Runner V2 (``EngineArgs.enable_trace_replay`` and
``SamplingParams.trace_decode_token_ids``: the sampled token is overwritten by the trace's while the logprobs and ranks
are computed from the unmodified logits; ``vllm/v1/worker/gpu/sample/trace_replay.py``). Elsewhere (the CPU build and
the V1 runner of earlier GPU releases) :class:`ForcedTokens`, a V1-runner logits processor, leaves only the forced
token's logit finite, so greedy sampling picks it. A GPU release with Model Runner V2's processor interface and no
trace replay (none of the releases this project runs on) gets neither: its requests go as lm-eval sends them.

Every answer is checked: the tokens the engine returns must be the forced ones (:func:`forced_scores`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FORCE_KEY",
    "FORCED_MAX_TOKENS",
    "FORCED_PROCESSOR",
    "ForcedTokens",
    "forced_fits",
    "forced_engine_kwargs",
    "forced_params",
    "forced_score",
    "forced_scores",
    "split_forced",
]

#: ``SamplingParams.extra_args`` key of :class:`ForcedTokens`: the continuation's token ids, in order.
FORCE_KEY = "vllm_eval_forced"
#: :class:`ForcedTokens` as vLLM's ``logits_processors`` engine option names it.
FORCED_PROCESSOR = "vllm_eval.engine.forced:ForcedTokens"
#: Longest continuation decoded (tokens): each token is one engine step, so a long one (a rolling window over a
#: whole document, with nothing shared to gain) stays one prefill with ``prompt_logprobs``.
FORCED_MAX_TOKENS = 128


def forced_fits(context: int, continuation: int) -> bool:
    """Whether a continuation of ``continuation`` tokens after ``context`` tokens is decoded rather than prefilled:
    after a context of at least one token, more than one token (one is scored at the first generated position) and
    at most :data:`FORCED_MAX_TOKENS`."""
    return context >= 1 and 1 < continuation <= FORCED_MAX_TOKENS


def split_forced(
    candidates: list[int], token_ids: list[list[int]], starts: list[int], mode: str | None
) -> tuple[list[int], list[int]]:
    """``candidates`` (indices of ``token_ids`` whose continuation starts at ``starts[j]``) split into those decoded
    after their context (:func:`forced_fits`, where ``mode`` is not None) and the rest, each in the given order."""
    decoded = {j for j in candidates if mode and forced_fits(starts[j], len(token_ids[j]) - starts[j])}
    return [j for j in candidates if j in decoded], [j for j in candidates if j not in decoded]


def _v1_base() -> type:
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor
    except ImportError:  # no vLLM here (a parent of replicas): the class is only built where an engine runs
        return object
    return LogitsProcessor


class ForcedTokens(_v1_base()):  # type: ignore[misc]
    """The V1 runner's logits processor forcing each request's ``extra_args[FORCE_KEY]`` tokens: at output step
    ``k`` every logit of the row but token ``k``'s is set to -inf (float32 ``[rows, vocab]``, in place), so greedy
    sampling emits exactly the continuation. The raw log-probabilities vLLM returns are computed before processors
    run, so they are the model's own.

    Args:
        vllm_config, device, is_pin_memory: as vLLM's V1 runner passes them.
    """

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.device = device
        #: batch row -> (forced tokens, the row's outputs so far: vLLM's live list)
        self.rows: dict[int, tuple[tuple[int, ...], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the greedy pick

    @staticmethod
    def _state(params: Any, _prompt: Any, outputs: list[int]) -> tuple[tuple[int, ...], list[int]] | None:
        tokens = (getattr(params, "extra_args", None) or {}).get(FORCE_KEY)
        return None if tokens is None else (tuple(int(t) for t in tokens), outputs)

    def update_state(self, batch_update: Any) -> None:
        from vllm.v1.sample.logits_processor.builtin import process_dict_updates

        process_dict_updates(self.rows, batch_update, self._state)

    def apply(self, logits: Any) -> Any:
        import torch

        rows, cols = [], []
        for row, (tokens, outputs) in self.rows.items():
            if len(outputs) < len(tokens):
                rows.append(row)
                cols.append(tokens[len(outputs)])
        if not rows:
            return logits
        r = torch.tensor(rows, dtype=torch.long, device=self.device)
        c = torch.tensor(cols, dtype=torch.long, device=self.device)
        logits[r] = -float("inf")
        logits[r, c] = 0.0
        return logits


def forced_engine_kwargs() -> tuple[str | None, dict[str, Any]]:
    """How the installed vLLM forces tokens, and the engine options that turn it on: ``("trace_replay",
    {"enable_trace_replay": True})`` on a GPU release with trace replay (0.32, 0.33; not with
    ``VLLM_USE_V2_MODEL_RUNNER=0``, since it needs Model Runner V2), ``("processor", {"logits_processors":
    [FORCED_PROCESSOR]})`` on the CPU build and GPU releases whose V1 runner takes V1 processors (0.26),
    ``(None, {})`` where neither works. Read from vLLM's files, without importing it (a parent of replicas never
    needs vLLM)."""
    import importlib.util
    import os

    from .args import on_cpu

    if on_cpu():
        return "processor", {"logits_processors": [FORCED_PROCESSOR]}
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None, {}
    sample = os.path.join(list(spec.submodule_search_locations)[0], "v1", "worker", "gpu", "sample")
    v2_off = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in ("0", "false")
    if os.path.exists(os.path.join(sample, "trace_replay.py")) and not v2_off:
        return "trace_replay", {"enable_trace_replay": True}
    if not os.path.exists(os.path.join(sample, "logits_processor", "interface.py")) or v2_off:
        return "processor", {"logits_processors": [FORCED_PROCESSOR]}
    return None, {}


def forced_params(mode: str, tokens: list[int]) -> Any:
    """The ``SamplingParams`` decoding exactly ``tokens`` after the prompt (``mode`` from
    :func:`forced_engine_kwargs`): greedy, ``len(tokens)`` steps whatever they are (``ignore_eos``), the sampled
    token's raw log-probability and rank at each (``logprobs=0``)."""
    from vllm import SamplingParams

    force = (
        {"trace_decode_token_ids": list(tokens)}
        if mode == "trace_replay"
        else {"extra_args": {FORCE_KEY: list(tokens)}}
    )
    return SamplingParams(temperature=0, max_tokens=len(tokens), logprobs=0, ignore_eos=True, detokenize=False, **force)


def forced_scores(output: Any, tokens: list[int]) -> tuple[float, bool] | None:
    """``(sum of the forced tokens' log-probabilities in nats, whether each was the greedy pick)`` from one vLLM
    ``RequestOutput``; None when the engine did not decode exactly ``tokens`` (the caller scores it another way)."""
    completion = output.outputs[0]
    if list(completion.token_ids) != list(tokens) or not completion.logprobs:
        return None
    total, greedy = 0.0, True
    for token, step in zip(tokens, completion.logprobs, strict=True):
        found = step[token]
        total += float(found.logprob)
        greedy = greedy and found.rank == 1
    return total, greedy


def forced_score(output: Any, tokens: list[int], mode: str) -> tuple[float, bool]:
    """:func:`forced_scores`, raising where the engine did not decode exactly ``tokens``.

    Raises:
        EngineError: the returned tokens are not the forced ones (never seen; a guard against a vLLM change).
    """
    found = forced_scores(output, tokens)
    if found is None:
        from ..utils.errors import EngineError

        raise EngineError(
            f"the engine did not decode the {len(tokens)} tokens it was given (forced decoding, {mode}); start it "
            "with forced_decoding=False to score continuations by their prompt log-probabilities"
        )
    return found
