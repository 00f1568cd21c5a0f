"""The Prometheus endpoint of a real krexd, read with prometheus_client's own parser.

Known events through the real stack over a fake GPU: regions entered by
``krex run`` commands, a region that outlives ``max_region_s`` (its command
ended by krex, the region recovered), a request krexd refuses.  The same
counters appear in ``status``.  The collector runs once per scrape only:
``krex_metrics_scrapes_total`` counts its calls, whatever the regions did.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from krex_client.connection import RemoteError
from tests.support import scrape, value

pytestmark = [pytest.mark.root]

PROG = os.path.join(os.path.dirname(__file__), "progs", "regions.py")


def test_endpoint_counts_known_events(krexd_factory: Any) -> None:
    k = krexd_factory(
        slots=2,
        config={"metrics": {"enabled": True, "port": 0}, "region": {"max_region_s": 1.0}},
    )
    port = k.status()["metrics"]["port"]
    first = scrape(port)
    assert value(first, "krex_metrics_scrapes_total") == 1
    assert value(first, "krex_regions_entered_total", gpu="0") == 0
    assert value(first, "krex_gpu_slots", gpu="0") == 2

    run = subprocess.run(
        [*k.krex, "run", "--", sys.executable, PROG, "5"], env=k.env, capture_output=True
    )
    assert run.returncode == 0, run.stderr.decode()
    held = subprocess.run(
        [*k.krex, "run", "--", sys.executable, PROG, "1", "10"], env=k.env, capture_output=True
    )
    assert held.returncode == 128 + 9, held.stderr.decode()  # max_region_s ended it
    with pytest.raises(RemoteError):
        k.request("no_such_op")

    m = scrape(port)
    assert value(m, "krex_metrics_scrapes_total") == 2  # 6 regions, 2 scrapes: 2 calls
    assert value(m, "krex_regions_entered_total", gpu="0") == 6
    assert value(m, "krex_regions_completed_total", gpu="0") == 5
    assert value(m, "krex_regions_recovered_total", gpu="0") == 1
    assert value(m, "krex_commands_ended_total", gpu="0", reason="max_region") == 1
    assert value(m, "krex_commands_ended_total", gpu="0", reason="drain_timeout") == 0
    assert value(m, "krex_requests_refused_total", code="UNKNOWN_OP") == 1
    assert value(m, "krex_region_entry_seconds_count", gpu="0") == 6
    assert value(m, "krex_region_entry_seconds_bucket", gpu="0", le="+Inf") == 6
    for step in ("drain", "freeze", "check"):
        assert value(m, "krex_region_entry_step_seconds_count", gpu="0", step=step) == 6
    assert value(m, "krex_region_hold_seconds_count", gpu="0") == 6
    assert value(m, "krex_region_hold_seconds_bucket", gpu="0", le="0.5") == 5
    assert value(m, "krex_region_hold_seconds_sum", gpu="0") >= 1.0
    assert value(m, "krex_region_drain_timeouts_total", gpu="0") == 0
    assert value(m, "krex_tenants", gpu="0", state="running") == 0
    assert value(m, "krex_gpu_slots_used", gpu="0") == 0
    assert value(m, "krex_daemon_restarts_total") == 0

    st = k.status()  # the same counters in status --json
    region = st["gpus"][0]["region"]
    assert region["regions"]["granted"] == 6
    assert region["regions"]["recovered"] == 1
    assert region["commands_ended"]["max_region"] == 1
    assert region["histograms"]["entry_ms"]["count"] == 6
    assert region["recent_entry_ms"]["n"] == 6
    assert st["server"]["refused"]["UNKNOWN_OP"] == 1
    assert st["daemon"]["restarts"] == 0
    assert st["metrics"]["scrapes"] == 2


def test_endpoint_is_off_by_default(krexd_factory: Any) -> None:
    k = krexd_factory()
    assert k.status()["metrics"] is None


def test_the_region_path_never_reaches_the_metrics_code() -> None:
    """No module of the region protocol imports prometheus_client or krexd.server.metrics, even
    indirectly: region entry only counts (krexd.coordinator.region_stats); formatting happens on a
    scrape, in the endpoint's thread (the scrape count above: one collection per scrape)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def imports(path: Path) -> set[str]:
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.add(node.module)
        return out

    def module_path(name: str) -> Path | None:
        base = root.joinpath(*name.split("."))
        for p in (base.with_suffix(".py"), base / "__init__.py"):
            if p.exists():
                return p
        return None

    start = sorted((root / "krexd" / "coordinator").glob("*.py"))  # region_stats.py among them
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imports(path):
            assert not name.startswith("prometheus_client"), f"{path} imports {name}"
            assert name != "krexd.server.metrics", f"{path} imports krexd.server.metrics"
            if name.startswith("krexd"):
                found = module_path(name)
                if found is not None:
                    todo.append(found)
    assert len(seen) > 20  # the walk followed the protocol's imports
