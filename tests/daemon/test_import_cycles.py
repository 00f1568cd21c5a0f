"""No import cycle among krexd's modules, and no import from a higher room.

krexd's modules live in rooms (one package each, ``ROOMS``, lowest first;
docs/design/architecture.md "Rooms"): a module imports only from its own
room or from lower ones, so no arrow runs back up and rooms form no cycle.

The graph is built from the source (AST), so ``if TYPE_CHECKING:`` imports
and imports inside functions count like the others.  Importing ``a.b.c``
also runs ``a/__init__`` and ``a/b/__init__``: those packages are edges too,
except the importer's own enclosing packages (already being imported when
it runs, so ``from krexd.cgroups import fs`` in ``krexd.cgroups.backend``
is an edge to ``fs`` only).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "krexd"

# krexd's rooms, lowest first: records and helpers low, orchestrators high.
ROOMS = (
    "config",
    "system",
    "gate",
    "hardware",
    "cgroups",
    "tenancy",
    "pools",
    "control",
    "coordinator",
    "memory",
    "orchestration",
    "restarts",
    "server",
    "daemon",
    "cli",
)
# The modules left at krexd's top and the room each belongs to; ``krexd`` itself
# (its ``__init__``, which imports nothing) is in none.
TOP = {
    "krexd.assembly": "daemon",
    "krexd.daemon": "daemon",
    "krexd.daemon_stop": "daemon",
    "krexd.__main__": "cli",
}


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


def room_of(module: str) -> str | None:
    """The room of a krexd module (None for ``krexd`` itself); KeyError for a stray one."""
    if module == PACKAGE:
        return None
    if module in TOP:
        return TOP[module]
    parts = module.split(".")
    if len(parts) < 3 and module not in _packages():
        raise KeyError(f"{module} is in no room: move it into one of {ROOMS}, or into TOP")
    return parts[1]


def _packages() -> set[str]:
    return {
        ".".join(path.relative_to(ROOT).parent.parts)
        for path in (ROOT / PACKAGE).rglob("__init__.py")
    }


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room -> the other rooms its modules import from."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        room = room_of(module)
        if room is None:
            continue
        out = rooms.setdefault(room, set())
        out.update(r for r in map(room_of, targets) if r is not None and r != room)
    return rooms


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module from a higher room, as ``importer (room) -> imported (room)``."""
    rank = {room: i for i, room in enumerate(ROOMS)}
    out = []
    for module, targets in graph.items():
        room = room_of(module)
        for target in targets:
            other = room_of(target)
            if room is not None and other is not None and rank[other] > rank[room]:
                out.append(f"{module} ({room}) -> {target} ({other})")
    return sorted(out)


def test_the_graph_sees_type_only_and_package_imports() -> None:
    graph = import_graph()
    # ``if TYPE_CHECKING:`` import in control/admit.py
    assert "krexd.control.context" in graph["krexd.control.admit"]
    # importing krexd.memory.learned runs krexd/memory/__init__.py
    assert "krexd.memory" in graph["krexd.restarts.state_files"]


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_krexd_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_module_is_in_a_room_and_every_room_is_a_package() -> None:
    graph = import_graph()
    rooms = {room_of(m) for m in graph} - {None}
    assert rooms == set(ROOMS), "rooms without modules, or modules in no listed room"
    packages = _packages()
    for room in ROOMS:
        if room not in TOP.values():
            assert f"{PACKAGE}.{room}" in packages, room


def test_no_module_imports_from_a_higher_room() -> None:
    up = arrows_up(import_graph())
    assert up == [], "imports from a higher room (move the module, or the name):\n" + "\n".join(up)


def test_the_rooms_form_no_cycle() -> None:
    assert find_cycle(room_graph(import_graph())) is None


def test_an_arrow_up_is_found() -> None:
    graph = {
        "krexd.system.procfs": {"krexd.tenancy.tenants"},
        "krexd.tenancy.tenants": {"krexd.system.procfs"},
    }
    assert arrows_up(graph) == ["krexd.system.procfs (system) -> krexd.tenancy.tenants (tenancy)"]
    assert room_graph(graph) == {"system": {"tenancy"}, "tenancy": {"system"}}


def test_the_architecture_page_lists_the_rooms_in_their_order() -> None:
    text = (ROOT / "docs" / "design" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## Rooms of krexd") :]
    rows = re.findall(r"^\| \d+ \| `?([a-z]+)/?`? \|", section, re.M)
    assert rows == list(ROOMS)
