"""benchmarks/autotune_fidelity.py's reading of region records and autotuner output.

The benchmark needs a GPU; what it makes of its commands' output and of the
region records (docs/design/region-log.md) is checked here on records
written by hand.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "autotune_fidelity", ROOT / "benchmarks" / "autotune_fidelity.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    return mod


def _rec(pid: int, entry: int | None, warmed: int | None, kind: str, ms: float) -> dict[str, Any]:
    stop = "warm" if kind != "none" else "warm_at_entry"
    return {
        "pid": pid,
        "device": {"sm_clock_max_mhz": 1980},
        "entry": {"sm_clock_mhz": entry},
        "warmed": {"sm_clock_mhz": warmed},
        "warmup": {"kind": kind, "ms": ms, "stop": stop},
        "warnings": [{"kind": "cold_clock", "message": ""}] if (warmed or 0) < 1584 else [],
    }


def test_gap_between_the_two_fastest(bench: ModuleType) -> None:
    assert bench.gap_pct([[1.0, "a"], [1.07, "b"], [2.0, "c"]]) == pytest.approx(7.0)
    assert bench.gap_pct([[1.0, "a"]]) is None and bench.gap_pct([[0.0, "a"], [1, "b"]]) is None


def test_region_summary_reports_start_clocks_warm_ups_and_per_command_spread(
    bench: ModuleType,
) -> None:
    recs = [
        _rec(10, 1200, 1900, "matmul", 30.0),
        _rec(10, 1950, 1950, "none", 0.0),
        _rec(11, 1000, 1500, "matmul", 100.0),
        _rec(11, 1800, 1800, "none", 0.0),
    ]
    s = bench.region_summary(recs)
    assert s["regions"] == 4 and s["sm_clock_max_mhz"] == 1980
    assert s["entry_mhz"] == {"min": 1000, "median": 1800, "max": 1950, "n": 4}
    assert s["start_mhz"] == {"min": 1500, "median": 1900, "max": 1950, "n": 4}
    assert s["start_below_pct"] == {"80": 1, "90": 1}  # 1500 < 1584; 1782 <= 1800
    assert s["warmup"]["kind"] == {"matmul": 2, "none": 2}
    assert s["warmup"]["stop"] == {"warm": 2, "warm_at_entry": 2}
    assert s["warmup"]["ms"] == {"min": 30.0, "median": 100.0, "max": 100.0, "n": 2}
    # pid 10: 1950 - 1900; pid 11: 1800 - 1500.
    assert s["per_command_start_spread_mhz"] == {"min": 50, "median": 300, "max": 300, "n": 2}
    assert s["warnings"] == {"cold_clock": 1}
    empty = bench.region_summary([])
    assert empty["regions"] == 0 and empty["start_mhz"] is None


def test_the_printed_report_names_each_mode(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    win, other = "BM: 128", "BM: 64"
    cmd = {"pick": win, "pid": 10, "ranked": [], "gap_pct": 5.0}
    miss = dict(cmd, pick=other, gap_pct=0.5)
    result = {
        "serial": [win],
        "winner": win,
        "trials": {"auto-regions": [[win, other]], "unprotected": [[win, win]]},
        "regions": {"auto-regions": 16, "unprotected": 0},
        "per_command": {"serial": [[cmd]], "auto-regions": [[cmd, miss]], "unprotected": []},
        "region_summary": {
            "serial": bench.region_summary([_rec(10, 1200, 1900, "matmul", 30.0)]),
            "auto-regions": bench.region_summary([_rec(11, 1000, 1500, "memset", 100.0)]),
            "unprotected": bench.region_summary([]),
        },
    }
    bench._print(result)
    out = capsys.readouterr().out
    assert "auto-regions       1          0/1" in out
    assert "per command (* missed the winner): 5.00 0.50*" in out
    assert "unprotected   no regions" in out
    assert "warm-up kinds {'memset': 1}" in out
