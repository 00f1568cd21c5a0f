"""The shim's include layering (docs/design/shim.md "Layering").

Every C source and header of ``libkrex_shim/`` belongs to one layer, listed here from the
bottom up.  A file includes only headers of its own layer or of a layer below it, the
quoted includes form no cycle, and a file of ``gate/`` or ``include/`` sees nothing of
``tenant/``.  A new file must be placed in a layer here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SHIM = Path(__file__).resolve().parents[2] / "libkrex_shim"

#: Bottom first: (layer, files relative to libkrex_shim/).
LAYERS: list[tuple[str, list[str]]] = [
    ("layout", ["include/krex_gate.h"]),
    (
        "gate",
        [
            "gate/testhook.h",
            "gate/testhook.c",
            "gate/procid.h",
            "gate/procid.c",
            "gate/gate_internal.h",
            "gate/gate.c",
            "gate/coord_internal.h",
            "gate/coord.c",
            "gate/coord_protocol.c",
        ],
    ),
    (
        "base",
        [
            "tenant/base.h",
            "tenant/base.c",
            "tenant/entrypoints.gen.h",
            "tenant/hip_entrypoints.gen.h",
            "tenant/hip_entrypoints.gen.c",
        ],
    ),
    ("state", ["tenant/state.h", "tenant/state.c", "tenant/marks.h", "tenant/marks.c"]),
    (
        "driver",
        [
            "tenant/interpose.h",
            "tenant/interpose.c",
            "tenant/dlguard.h",
            "tenant/dlguard.c",
            "tenant/dl_x86_64.S",
            "tenant/fault.h",
            "tenant/fault.c",
            "tenant/hipinterpose.h",
            "tenant/hipinterpose.c",
        ],
    ),
    (
        "observe",
        [
            "tenant/bind.h",
            "tenant/bind.c",
            "tenant/memory.h",
            "tenant/memory.c",
            "tenant/track.h",
            "tenant/track.c",
            "tenant/hiptrack.h",
            "tenant/hiptrack.c",
        ],
    ),
    ("drain", ["tenant/drain.h", "tenant/drain.c", "tenant/hipdrain.h", "tenant/hipdrain.c"]),
    ("region", ["tenant/l2flush.h", "tenant/l2flush.c", "tenant/region.h", "tenant/region.c"]),
    ("process", ["tenant/shim.h", "tenant/shim.c"]),
    ("call", ["tenant/call.h", "tenant/hipcall.h"]),
    ("hooks", ["tenant/entrypoints.gen.c", "tenant/hip_hooks.gen.c"]),
]

#: Where each folder's quoted includes are found (the Makefile's -I order).
SEARCH = {
    "include": ["include"],
    "gate": ["gate", "include"],
    "tenant": ["tenant", "gate", "include"],
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def layer_of() -> dict[str, int]:
    return {f: i for i, (_, files) in enumerate(LAYERS) for f in files}


def quoted_includes(rel: str) -> list[str]:
    """The files ``rel`` includes with quotes, each resolved as the compiler would."""
    folder = rel.split("/", 1)[0]
    out = []
    for name in INCLUDE.findall((SHIM / rel).read_text()):
        here = [f"{d}/{name}" for d in SEARCH[folder] if (SHIM / d / name).is_file()]
        out.append(here[0] if here else f"?/{name}")
    return out


def graph() -> dict[str, list[str]]:
    return {f: quoted_includes(f) for _, files in LAYERS for f in files}


def upward(g: dict[str, list[str]], layers: dict[str, int]) -> list[str]:
    """Each include of a header above the includer's layer (or of no known header)."""
    return [
        f"{f} ({LAYERS[layers[f]][0]}) includes {h}"
        + (f" ({LAYERS[layers[h]][0]})" if h in layers else " (in no layer)")
        for f, hs in g.items()
        for h in hs
        if h not in layers or layers[h] > layers[f]
    ]


def cycle(g: dict[str, list[str]]) -> list[str]:
    """One include cycle as its files, or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(f: str) -> list[str]:
        state[f] = 1
        path.append(f)
        for h in g.get(f, []):
            if state.get(h) == 1:
                return path[path.index(h) :] + [h]
            if h not in state and (found := visit(h)):
                return found
        path.pop()
        state[f] = 2
        return []

    for f in g:
        if f not in state and (found := visit(f)):
            return found
    return []


def test_every_source_is_in_a_layer() -> None:
    sources = {
        str(p.relative_to(SHIM))
        for p in SHIM.rglob("*")
        if p.suffix in (".c", ".h", ".S") and "tools" not in p.relative_to(SHIM).parts
    }
    listed = set(layer_of())
    assert sources - listed == set(), "place these files in a layer of tests/shim/test_layers.py"
    assert listed - sources == set(), "listed here but gone"


def test_includes_run_down_the_layers() -> None:
    assert upward(graph(), layer_of()) == []


def test_includes_form_no_cycle() -> None:
    assert cycle(graph()) == []


def test_the_gate_sees_nothing_of_the_tenant() -> None:
    g = graph()
    assert [
        (f, h)
        for f, hs in g.items()
        if not f.startswith("tenant/")
        for h in hs
        if h.startswith("tenant/")
    ] == []


def test_one_definition_of_the_layout() -> None:
    """``struct krex_gate`` is defined in include/krex_gate.h alone."""
    defining = [
        str(p.relative_to(SHIM))
        for p in SHIM.rglob("*.[ch]")
        if re.search(r"^struct krex_gate\s*\{", p.read_text(), re.MULTILINE)
    ]
    assert defining == ["include/krex_gate.h"]


@pytest.mark.parametrize(
    ("g", "layers", "up", "cyc"),
    [
        # A unit including a header above it.
        ({"a.h": [], "b.h": ["a.h"], "a.c": ["b.h"]}, {"a.h": 0, "a.c": 0, "b.h": 1}, 1, []),
        # Two headers of one layer including each other.
        ({"a.h": ["b.h"], "b.h": ["a.h"]}, {"a.h": 0, "b.h": 0}, 0, ["a.h", "b.h", "a.h"]),
        # The layered shape: no finding.
        ({"a.h": [], "b.h": ["a.h"], "b.c": ["b.h", "a.h"]}, {"a.h": 0, "b.h": 1, "b.c": 1}, 0, []),
    ],
)
def test_the_checks_find_what_they_look_for(
    g: dict[str, list[str]], layers: dict[str, int], up: int, cyc: list[str]
) -> None:
    """The checks themselves, on small made-up graphs (a cycle, an upward include)."""
    assert len(upward(g, layers)) == up
    assert cycle(g) == cyc
