"""The library's imports point down (DESIGN.md, "The library and the lab").

Every module under flashbook/ is parsed, not imported, and every flashbook import it
makes, at the top or inside a function, relative or absolute, is an edge of one graph:

- the graph has no cycle;
- the kernels never import the benchmark package (``flashbook.timing`` serves both);
- the figures (``flashbook.plots``) never reach a feature module, even through another;
- no module is longer than 600 lines.
"""
import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = Path(ROOT) / "flashbook"
MAX_LINES = 600
#: What a figure must not reach: the modules that run or measure kernels, or show explorers.
FEATURES = ("flashbook.distributed", "flashbook.kernels", "flashbook.bench", "flashbook.explorers",
            "flashbook.widgets", "flashbook.live", "flashbook.exercises", "flashbook.grade")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _nearest_module(name: str) -> str | None:
    """``name`` if it is a module of the library, else the module it is an attribute of."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def imports(name: str) -> set:
    """The library modules that module ``name`` imports, anywhere in its body."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from . import plots` imports the module flashbook.plots; `from .tiles import X`
            # imports flashbook.plots.tiles, whatever X is
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            if _within(target, ("flashbook",)):
                found.add(_nearest_module(target))
    found.discard(name)
    return found


GRAPH = {name: imports(name) for name in MODULES}


def reachable(start: str) -> set:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_is_read_from_the_sources():
    assert {"flashbook", "flashbook.tiled", "flashbook.kernels.configs", "flashbook.plots.tiles",
            "flashbook.explorers.widget"} <= set(GRAPH)
    assert "flashbook.tiled" in GRAPH["flashbook.plots.tiles"]            # from .. import tiled
    assert "flashbook.plots.tiles" in GRAPH["flashbook.plots"]            # from .tiles import ...
    assert "flashbook.smem" in GRAPH["flashbook.kernels.configs"]         # from .. import runtime, smem
    assert "flashbook.bench" in GRAPH["flashbook.explorers.sweep"]        # inside a function
    assert "flashbook.kernels.dispatch" in GRAPH["flashbook"]             # inside __getattr__


def test_no_import_cycle():
    """Depth-first search; a cycle is reported as the modules along it."""
    state, stack = {}, []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for nxt in sorted(GRAPH[name]):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)


def test_kernels_never_import_the_benchmarks():
    wrong = {name: sorted(t for t in GRAPH[name] if _within(t, ("flashbook.bench",)))
             for name in GRAPH if _within(name, ("flashbook.kernels",))}
    assert not {k: v for k, v in wrong.items() if v}, wrong


def test_figures_never_reach_a_feature_module():
    figures = [name for name in GRAPH if _within(name, ("flashbook.plots",))]
    assert "flashbook.plots" in figures
    wrong = {name: sorted(t for t in reachable(name) if _within(t, FEATURES)) for name in figures}
    assert not {k: v for k, v in wrong.items() if v}, wrong


def test_every_module_is_at_most_600_lines():
    lengths = {str(p.relative_to(PACKAGE.parent)): len(p.read_text(encoding="utf-8").splitlines())
               for p in MODULES.values()}
    long = {path: n for path, n in lengths.items() if n > MAX_LINES}
    assert not long, f"split these by idea: {long}"
