"""Lazy package exports, and the import paths of modules that moved.

``import vllm_eval`` (and ``--help``, ``tasks``) must not import vLLM or torch: names are imported on
first use. Modules that moved to another package keep their old dotted path (``vllm_eval.results`` is
``vllm_eval.evaluation.results``): the old name imports the module at its new place, under one module
object, with a ``DeprecationWarning`` naming the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``name`` from ``package.<names[name]>`` on first use.

    Raises:
        AttributeError: ``name`` is not one of ``names``.
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(f".{names[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``package.<old>`` (and its submodules) as the module at ``package.<new>``."""

    def __init__(self, package: str, moves: dict[str, str]) -> None:
        self.moves = {f"{package}.{old}": f"{package}.{new}" for old, new in moves.items()}

    def new_name(self, fullname: str) -> str | None:
        """The module's dotted path now, or None when ``fullname`` did not move."""
        for old in sorted(self.moves, key=len, reverse=True):
            if fullname == old or fullname.startswith(old + "."):
                return self.moves[old] + fullname[len(old) :]
        return None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if self.new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        new = self.new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the module was imported at its new path."""


def keep_moved_paths(package: str, moves: dict[str, str]) -> None:
    """Let ``package.<old>`` import ``package.<new>`` for every entry of ``moves`` (dotted, relative to
    ``package``). Installed once, first in ``sys.meta_path``, so that an old name is never loaded as a second
    copy of the module from its new folder."""
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules(package, moves))
