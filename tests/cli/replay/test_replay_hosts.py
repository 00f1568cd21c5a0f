"""Per-host throughput of a replay over a Ray cluster, and ``--ray``'s argument checks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from krex_cli.replay import hosts
from krex_cli.replay.cli import build_parser, main


def rec(host: str | None, start: float, end: float, ok: bool = True) -> dict[str, Any]:
    r: dict[str, Any] = {"start": start, "end": end, "exit_code": 0 if ok else 1}
    r["result"] = {"median_ms": 1.0} if ok else None
    if not ok:
        r["error"] = "exit code 1"
    if host is not None:
        r["host"] = host
    return r


def test_hosts_share_the_runs_window_and_add_up_to_the_cluster() -> None:
    records = [
        rec("a", 100.0, 110.0),
        rec("a", 110.0, 130.0),
        rec("b", 100.0, 160.0),
        rec("b", 100.0, 120.0, ok=False),
    ]
    s = hosts.summarize(records, {"started": 100.0, "duration_s": None})
    # Window: 100 .. 160 s, one minute for every host.
    assert s["hosts"]["a"] == {"commands": 2, "completed": 2, "cmds_per_min": 2.0}
    assert s["hosts"]["b"] == {"commands": 2, "completed": 1, "cmds_per_min": 1.0}
    assert s["cluster"]["cmds_per_min"] == 3.0
    assert sum(h["cmds_per_min"] for h in s["hosts"].values()) == s["cluster"]["cmds_per_min"]
    # With --duration only completions within it count, over it.
    s = hosts.summarize(records, {"started": 100.0, "duration_s": 30.0})
    assert s["hosts"]["a"]["cmds_per_min"] == 4.0 and s["hosts"]["b"]["cmds_per_min"] == 0.0
    lines = hosts.lines(s)
    assert lines[0].startswith("a: 4.0 cmds/min (2/2") and lines[-1].startswith("cluster: 4.0")
    md = "\n".join(hosts.markdown({"ray": s}))
    assert "## Hosts" in md and "| ray | **cluster** | 4 | 3 | 4.0 |" in md


def test_runs_without_hosts_have_no_hosts_section() -> None:
    s = hosts.summarize([rec(None, 0.0, 1.0)], {"started": 0.0})
    assert s["hosts"] == {} and hosts.markdown({"native": s}) == []
    assert math.isnan(hosts.summarize([], {})["cluster"]["cmds_per_min"])


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--mode", "native"], "mode krex only"),
        (["--mode", "krex", "--socket", "/s"], "--socket: not with --ray"),
        (["--mode", "krex", "--concurrency", "2", "--gpus", "0"], "--gpus, --concurrency"),
    ],
)
def test_ray_refuses_what_the_hosts_krexds_decide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    args = build_parser().parse_args(
        ["trace.jsonl", "--ray", "h:6379", "--out", str(tmp_path), *extra]
    )
    assert main(args) == 1
    assert says in capsys.readouterr().err
