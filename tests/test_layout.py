"""The package's shape: at most 12 entries at the top, subsystem packages whose imports point down the layers
(docs/architecture.md), no file over 600 lines, no function over 100, no import cycle between modules.

Read from the source with ``ast`` (nothing is imported). An import inside a function counts as an
edge too: a lazy import hides a cycle from Python, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "vllm_eval"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 100
MAX_TOP_ENTRIES = 12
#: The subsystem packages, lowest first: a module imports from its own package or from one listed before it
#: (``testing`` builds test models from any layer; ``vllm_eval/__init__`` only re-exports lazily).
LAYERS = [
    "utils",
    "engine",
    "replicas",
    "models",
    "evaluation",
    "tasks",
    "measure",
    "api",
    "cli",
    "__main__",
    "testing",
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Package modules ``name`` imports (``from . import x`` resolved to ``pkg.x`` when that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_at_most_12_entries_at_the_top():
    entries = sorted(p.name for p in SRC.iterdir() if p.name != "__pycache__")
    assert len(entries) <= MAX_TOP_ENTRIES, entries
    assert {e.removesuffix(".py") for e in entries} <= {*LAYERS, "__init__"}, entries


def test_imports_point_down_the_layers():
    modules = _modules()
    up = []
    for name, path in modules.items():
        for target in _imports(name, path, set(modules)):
            here, there = _layer(name), _layer(target)
            if there == "__init__" and here != "__init__" and target == "vllm_eval":
                continue  # the package's version and lazy names
            if here != "__init__" and LAYERS.index(there) > LAYERS.index(here):
                up.append(f"{name} -> {target}")
    assert not up, up


def test_no_file_over_600_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def test_no_function_over_100_lines():
    long = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(SRC)}:{node.lineno} {node.name}"] = lines
    assert not long, long


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # A package's __init__ re-exporting its submodules is not a cycle with them: count edges between
    # modules that are not each other's package.
    for name, edges in graph.items():
        graph[name] = {e for e in edges if not e.startswith(name + ".") and not name.startswith(e + ".")}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


@pytest.mark.parametrize("command", ["run", "tasks"])
def test_a_command_is_one_module(command):
    from vllm_eval.cli import COMMANDS

    module = type(COMMANDS[command]).__module__
    assert module.startswith("vllm_eval.cli.commands."), module
