"""Values and functions of kaiko-eva's installed source, read where its modules cannot be imported.

eva's multimodal datasets and vLLM models import torchvision (and ``eva.vision``, monai) when imported; PyPI's
torchvision does not load beside the CPU build of torch that vLLM's CPU build needs ("operator torchvision::nms does
not exist"). What this project takes from those modules (a dataset's prompt kwargs, its file names and download
resources, a registered model's vLLM settings, a method's few lines) is read from eva's installed files here: the
module's imports that do load are run, then one class attribute is evaluated, or one function compiled, in that
namespace. Nothing is copied, so a new eva release's values are read as it ships them. Where the modules import
(kaiko-eva[vision] on a GPU machine), the tests compare these values with the imported ones.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import UsageError

#: What installs eva's code beside this project.
INSTALL_HINT = "pip install 'vllm-eval[eva]'"


def eva_root() -> Path:
    """The installed ``eva`` package's folder (found, not imported).

    Raises:
        UsageError: kaiko-eva is not installed.
    """
    spec = importlib.util.find_spec("eva")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"eva's tasks and presets need kaiko-eva, which is not installed: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def local_litellm_cost_map() -> None:
    """Call before anything imports ``eva.language``: it imports litellm, which fetches its model cost map from
    GitHub at import time and, offline, logs a warning for each of its retries. eva's tasks never price a call, so
    litellm's packaged copy serves (``LITELLM_LOCAL_MODEL_COST_MAP``; a value the user set is kept)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@lru_cache(maxsize=32)
def _parsed(relative: str) -> tuple[ast.Module, str]:
    path = eva_root() / relative
    if not path.is_file():
        raise UsageError(f"kaiko-eva has no {relative} (a release this project has not read); {INSTALL_HINT}")
    text = path.read_text(encoding="utf-8")
    return ast.parse(text, filename=str(path)), str(path)


def module_namespace(
    relative: str, extra: dict[str, Any] | None = None, needed: set[str] | None = None
) -> dict[str, Any]:
    """The names eva's module at ``relative`` (e.g. ``multimodal/data/datasets/multiple_choice/patch_camelyon.py``)
    would define at its top level, as far as they load here: each import statement on its own (those that fail are
    left out), then each top-level assignment whose value evaluates. ``extra`` fills in names first. With
    ``needed`` (the names the code to run reads), only the statements that bind them, or what those read, run: a
    file-name helper then needs ``os`` but not the ``eva.core`` import that costs Lightning's seconds."""
    tree, path = _parsed(relative)
    wanted = None if needed is None else _needed(tree, needed)
    local_litellm_cost_map()
    namespace: dict[str, Any] = {"__name__": f"eva_source:{relative}", **(extra or {})}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if wanted is not None and not (_bound(node) & (wanted | {"*"})):
                continue
            code = compile(ast.Module(body=[node], type_ignores=[]), path, "exec")
            try:
                exec(code, namespace)  # noqa: S102 - eva's own import line
            except Exception:  # noqa: BLE001 - torchvision, monai ...
                _constants_from_source(node, namespace)
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            if wanted is not None and not ({t.id for t in node.targets} & wanted):  # type: ignore[union-attr]
                continue
            try:
                value = eval(compile(ast.Expression(node.value), path, "eval"), namespace)  # noqa: S307
            except Exception:  # noqa: BLE001
                continue
            for target in node.targets:
                namespace[target.id] = value  # type: ignore[union-attr]
    return namespace


def _names(node: ast.AST) -> set[str]:
    """Every name ``node`` reads (``os`` of ``os.path.join``)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _needed(tree: ast.Module, names: set[str]) -> set[str]:
    """``names`` and what the top-level assignments that bind them read, transitively."""
    wanted = set(names)
    for node in reversed(tree.body):  # an assignment reads only what is bound above it
        if isinstance(node, ast.Assign) and {t.id for t in node.targets if isinstance(t, ast.Name)} & wanted:
            wanted |= _names(node.value)
    return wanted


def _bound(node: ast.Import | ast.ImportFrom) -> set[str]:
    """The names an import statement binds (``*`` for a star import, which :func:`module_namespace` always runs)."""
    return {alias.asname or alias.name.split(".")[0] for alias in node.names}


def _constants_from_source(node: ast.Import | ast.ImportFrom, namespace: dict[str, Any]) -> None:
    """``from eva.x.y import NAME`` whose module does not import here: NAME from that module's source, when it is a
    top-level value there (a preamble string, a URL template); other names stay undefined."""
    if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("eva."):
        return
    parts = node.module.split(".")[1:]  # type: ignore[union-attr]
    root = eva_root()
    for relative in ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])):
        if (root / relative).is_file() and relative not in _READING:
            _READING.add(relative)
            try:
                source = module_namespace(relative, needed={alias.name for alias in node.names})
            finally:
                _READING.discard(relative)
            for alias in node.names:
                if alias.name in source:
                    namespace[alias.asname or alias.name] = source[alias.name]
            return


#: Modules being read, so that two that import each other are read once.
_READING: set[str] = set()


def _class(relative: str, name: str) -> ast.ClassDef:
    tree, _ = _parsed(relative)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise UsageError(f"kaiko-eva's {relative} defines no class {name} (a release this project has not read)")


def class_attribute(relative: str, cls: str, attr: str, extra: dict[str, Any] | None = None) -> Any:
    """The value of class attribute ``cls.attr`` in eva's module ``relative``, evaluated in its namespace.

    Raises:
        UsageError: kaiko-eva missing, or no such class or attribute.
    """
    _, path = _parsed(relative)
    for node in _class(relative, cls).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == attr for t in targets) and node.value is not None:  # type: ignore[union-attr]
            expr = ast.Expression(node.value)  # type: ignore[union-attr]
            # Only the imports the value reads: a literal (eva's engine defaults) runs none of eva.language's.
            namespace = module_namespace(relative, extra, _names(node.value))  # type: ignore[union-attr]
            return eval(compile(expr, path, "eval"), namespace)  # noqa: S307
    raise UsageError(f"kaiko-eva's {cls} has no attribute {attr} (a release this project has not read)")


def class_function(relative: str, cls: str, name: str, extra: dict[str, Any] | None = None) -> Any:
    """Method ``cls.name`` of eva's module ``relative`` as a plain function (decorators dropped: ``@override``,
    ``@staticmethod`` ...), compiled in the module's namespace; call it with an object that has the attributes it
    reads as ``self`` (a static method: without).

    Raises:
        UsageError: kaiko-eva missing, or no such class or method.
    """
    _, path = _parsed(relative)
    for node in _class(relative, cls).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            bare = copy.deepcopy(node)
            bare.decorator_list, bare.returns = [], None
            bare.args = _without_annotations(bare.args)
            module = ast.fix_missing_locations(ast.Module(body=[bare], type_ignores=[]))
            namespace = module_namespace(relative, extra, _names(bare))
            exec(compile(module, path, "exec"), namespace)  # noqa: S102
            return namespace[name]
    raise UsageError(f"kaiko-eva's {cls} has no method {name} (a release this project has not read)")


def module_function(relative: str, name: str, extra: dict[str, Any] | None = None) -> Any:
    """Top-level function ``name`` of eva's module ``relative``, compiled as :func:`class_function` compiles a
    method (e.g. ``format_huggingface_message`` of ``multimodal/utils/text/messages.py``).

    Raises:
        UsageError: kaiko-eva missing, or no such function.
    """
    tree, path = _parsed(relative)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            bare = copy.deepcopy(node)
            bare.decorator_list, bare.returns = [], None
            bare.args = _without_annotations(bare.args)
            namespace = module_namespace(relative, extra, _names(bare))
            exec(compile(ast.fix_missing_locations(ast.Module(body=[bare], type_ignores=[])), path, "exec"), namespace)  # noqa: S102
            return namespace[name]
    raise UsageError(f"kaiko-eva's {relative} defines no function {name} (a release this project has not read)")


def _without_annotations(args: ast.arguments) -> ast.arguments:
    """The same parameters without annotations: they name types (torchvision's) that need not load here."""
    for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if a is not None:
            a.annotation = None
    return args


def registered_vllm_models(relative: str) -> dict[str, dict[str, Any]]:
    """eva's ``model_registry.register(name)`` classes built on its ``VllmModel`` in module ``relative``, by
    registered name: the keyword arguments their ``__init__`` passes to ``VllmModel`` (``model_name_or_path``,
    ``model_kwargs``, ``image_position`` ...), evaluated now (``VLLM_TENSOR_PARALLEL_SIZE`` is read from the
    environment as eva reads it); those that forward an ``__init__`` argument (``system_prompt``) are left out."""
    tree, path = _parsed(relative)
    namespace = module_namespace(relative)
    out: dict[str, dict[str, Any]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or not any(_base_name(b) == "VllmModel" for b in node.bases):
            continue
        names = [d.args[0].value for d in node.decorator_list if _is_register(d)]  # type: ignore[union-attr]
        init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if not names or init is None:
            continue
        params = {a.arg for a in (*init.args.args, *init.args.kwonlyargs)}
        call = next((c for c in ast.walk(init) if _is_super_init(c)), None)
        if call is None:
            continue
        kwargs = {}
        for kw in call.keywords:  # type: ignore[attr-defined]
            if kw.arg is None or {n.id for n in ast.walk(kw.value) if isinstance(n, ast.Name)} & params:
                continue
            kwargs[kw.arg] = eval(compile(ast.Expression(kw.value), path, "eval"), namespace)  # noqa: S307
        for name in names:
            out[name] = kwargs
    return out


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _is_register(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "register"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
    )


def _is_super_init(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "__init__"
        and isinstance(node.func.value, ast.Call)
        and _base_name(node.func.value.func) == "super"
    )
