"""Command-line option values and the option groups several commands share.

Every value type raises ``argparse.ArgumentTypeError`` with the option's rule, which the parser turns
into a one-line :class:`~vllm_eval.utils.errors.UsageError` (``--max-model-len: must be a positive integer,
got '0'``). Engine options keep vLLM's ``EngineArgs`` names; any other ``EngineArgs`` name is
accepted as ``--name value`` (:func:`parse_extra_engine_args`) and checked against vLLM's list.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ..utils.errors import UsageError


def _typed(name: str, convert: Callable[[str], Any], ok: Callable[[Any], bool], rule: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value

    parse.__name__ = name
    return parse


positive_int = _typed("positive_int", int, lambda v: v >= 1, "a positive integer")
nonneg_float = _typed("nonneg_float", float, lambda v: v >= 0, "a number >= 0")
positive_float = _typed("positive_float", float, lambda v: v > 0, "a number > 0")
fraction = _typed("fraction", float, lambda v: 0 < v <= 1, "a number in (0, 1]")
integer = _typed("integer", int, lambda v: True, "an integer")
nonneg_int = _typed("nonneg_int", int, lambda v: v >= 0, "an integer >= 0")


def limit_value(text: str) -> int | float:
    """``--limit``: a count >= 1, or (lm-eval's tasks) a fraction of each task in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a count >= 1 or a fraction in (0, 1), got {text!r}") from None
    if value.is_integer() and value >= 1:
        return int(value)
    if 0 < value < 1:
        return value
    raise argparse.ArgumentTypeError(f"must be a count >= 1 or a fraction in (0, 1), got {text!r}")


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line (``'{"query": "query: "}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'must be a JSON object like \'{{"key": "value"}}\', got {text!r}')
    return value


#: Named explicitly for --help; every other EngineArgs name is accepted as --snake-or-kebab-name.
ENGINE_FLAGS: list[tuple[str, Any, str]] = [
    ("dtype", str, "model dtype: auto, float32, float16, bfloat16"),
    ("head_dtype", str, "pooling head dtype (vLLM hf_overrides['head_dtype'])"),
    ("max_model_len", positive_int, "token limit; longer inputs are truncated and counted"),
    ("max_num_seqs", positive_int, "max sequences per engine step"),
    ("max_num_batched_tokens", positive_int, "max tokens per engine step"),
    ("tensor_parallel_size", positive_int, "GPUs per engine"),
    ("gpu_memory_utilization", fraction, "share of GPU memory (of RAM on the CPU build)"),
    ("seed", integer, "engine seed"),
    ("hf_overrides", json_object, "JSON object applied to the HF config"),
    ("pooler_config", json_object, "JSON object of vLLM PoolerConfig fields"),
    ("quantization", str, "weight quantization, e.g. fp8 (weights quantized as they load)"),
    ("kv_cache_dtype", str, "KV cache dtype, e.g. fp8 (decoder models)"),
    ("load_format", str, "how weights load: auto, safetensors, fastsafetensors, runai_streamer ..."),
    (
        "stall_timeout",
        nonneg_float,
        "seconds one engine step may take before the run stops as stalled, results kept (default 600; 0: never)",
    ),
    (
        "progress_timeout",
        nonneg_float,
        "seconds the engine may hold requests and answer none while its steps return before the run stops as "
        "stalled, results kept (default 30, or 10x the longest step; 0: never)",
    ),
    (
        "io_processor_plugin",
        str,
        "pooling models: a vLLM IO-processor plugin by its entry-point name (group vllm.io_processor_plugins)",
    ),
]
ENGINE_BOOLS = [
    ("enforce_eager", "disable CUDA graphs / torch.compile (default on the CPU build)"),
    ("enable_prefix_caching", "reuse KV cache across shared prefixes"),
    ("trust_remote_code", "run the model repository's own code (default off)"),
]


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_extra_engine_args(extra: list[str]) -> dict[str, Any]:
    """``--name value`` / ``--name=value`` / bare ``--flag`` pairs → dict of EngineArgs names.

    Values are parsed as JSON when they can be (numbers, booleans, objects), else kept as strings.

    Raises:
        UsageError: a token that is not a ``--option``, or an option given twice.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(extra):
        tok = extra[i]
        if not tok.startswith("--") or tok == "--":
            raise UsageError(f"unexpected argument {tok!r}")
        name, eq, value = tok[2:].partition("=")
        key = name.replace("-", "_")
        if key in out:
            raise UsageError(f"--{name} is given more than once")
        if eq:
            out[key] = _parse_value(value)
            i += 1
        elif i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            out[key] = _parse_value(extra[i + 1])
            i += 2
        else:
            out[key] = True
            i += 1
    return out


# --- option groups ---------------------------------------------------------------------------------

#: Destinations of the shared groups below that reach a backend (``--device``, replicas, endpoints).
SHARED_BACKEND_OPTIONS = (
    "device",
    "data_parallel_size",
    "replicas_per_gpu",
    "ray_address",
    "endpoint",
    "api_key",
    "max_concurrency",
)


#: What ``--model`` (``--reranker``) says of several values: a sweep.
SWEEP_HELP = (
    "; several (or a quoted glob, or a training folder of checkpoint-* subfolders): a sweep, one job, each model's "
    "results under --output-dir/<name>, the table in sweep.json"
)


def add_model(parser: argparse.ArgumentParser, help_: str | None = None, *, many: bool = False) -> None:
    """``--model``: a directory or hub id; for a served model its served name (default: the server's); ``many``:
    several values, a sweep (one value is stored as a string, several as a list: :class:`OneOrMany`)."""
    parser.add_argument(
        "--model",
        default=None,
        nargs="+" if many else None,
        action=OneOrMany if many else "store",
        help=(help_ or "model directory or hub id (served: the served name, default: the server's)")
        + (SWEEP_HELP if many else ""),
    )


class OneOrMany(argparse.Action):
    """A ``nargs="+"`` model flag: one value stored as the string, several as the list (a sweep)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values[0] if isinstance(values, list) and len(values) == 1 else values)


def add_tasks(parser: argparse.ArgumentParser, help_: str, aliases: tuple[str, ...] = ()) -> None:
    """``--tasks`` (several names, space or comma separated)."""
    parser.add_argument("--tasks", *aliases, dest="tasks", nargs="+", default=None, help=help_)


def add_backend(parser: argparse.ArgumentParser, kinds: tuple[str, ...], *, exclude: tuple[str, ...] = ()) -> None:
    """``--backend``: the backends of ``kinds`` in the backend table (default: the table's default)."""
    from ..models.backends import DEFAULT_BACKEND, backend_names, describe_backends

    names = [n for n in dict.fromkeys(n for k in kinds for n in backend_names(k)) if n not in exclude]
    parser.add_argument(
        "--backend",
        choices=names,
        default=DEFAULT_BACKEND,
        help=describe_backends(names) + f" (default {DEFAULT_BACKEND})",
    )


def add_common(parser: argparse.ArgumentParser, output_help: str) -> None:
    """``--output-dir``, ``--device`` (reference backends) and ``--no-progress``."""
    parser.add_argument("--output-dir", default=None, help=output_help)
    parser.add_argument("--device", default=None, help="reference backends: torch device")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def add_cache_flags(parser: argparse.ArgumentParser) -> None:
    """``--cache-dir`` / ``--no-cache`` (the output cache)."""
    grp = parser.add_argument_group(
        "output cache (outputs keyed on model, settings and exact input; see docs/long-runs.md)"
    )
    grp.add_argument(
        "--cache-dir", default=None, help="cache folder (default: $VLLMEVAL_CACHE_DIR or ~/.cache/vllm-eval)"
    )
    grp.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")


def add_run_flags(parser: argparse.ArgumentParser, overwrite_default: str = "only-missing") -> None:
    """The cache flags plus mteb's resume options (``--overwrite-strategy`` ...) of the mteb commands."""
    from ..evaluation.results import OVERWRITE_STRATEGIES

    add_cache_flags(parser)
    parser.add_argument(
        "--overwrite-strategy",
        choices=OVERWRITE_STRATEGIES,
        default=overwrite_default,
        help=f"mteb's: only-missing reads finished tasks back, never runs only tasks without a result, "
        f"always recomputes (default {overwrite_default})",
    )
    parser.add_argument(
        "--continue-on-error",
        action="store_true",
        help="a task that fails (e.g. its data is unavailable) is marked in the table; the run goes on",
    )
    parser.add_argument(
        "--log-samples",
        action="store_true",
        help="write per-sample predictions of each task to <output-dir>/samples/<Task>.jsonl",
    )


def add_remote_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--endpoint`` / ``--api-key`` / ``--max-concurrency`` of the backends that talk to servers."""
    rem = parser.add_argument_group(f"served models ({what} of running `vllm serve` instances)")
    rem.add_argument(
        "--endpoint",
        action="append",
        default=None,
        help="a served base URL, e.g. http://127.0.0.1:8000 (repeat for several servers)",
    )
    rem.add_argument("--api-key", default=None, help="key of servers started with --api-key")
    rem.add_argument(
        "--max-concurrency", type=positive_int, default=None, help="requests in flight over all endpoints (default 8)"
    )


def add_scale_flags(parser: argparse.ArgumentParser, many: bool = False) -> None:
    """``--data-parallel-size`` / ``--replicas-per-gpu`` (engine replicas); ``many``: several values each."""
    dp = parser.add_argument_group(
        "engine replicas (in-process vLLM, local or on Ray)" + (": several values measure each" if many else "")
    )
    extra: dict[str, Any] = {"nargs": "+"} if many else {}
    dp.add_argument(
        "--data-parallel-size",
        type=positive_int,
        default=None,
        **extra,
        help="engine replicas over this machine's GPUs (each with --tensor-parallel-size GPUs) "
        "or over disjoint CPU core sets; inputs are sharded, order kept "
        + ("(default 1; --suite: as run chooses)" if many else "(default: every GPU; 1 on the CPU build)"),
    )
    dp.add_argument(
        "--replicas-per-gpu",
        type=positive_int,
        default=None,
        **extra,
        help="engines sharing each GPU, for models too small to keep one busy; "
        "--gpu-memory-utilization is split among them unless given "
        + (
            "(default 1; --suite: as run chooses)"
            if many
            else "(default: by the model's size on a GPU, 4 for a BERT-base, 1 for an 8B; 1 on the CPU build)"
        ),
    )
    dp.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="run the replicas as actors on this Ray cluster (auto, HOST:PORT or ray://HOST:PORT; "
        "needs vllm-eval[ray]); --data-parallel-size x --replicas-per-gpu actors; for run with "
        "--concurrent-tasks > 1, the tasks' scoring too (one actor of 1 CPU per task at once)",
    )


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """vLLM's engine options by their ``EngineArgs`` names (:data:`ENGINE_FLAGS`, :data:`ENGINE_BOOLS`)."""
    eng = parser.add_argument_group("vLLM engine options (EngineArgs names)")
    own = [name for name, _, _ in ENGINE_FLAGS if "--" + name.replace("_", "-") in parser._option_string_actions]
    parser.set_defaults(_engine_flags_of_command=own)  # a command's own flag of that name is not an engine option
    for name, typ, help_ in ENGINE_FLAGS:
        if name not in own:
            eng.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None, help=help_)
    for name, help_ in ENGINE_BOOLS:
        eng.add_argument(
            "--" + name.replace("_", "-"), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_
        )


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The named engine options the user set (an ``EngineArgs`` dict)."""
    own = set(getattr(args, "_engine_flags_of_command", ()))
    engine = {name: getattr(args, name, None) for name, _, _ in ENGINE_FLAGS if name not in own}
    engine.update({name: getattr(args, name, None) for name, _ in ENGINE_BOOLS})
    return {k: v for k, v in engine.items() if v is not None}
