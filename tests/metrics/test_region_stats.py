"""RegionStats' histograms and counters (no krexd): cumulative buckets, causes, codes."""

from __future__ import annotations

from krexd.coordinator.region_stats import ENDED_CAUSES, Histogram, RegionStats


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram([1, 10])
    for v in (0.5, 1, 5, 50):
        h.observe(v)
    assert h.cumulative() == [(1.0, 2), (10.0, 3), (float("inf"), 4)]
    assert h.as_dict() == {"le": [1.0, 10.0, "+Inf"], "counts": [2, 3, 4], "sum": 56.5, "count": 4}


def test_stats_count_entries_refusals_and_ends() -> None:
    s = RegionStats()
    s.grant(0.2, 0.8)
    s.steps([("locked", 0.0), ("close", 0.0001), ("drain", 0.0021), ("freeze", 0.0031)])
    s.held(0.25)
    s.refuse("DRAIN_TIMEOUT")
    s.refuse("FREEZE_TIMEOUT")
    s.end("contaminated")
    s.end("nonsense")
    d = s.as_dict()
    assert d["regions"]["failed"] == 2
    assert d["regions"]["refused"] == {"DRAIN_TIMEOUT": 1, "FREEZE_TIMEOUT": 1}
    assert (d["regions"]["drain_timeouts"], d["regions"]["freeze_timeouts"]) == (1, 1)
    assert d["commands_ended"]["contaminated"] == 1 and d["commands_ended"]["other"] == 1
    assert set(d["commands_ended"]) == set(ENDED_CAUSES)
    assert d["histograms"]["entry_ms"]["count"] == 1
    assert d["histograms"]["steps_ms"]["drain"]["counts"][-1] == 1
    assert d["histograms"]["hold_s"]["sum"] == 0.25
    assert d["recent_entry_ms"]["n"] == 1 and d["recent_entry_ms"]["p50"] == 1.0
