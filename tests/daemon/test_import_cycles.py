"""No import cycle among krexd's modules, type-only imports included.

The graph is built from the source (AST), so ``if TYPE_CHECKING:`` imports
and imports inside functions count like the others.  Importing ``a.b.c``
also runs ``a/__init__`` and ``a/b/__init__``: those packages are edges too,
except the importer's own enclosing packages (already being imported when
it runs, so ``from krexd.cgroups import fs`` in ``krexd.cgroups.backend``
is an edge to ``fs`` only).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "krexd"


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in (ROOT / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(node: ast.AST, importer: str, is_pkg: bool, modules: set[str]) -> list[str]:
    """Modules of ``modules`` that one import statement runs."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg = importer if is_pkg else importer.rsplit(".", 1)[0]
            for _ in range(node.level - 1):
                pkg = pkg.rsplit(".", 1)[0]
            base = f"{pkg}.{base}" if base else pkg
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    out: list[str] = []
    own = set(_ancestors(importer))
    for name in names:
        if name not in modules or name in own:
            continue
        out.append(name)
        out.extend(a for a in _ancestors(name) if a in modules and a not in own)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the krexd modules it imports (directly, any kind of import)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges.update(_targets(node, name, is_pkg, known))
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(graph, white)
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = grey
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if color.get(m, black) == grey:
                return stack[stack.index(m) :] + [m]
            if color.get(m) == white:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = black
        return None

    for n in sorted(graph):
        if color[n] == white:
            found = visit(n)
            if found:
                return found
    return None


def test_the_graph_sees_type_only_and_package_imports() -> None:
    graph = import_graph()
    # ``if TYPE_CHECKING:`` import in control/admit.py
    assert "krexd.control.context" in graph["krexd.control.admit"]
    # importing krexd.memory.records runs krexd/memory/__init__.py
    assert "krexd.memory" in graph["krexd.tenants"]


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_krexd_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
