"""The ``Command`` base every subcommand derives from, and what a model command is handed.

A subcommand is one module under :mod:`vllm_eval.cli.commands` holding its arguments and its handler
side by side, plus one entry in that package's ``COMMANDS`` list (the shape of vLLM's
``vllm/entrypoints/cli/`` ``CLISubcommand`` and lm-evaluation-harness's ``lm_eval/_cli/``).

A command that loads a model parses its flags and calls one function of :mod:`vllm_eval.api`
(:meth:`Command.call`), which makes every check before anything loads; the command prints what it returns.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..utils.errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (a :class:`UsageError`), not a usage dump."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


@dataclass
class Context:
    """What a model command is handed besides its flags.

    Attributes:
        engine: the vLLM engine options of the command line (``EngineArgs`` names: the named flags and every
            unlisted ``--name value``), as parsed; the library function checks them.
        started: ``time.time()`` when the command started (results count their total from here).
    """

    engine: dict[str, Any]
    started: float = 0.0


class Command:
    """One ``vllm-eval`` subcommand.

    Class attributes:
        name: the subcommand (``run``, ``token-classify`` ...).
        help: one line for ``vllm-eval --help``.
        description: the subcommand's ``--help`` text.
        kind: the kind of model it runs (:mod:`vllm_eval.models.kinds`), None for listing commands.
        loads_model: False for commands that load no model (listings, reports): unlisted ``--name value``
            options are refused.
        backend_options: argparse destinations of the command's own options that reach the backend's
            constructor when given (routed by :func:`vllm_eval.api.spec.resolve_spec`); those of the shared
            groups (``--device``, replicas, endpoints) are added by :meth:`options_of`.
    """

    name: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str] = ""
    kind: ClassVar[str | None] = None
    loads_model: ClassVar[bool] = True
    backend_options: ClassVar[tuple[str, ...]] = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the subcommand's arguments to its parser."""

    def options_of(self, args: argparse.Namespace) -> dict[str, Any]:
        """The backend options the user set: ``backend_options``, and those of the shared option groups the
        command has (:data:`~vllm_eval.cli.options.SHARED_BACKEND_OPTIONS`), read from ``args``."""
        from .options import SHARED_BACKEND_OPTIONS

        dests = dict.fromkeys((*self.backend_options, *(d for d in SHARED_BACKEND_OPTIONS if hasattr(args, d))))
        return {dest: getattr(args, dest, None) for dest in dests}

    def call_options(self, args: argparse.Namespace, ctx: Context) -> dict[str, Any]:
        """Keywords of the shared flags for a command's library function: the backend options set, the
        engine options, the cache, progress and verbosity flags the command has, and the start time."""
        out = {k: v for k, v in self.options_of(args).items() if v is not None}
        out.update(ctx.engine)
        out.update({dest: getattr(args, dest) for dest in ("cache_dir", "no_cache", "verbose") if hasattr(args, dest)})
        out["show_progress"] = not getattr(args, "no_progress", False)
        out["started"] = ctx.started
        return out

    def call(self, function: Callable[..., Any], args: argparse.Namespace, ctx: Context) -> Any:
        """``function(...)`` of :mod:`vllm_eval.api` with its parameters read from the flags of the same name, and
        :meth:`call_options` (the shared flags, backend and engine options)."""
        options = self.call_options(args, ctx)
        params = inspect.signature(function).parameters.values()
        named = {
            p.name: getattr(args, p.name)
            for p in params
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in options and hasattr(args, p.name)
        }
        return function(**named, **options)

    def execute(self, args: argparse.Namespace, ctx: Context | None) -> int:
        """Run the command; return the exit code."""
        raise NotImplementedError


def check_repeats(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """An option given twice is an error, not "the last one wins" (``--endpoint`` may repeat).

    Raises:
        UsageError: the first option given twice.
    """
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    command = next((t for t in argv if t in sub.choices), None)
    if command is None:
        return
    actions = {opt: a for a in sub.choices[command]._actions for opt in a.option_strings}  # noqa: SLF001
    seen: dict[str, str] = {}
    for tok in argv:
        if tok == "--":
            break
        action = actions.get(tok.split("=", 1)[0])
        if action is None or isinstance(action, argparse._AppendAction):  # noqa: SLF001
            continue
        if action.dest in seen:
            raise UsageError(f"{tok.split('=', 1)[0]} is given more than once")
        seen[action.dest] = tok
