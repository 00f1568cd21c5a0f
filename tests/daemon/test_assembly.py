"""krexd.assembly's ender port, and the order the parts are built in.

The port is what breaks the coordinator -> lifecycle -> GPUs -> coordinator
cycle: given to the coordinators before the lifecycle exists, bound once.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from krexd.assembly import TenantEnder

ROOT = Path(__file__).resolve().parents[2]


def test_the_ender_routes_each_end_to_what_it_was_bound_to() -> None:
    ender = TenantEnder()
    ended: list[tuple[Any, ...]] = []
    with pytest.raises(RuntimeError, match="no lifecycle"):
        ender(object(), "unprotected GPU use", 79)  # type: ignore[arg-type]
    ender.bind(lambda tenant, reason, code, cause="other": ended.append((reason, code, cause)))
    ender(object(), "unprotected GPU use", 79, "fail_closed")  # type: ignore[arg-type]
    assert ended == [("unprotected GPU use", 79, "fail_closed")]
    with pytest.raises(RuntimeError, match="bound already"):
        ender.bind(lambda *a, **k: None)


def _attribute_writes(path: Path) -> list[str]:
    """Every ``x.y = ...`` of ``path`` whose target is not an attribute of ``self``."""
    writes = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for t in targets:
            chain = t.elts if isinstance(t, ast.Tuple) else [t]
            for a in chain:
                own = isinstance(a, ast.Attribute) and ast.unparse(a.value) == "self"
                if isinstance(a, ast.Attribute) and not own:
                    writes.append(ast.unparse(a))
    return writes


def test_no_part_is_attached_after_the_daemon_built_it() -> None:
    # The daemon writes no attribute of a part (the wiring is by construction, in
    # krexd.assembly): no `x.y = ...` but on the daemon itself (the runtime's state
    # changes through its guard, RunState's edges).
    writes = _attribute_writes(ROOT / "krexd" / "daemon.py")
    assert writes == [], writes


def test_the_assembly_attaches_nothing_to_a_part_it_built() -> None:
    # Every part gets what it uses as constructor arguments: no attribute written
    # after construction (the drains' judge is the gate's constructor argument, the
    # memory policy admission's), no part bound afterwards but the ender port.
    # Only the record of what a failed start must undo (``Built``) is written as parts
    # are made.
    path = ROOT / "krexd" / "assembly.py"
    assert [w for w in _attribute_writes(path) if not w.startswith("built.")] == []
    text = path.read_text()
    assert "functools.partial" not in text and "lambda" not in text
    assert text.count(".bind(") == 1 and "ender.bind(lifecycle.kill_command)" in text


def test_admission_has_no_setter_for_its_memory_policy() -> None:
    from krexd.tenancy.admission import Admission

    assert not hasattr(Admission, "use_memory")
