"""The report's summary of region records (krex_cli/replay/regions.py), without krexd."""

from __future__ import annotations

import json
from pathlib import Path

from krex_cli.replay import regions


def _write(run: Path, name: str, recs: list[dict[str, object]], junk: str = "") -> None:
    (run / regions.DIR).mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in recs) + junk
    (run / regions.DIR / name).write_text(text)


def test_summary_counts_percentiles_and_warnings(tmp_path: Path) -> None:
    cold = {"kind": "cold_clock", "message": "..."}
    other = {"kind": "work_on_other_stream", "message": "..."}
    recs = [
        {"drain_ms": float(i), "freeze_ms": 1.0, "region_ms": 10.0 * i, "warnings": [cold]}
        for i in range(1, 101)
    ]
    recs[0]["warnings"] = [cold, other]
    _write(tmp_path, regions.log_name(0, 0, 1).split("/")[1], recs[:50])
    # A command killed mid-write leaves a partial last line: skipped.
    _write(tmp_path, regions.log_name(0, 1, 1).split("/")[1], recs[50:], junk='{"drain_ms": 3')
    s = regions.summarize(regions.load(tmp_path))
    assert s["regions"] == 100
    assert s["drain_ms"]["p50"] == 50.5 and s["drain_ms"]["p99"] == 99.01
    assert s["freeze_ms"] == {"p50": 1.0, "p99": 1.0}
    assert s["warnings"] == {"cold_clock": 100, "work_on_other_stream": 1}
    lines = regions.markdown({"krex": s, "native": regions.summarize([])})
    assert lines[0] == "## Regions"
    rows = [ln for ln in lines if ln.startswith("| krex")]
    assert rows == [
        "| krex | 100 | 50.50 / 99.01 | 1.00 / 1.00 | 505.00 / 990.10 "
        "| cold_clock 100, work_on_other_stream 1 |"
    ]
    assert not any(ln.startswith("| native") for ln in lines)  # no regions, no row


def test_a_run_without_regions_has_no_section(tmp_path: Path) -> None:
    s = regions.summarize(regions.load(tmp_path))
    assert s == {
        "regions": 0,
        "drain_ms": {"p50": None, "p99": None},
        "freeze_ms": {"p50": None, "p99": None},
        "region_ms": {"p50": None, "p99": None},
        "warnings": {},
    }
    assert regions.markdown({"native": s}) == []
