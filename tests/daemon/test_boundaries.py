"""What the product's source may not contain: a second gate layout, or the test tree.

* The gate's layout is declared once, in ``libkrex_shim/include/krex_gate.h``;
  Python reaches it only through the ``krexd/gate/`` package (ctypes on
  ``libkrex_gate.so``; its structures declared in ``krexd/gate/binding.py``).
  No other module maps a file, declares a C structure, names gate offsets or
  bit shifts, or carries the gate's magic.
* No product module imports, runs or describes a file of ``tests/``.

These read the source text: they fail the moment such a line is added.
"""

from __future__ import annotations

import re

from tests.support import REPO

PRODUCT = [REPO / "krexd", REPO / "krex_cli", REPO / "python_client"]

#: The one module that declares the gate's C structures (ctypes on libkrex_gate.so).
GATE_BINDING = "krexd/gate/binding.py"

#: Modules that may map a file, and why.  krexd/gate/ maps nothing itself (the C library does).
MMAP_ALLOWED = {
    "krexd/memory/sources.py": "the simulated GPU memory-state file (docs/design/interfaces.md)",
}

#: Files that declare ctypes structures of another binary interface than the gate's.
STRUCT_ALLOWED = {
    "krexd/hardware/driverlock.py": "the CUDA driver's checkpoint-lock arguments (cuda.h)",
}

GATE_LAYOUT = [
    re.compile(r"ctypes\.Structure"),
    re.compile(r"\b\w*(SLOT|HEADER|GATE|NSLOTS|MEM_SEQ|OOM)\w*_(OFF|SHIFT|BYTES)\b"),
    re.compile(r"0x4554_?4147_?5845_?524B|KREXGATE", re.IGNORECASE),
    re.compile(r"gatemem|GateMemory"),
]
TEST_TREE = re.compile(r"\btests/|\bfrom tests\b|\bimport tests\b|\btests\.[a-z_]+\.")


def product_sources() -> list[tuple[str, str]]:
    """(path relative to the repository, text) of every Python file of the product."""
    return [
        (str(p.relative_to(REPO)), p.read_text())
        for root in PRODUCT
        for p in sorted(root.rglob("*.py"))
    ]


def test_the_gate_layout_is_declared_only_in_the_header_and_bound_only_in_the_binding() -> None:
    found = []
    for rel, text in product_sources():
        if rel == GATE_BINDING:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            patterns = GATE_LAYOUT[1:] if rel in STRUCT_ALLOWED else GATE_LAYOUT
            if any(p.search(line) for p in patterns):
                found.append(f"{rel}:{n}: {line.strip()}")
            if re.search(r"\bmmap\b", line) and rel not in MMAP_ALLOWED:
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "a second gate layout or mapping:\n" + "\n".join(found)


def test_the_gate_binding_reads_slots_only_through_the_library() -> None:
    for path in sorted((REPO / "krexd" / "gate").glob("*.py")):
        text = path.read_text()
        assert "mmap" not in text and "struct.unpack" not in text, path.name
    # the memory fields come decoded from C
    assert "krex_coord_slots" in (REPO / GATE_BINDING).read_text()


def test_no_product_module_refers_to_the_test_tree() -> None:
    found = [
        f"{rel}:{n}: {line.strip()}"
        for rel, text in product_sources()
        for n, line in enumerate(text.splitlines(), 1)
        if TEST_TREE.search(line)
    ]
    assert not found, "product code refers to tests/:\n" + "\n".join(found)
