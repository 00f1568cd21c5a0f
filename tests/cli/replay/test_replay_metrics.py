"""Replay metrics on synthetic data whose answers are worked out by hand here."""

from __future__ import annotations

import math
from typing import Any

import pytest

from krex_cli.replay import metrics
from krex_cli.replay.metrics import Ratio, Sample
from krex_cli.replay.report import flip_cell


def test_p95_inflation_linear_interpolation() -> None:
    # 20 ratios: nineteen 1.0 and one 2.0.  p95 position = 0.95 * 19 = 18.05,
    # between v[18] = 1.0 and v[19] = 2.0: 1.0 + 0.05 * 1.0 = 1.05 -> P = 5 %.
    assert metrics.p95_inflation([1.0] * 19 + [2.0]) == pytest.approx(5.0)
    # Deflation gives a negative P: all 0.98 -> -2 %.
    assert metrics.p95_inflation([0.98] * 7) == pytest.approx(-2.0)
    assert math.isnan(metrics.p95_inflation([]))


def test_median_and_within_share() -> None:
    vals = [0.94, 0.96, 1.0, 1.05, 1.2]
    assert metrics.median_ratio(vals) == 1.0
    # within 5 %: 0.96, 1.0 and 1.05 (the bound counts); 0.94 and 1.2 do not.
    assert metrics.within_share(vals) == pytest.approx(3 / 5)
    assert math.isnan(metrics.within_share([]))


def test_samples_skip_failed_and_bad_values() -> None:
    recs: list[dict[str, Any]] = [
        {
            "exit_code": 0,
            "result": {"task": "t", "candidate": "a", "median_ms": 2.0, "mean_ms": 2.5},
        },
        {"exit_code": 1, "result": {"task": "t", "candidate": "b", "median_ms": 1.0}},
        {"exit_code": 0, "result": None},
        {"exit_code": 0, "result": {"task": "t", "candidate": "c", "median_ms": float("nan")}},
        {"exit_code": 0, "result": {"task": "t", "candidate": "d", "median_ms": 0.0}},
    ]
    assert metrics.samples(recs, "median") == [Sample("t", "a", 2.0)]
    assert metrics.samples(recs, "mean") == [Sample("t", "a", 2.5)]


def test_reference_is_median_per_key_and_ratios() -> None:
    ref = metrics.per_key(
        [Sample("t", "a", 1.0), Sample("t", "a", 3.0), Sample("t", "a", 2.0), Sample("t", "b", 4.0)]
    )
    assert ref == {("t", "a"): 2.0, ("t", "b"): 4.0}
    rs = metrics.ratios([Sample("t", "a", 3.0), Sample("t", "b", 2.0), Sample("u", "x", 1.0)], ref)
    # u/x has no reference and is left out.
    assert [(r.key, r.ratio, r.ref_ms) for r in rs] == [
        (("t", "a"), 1.5, 2.0),
        (("t", "b"), 0.5, 4.0),
    ]


def test_summary_bands_and_thresholds() -> None:
    rs = [
        Ratio(("t", "a"), 1.10, 0.05),  # < 0.1 ms
        Ratio(("t", "b"), 1.02, 0.5),  # 0.1-1 ms
        Ratio(("t", "c"), 1.00, 5.0),  # 1-10 ms
        Ratio(("t", "d"), 0.99, 20.0),  # >= 10 ms
    ]
    s = metrics.summarize(rs)
    assert s["n"] == 4
    # Overall p95 of [0.99, 1.0, 1.02, 1.10]: pos 2.85 -> 1.02 + 0.85 * 0.08 = 1.088.
    assert s["P"] == pytest.approx(8.8)
    assert s["P_gt"][">10ms"] == pytest.approx(-1.0)
    # > 1 ms: [0.99, 1.0]: pos 0.95 -> 0.99 + 0.95 * 0.01 = 0.9995.
    assert s["P_gt"][">1ms"] == pytest.approx(-0.05)
    # > 0.1 ms: [0.99, 1.0, 1.02]: pos 1.9 -> 1.0 + 0.9 * 0.02 = 1.018.
    assert s["P_gt"][">0.1ms"] == pytest.approx(1.8)
    assert s["bands"]["<0.1ms"]["n"] == 1
    assert s["bands"]["<0.1ms"]["P"] == pytest.approx(10.0)
    assert s["bands"][">=10ms"]["median_ratio"] == pytest.approx(0.99)
    assert s["within5"] == pytest.approx(3 / 4)


def test_flip_rates_by_gap_with_ties() -> None:
    ref = {
        ("T", "a"): 1.0,
        ("T", "b"): 1.005,
        ("T", "c"): 1.15,
        ("T", "d"): 1.0,
        ("U", "x"): 2.0,
        ("U", "y"): 2.06,
        ("U", "z"): 9.0,
    }
    measured = {
        ("T", "a"): 1.01,
        ("T", "b"): 1.0,
        ("T", "c"): 1.2,
        ("T", "d"): 1.0,
        ("U", "x"): 2.1,
        ("U", "y"): 2.0,  # U/z was not measured: its pairs do not count
    }
    # T pairs: (a,b) gap 0.5 % -> 0-1 %, flipped (1.01 > 1.0);
    #          (a,c) 15 % -> 10-20 %, kept; (a,d) tied in the reference: left out;
    #          (b,c) 14.4 % -> 10-20 %, kept; (b,d) 0.5 % -> 0-1 %, measured tie: a flip;
    #          (c,d) 15 % -> 10-20 %, kept.
    # U pairs: (x,y) 3 % -> 2-5 %, flipped.
    got = {b.name: (b.pairs, b.flips) for b in metrics.flip_rates(ref, measured)}
    assert got == {
        "0-1%": (2, 2),
        "1-2%": (0, 0),
        "2-5%": (1, 1),
        "5-10%": (0, 0),
        "10-20%": (3, 0),
        ">20%": (0, 0),
    }
    buckets = {b.name: b for b in metrics.flip_rates(ref, measured)}
    assert buckets["0-1%"].rate == 1.0
    assert math.isnan(buckets["1-2%"].rate)


def test_kendall_tau_b_per_task() -> None:
    ref = {
        ("A", "1"): 1.0,
        ("A", "2"): 2.0,
        ("A", "3"): 3.0,
        ("A", "4"): 4.0,
        ("B", "1"): 1.0,
        ("B", "2"): 1.0,
        ("B", "3"): 2.0,
        ("C", "1"): 1.0,
        ("C", "2"): 2.0,
        ("D", "1"): 1.0,
    }
    measured = {
        ("A", "1"): 1.0,
        ("A", "2"): 3.0,
        ("A", "3"): 2.0,
        ("A", "4"): 4.0,
        ("B", "1"): 1.0,
        ("B", "2"): 2.0,
        ("B", "3"): 3.0,
        ("C", "1"): 5.0,
        ("C", "2"): 5.0,
        ("D", "1"): 1.0,
    }
    taus = metrics.kendall_per_task(ref, measured)
    # A: 6 pairs, one discordant (2,3): (5 - 1) / 6.
    assert taus["A"] == pytest.approx(4 / 6)
    # B: reference tie (1,2); 2 concordant pairs, n0 = 3, ties in x n1 = 1, in y n2 = 0:
    # tau_b = 2 / sqrt((3 - 1) * (3 - 0)).
    assert taus["B"] == pytest.approx(2 / math.sqrt(6))
    # C: all measured times equal -> undefined, left out; D: one candidate, left out.
    assert set(taus) == {"A", "B"}


def test_throughput_span_and_window() -> None:
    recs: list[dict[str, Any]] = [
        {"start": 100.0, "end": 110.0, "exit_code": 0, "result": {}},
        {"start": 100.0, "end": 130.0, "exit_code": 0, "result": {}},
        {"start": 110.0, "end": 160.0, "exit_code": 1, "result": None},
        {"start": 130.0, "end": 220.0, "exit_code": 0, "result": {}},
    ]
    # Span 100 .. 220 s = 2 min, 3 completed -> 1.5 cmds/min.
    assert metrics.throughput(recs) == pytest.approx(1.5)
    # Window of 60 s from t0 = 100: two completions by 160 s -> 2 cmds/min.
    assert metrics.throughput(recs, window_s=60.0, t0=100.0) == pytest.approx(2.0)
    assert math.isnan(metrics.throughput([]))


def test_a_flip_rate_of_too_few_pairs_is_not_shown_as_a_rate() -> None:
    assert flip_cell({"pairs": 1, "flips": 1, "rate": 1.0}) == "n=1: too few to judge"
    assert flip_cell({"pairs": 4, "flips": 0, "rate": 0.0}) == "n=4: too few to judge"
    assert flip_cell({"pairs": 5, "flips": 1, "rate": 0.2}) == "20.0% (1/5)"
    assert flip_cell({"pairs": 0, "flips": 0, "rate": math.nan}) == "— (0/0)"
