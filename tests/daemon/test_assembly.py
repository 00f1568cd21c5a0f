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


def test_no_part_is_attached_after_the_daemon_built_it() -> None:
    # The daemon writes no attribute of a part (the wiring is by construction, in
    # krexd.assembly): no `x.y = ...` but on the daemon itself.
    tree = ast.parse((ROOT / "krexd" / "daemon.py").read_text())
    writes = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            chain = t.elts if isinstance(t, ast.Tuple) else [t]
            for a in chain:
                own = isinstance(a, ast.Attribute) and ast.unparse(a.value) == "self"
                if isinstance(a, ast.Attribute) and not own:
                    writes.append(ast.unparse(a))
    # Left: the runtime's state (serving, restarting: a state, not wiring), the restart
    # counter the state keeper saves, and the server's save-before-reply hook (both set
    # once the state keeper exists, after adoption).
    known = ["self.continuity.keeper.restarts", "self.server.after_op", "self.runtime.state"]
    assert sorted(writes) == sorted(known), writes
