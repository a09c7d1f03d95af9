"""Replica processes started with the command, before its own imports and checks.

A replica spends its first seconds importing torch and vLLM (on an H100 machine 3-5 s for ``import vllm``, then
about 7 s of vLLM's deferred imports before its engine init), while the command spends its own first seconds
importing mteb and ours, checking its options and resolving the model (6.1 s into a run on an H100 before the
replicas were launched, docs/bench/h100-task-processes). :func:`start_ahead`, called first thing with the command
line, starts the replica processes the command's layout flags (``--data-parallel-size``, ``--replicas-per-gpu``,
``--tensor-parallel-size``) will ask for: they import meanwhile, then wait for the model, the engine options and
the setup function. The backend takes them (:func:`take_ahead`) when its plan puts replicas exactly where they were
started (same count, same environment) and the pool hands each its order; otherwise they are stopped unused and
the pool starts its own, as it would have anyway. Whatever is not taken is stopped when the command ends
(:func:`discard_ahead`). On one H100 the replicas were launched 1.0 s into a run instead of 6.1 s and ready at
18.4 s instead of 28.5 s (docs/bench/h100-start-ahead). ``VLLMEVAL_START_AHEAD=0`` turns this off.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from typing import Any

from .process import ReplicaProcess, spawn

logger = logging.getLogger(__name__)

#: ``0`` starts no replica processes before the command knows its model.
ENV_SWITCH = "VLLMEVAL_START_AHEAD"
#: Commands whose vLLM backend starts local replicas from the layout flags.
ENGINE_COMMANDS = ("run", "rerank", "generate", "classify", "reward", "token-classify")

_AHEAD: list[ReplicaProcess] = []


#: The flag naming the model whose replicas a command starts (``rerank``'s engines are its reranker's).
_MODEL_FLAG = {"rerank": "--reranker"}


def layout_of(argv: Sequence[str]) -> tuple[int, int, int] | None:
    """``(data_parallel_size, replicas_per_gpu, tensor_parallel_size)`` of a command line (without the program
    name) that will start more than one local vLLM replica: its layout flags, what they leave out chosen as the
    backend will (:func:`vllm_eval.replicas.layout.resolve_layout`, from the model's ``config.json`` and the GPUs);
    None for any other, or one it cannot read (the command's own parser then speaks)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in ENGINE_COMMANDS:
        return None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name in ("--data-parallel-size", "--replicas-per-gpu", "--tensor-parallel-size"):
        parser.add_argument(name, type=int, default=None)
    parser.add_argument("--backend", default="vllm")
    for name in ("--model", "--reranker", "--dtype", "--quantization"):
        parser.add_argument(name, default=None)
    for name in ("--ray-address", "--endpoint"):
        parser.add_argument(name, nargs="*")
    parser.add_argument("-h", "--help", action="store_true")
    try:
        args, _ = parser.parse_known_args(list(argv))
    except (argparse.ArgumentError, SystemExit, ValueError):
        return None
    sizes = (args.data_parallel_size, args.replicas_per_gpu, args.tensor_parallel_size)
    if args.help or args.ray_address or args.endpoint or args.backend != "vllm" or min(s or 1 for s in sizes) < 1:
        return None
    try:
        layout = _resolved(command, args)
    except Exception:  # a model it cannot read (a sweep's glob or training folder): the backend plans its own
        return None
    return layout if layout[0] * layout[1] > 1 else None


def _resolved(command: str, args: argparse.Namespace) -> tuple[int, int, int]:
    """The layout of parsed layout flags, what they leave out chosen (the CPU build: 1)."""
    from .layout import resolve_layout

    model = getattr(args, _MODEL_FLAG.get(command, "--model").lstrip("-"))
    if model is None and command == "run":
        from ..utils.modelinfo import packaged_model_path

        model = packaged_model_path()
    options = {"runner": "generate" if command == "generate" else "pooling", "dtype": args.dtype}
    options.update(quantization=args.quantization, tensor_parallel_size=args.tensor_parallel_size)
    options = {k: v for k, v in options.items() if v is not None}
    layout = resolve_layout(model, options, args.data_parallel_size, args.replicas_per_gpu)
    return layout.data_parallel_size, layout.replicas_per_gpu, layout.tensor_parallel_size


def start_ahead(argv: Sequence[str]) -> None:
    """Start the replica processes the command line ``argv`` will ask for (see the module doc). Never raises: a
    layout that cannot be placed is the command's to report, once it has checked its options."""
    layout = layout_of(argv)
    if layout is None:
        return
    try:
        from ..utils.hub import ensure_offline_if_unreachable
        from ..utils.logs import preset_environment
        from .pool import plan_replicas

        # Read once, when the hub libraries and torch are imported: before the replicas import them.
        ensure_offline_if_unreachable()
        preset_environment("--verbose" in argv or "-v" in argv)
        placements = plan_replicas(layout[0], layout[1], tensor_parallel_size=layout[2])
        for p in placements:
            _AHEAD.append(spawn(None, None, p.env, p.index, None))
    except Exception as exc:  # the command plans (and reports) it again
        logger.debug("no replicas started ahead: %s", exc)
        discard_ahead()


def take_ahead(placements: Sequence[Any]) -> list[ReplicaProcess] | None:
    """The processes started ahead for exactly ``placements`` (one each, in order, same environment), now the
    caller's; None when there are none or they do not match (then they are stopped)."""
    ahead = list(_AHEAD)
    _AHEAD.clear()
    if not ahead:
        return None
    same = len(ahead) == len(placements) and all(a.env == p.env for a, p in zip(ahead, placements, strict=True))
    if same and all(a.proc.is_alive() for a in ahead):
        return ahead
    logger.info("replica processes started ahead do not match the replicas planned: starting new ones")
    for a in ahead:
        a.stop()
    return None


def discard_ahead() -> None:
    """Stop the processes started ahead that no pool took (the command failed, or started no replicas)."""
    while _AHEAD:
        _AHEAD.pop().stop()
