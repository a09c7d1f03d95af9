"""lm-evaluation-harness's tasks against a served model: lm-eval's own ``local-completions`` model
(``lm_eval.models.openai_completions.LocalCompletionsAPI``) pointed at the server's ``/v1/completions``, after this
project's checks of the server.

lm-eval scores a ``loglikelihood`` request there with ``echo`` and ``logprobs=1`` (the prompt's log-probabilities, as
vLLM's server gives them for token-id prompts) and generates with ``/v1/completions`` too, so its request building,
parsing and stop-sequence handling are lm-eval's. What is ours: the server is asked what it serves (name, context
length) with this project's transport (retries, a clear line when nothing answers), whether it gives prompt
log-probabilities when a task needs them (one line before anything runs when it does not), and which tokenizer
lm-eval tokenizes with (``tokenizer``, else the served name, loaded here so a missing one is named up front).
"""

from __future__ import annotations

from typing import Any

from ...utils.errors import EndpointError, UsageError
from ..http import HttpClient, HttpOptions, RequestRefused

#: lm-eval's request types that need the prompt's log-probabilities (``echo`` with ``logprobs``).
LOGPROB_TYPES = ("multiple_choice", "loglikelihood", "loglikelihood_rolling")


def remote_lm(
    http: HttpOptions,
    model: str | None,
    *,
    tokenizer: str | None = None,
    output_types: dict[str, str] | None = None,
    max_gen_toks: int | None = None,
    add_bos_token: bool | None = None,
    prefix_token_id: int | None = None,
    truncation_side: str | None = None,
) -> Any:
    """lm-eval's ``LocalCompletionsAPI`` on the first of ``http.endpoints``, for the served ``model`` (None: the
    server's first).

    Args:
        http: the server and transport (``max_concurrency`` requests in flight, ``retries``, ``timeout`` seconds,
            ``batch_size`` prompts per request).
        model: the served name; None asks ``/v1/models``.
        tokenizer: the tokenizer lm-eval tokenizes with (a folder or hub id); default the served name.
        output_types: leaf task -> lm-eval ``output_type``; those in :data:`LOGPROB_TYPES` need the server's prompt
            log-probabilities, which are checked with one request first.
        max_gen_toks, add_bos_token, prefix_token_id: as lm-eval's API models take them.
        truncation_side: lm-eval's API models cut contexts on the left only; another side is refused.

    Raises:
        UsageError: several endpoints (lm-eval's model sends to one URL), a tokenizer that cannot be loaded,
            ``truncation_side`` not ``left``, or tasks needing log-probabilities the server does not give (named).
        EndpointError: no endpoint answers.
    """
    if len(http.endpoints) > 1:
        raise UsageError(
            f"lm-eval's tasks over --backend remote take one --endpoint (lm-eval's API model sends to one URL); "
            f"got {len(http.endpoints)}"
        )
    if truncation_side not in (None, "left"):
        raise UsageError(f"--truncation-side {truncation_side}: lm-eval's API models cut contexts on the left only")
    client = HttpClient(http)
    try:
        served, max_len = client.served_model(model)
        source = tokenizer or served
        tok = _tokenizer(source, tokenizer is not None)
        needing = sorted(t for t, kind in (output_types or {}).items() if kind in LOGPROB_TYPES)
        if needing:
            _check_prompt_logprobs(client, served, tok, needing)
    finally:
        client.close()
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    options: dict[str, Any] = {}
    if max_gen_toks is not None:
        options["max_gen_toks"] = int(max_gen_toks)
    if add_bos_token is not None:
        options["add_bos_token"] = bool(add_bos_token)
    if prefix_token_id is not None:
        options["custom_prefix_token_id"] = int(prefix_token_id)
    if max_len:
        options["max_length"] = int(max_len)
    return LocalCompletionsAPI(
        base_url=f"{http.endpoints[0].rstrip('/')}/v1/completions",
        model=served,
        tokenizer=source,
        tokenizer_backend="huggingface",
        tokenized_requests=True,
        num_concurrent=http.max_concurrency,
        max_retries=http.retries,
        timeout=int(http.timeout),
        batch_size=http.batch_size,
        **options,
    )


def _tokenizer(source: str, given: bool) -> Any:
    """The tokenizer lm-eval will load (``transformers.AutoTokenizer``), loaded once here so a missing one is one line.

    Raises:
        UsageError: it cannot be loaded (naming it, and ``--tokenizer``)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # OSError (not found, offline), ValueError (not a tokenizer)
        hint = "" if given else "; give --tokenizer DIR (the served model's tokenizer)"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"tokenizer {source!r} cannot be loaded here ({first}){hint}") from None


def _check_prompt_logprobs(client: HttpClient, served: str, tokenizer: Any, tasks: list[str]) -> None:
    """One ``/v1/completions`` request with ``echo`` and ``logprobs`` (lm-eval's loglikelihood request): the reply
    must hold one log-probability per prompt token after the first.

    Raises:
        UsageError: the server refuses it or leaves them out (naming the tasks that need them)."""
    ids = tokenizer.encode("The capital of France is Paris.", add_special_tokens=False)[:8] or [0, 0]
    body = {"model": served, "prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}

    def parse(reply: Any) -> bool:
        try:
            values = reply["choices"][0]["logprobs"]["token_logprobs"]
        except (KeyError, IndexError, TypeError):
            return False
        return isinstance(values, list) and len(values) >= len(ids) and all(v is not None for v in values[1:])

    try:
        ok = client.request("POST", "/v1/completions", body, parse=parse)
        why = "its reply holds no prompt log-probabilities"
    except RequestRefused as exc:
        ok, why = False, f"HTTP {exc.status}: {exc.message}"
    except EndpointError as exc:
        ok, why = False, str(exc)
    if not ok:
        shown = ", ".join(tasks[:5]) + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "")
        raise UsageError(
            f"the server gives no prompt log-probabilities on /v1/completions ({why}); {shown} need them: run "
            "generate_until tasks only against it, or use --backend vllm"
        )
