"""The L2 flush and the clock warm-up at region entry, end to end (docs/design/region-log.md).

Real krexd, real cgroups, the real shim LD_PRELOADed by ``krex run`` over
the fake driver, whose timeline times each memset (50 MiB of L2 flush
buffer at 1 TB/s: 52 µs).  The warm-up's memsets must lie inside the
holder's regions only (a sibling launching constantly never overlaps them),
spend what the budget allows, and stop once a stand-in ``pynvml`` or
``amdsmi`` (``progs/standin_smi``) reports a warm SM clock.  Each test runs
over both fakes (``gpu_api``): over HIP the holder and the sibling drive the
fake HIP runtime (4 MiB of L2 on its simulated AMD GPU), the flush and the
warm-up are HIP memsets, and the clock is read through AMD SMI.

The fake driver's memsets cost the host more than their device time (data
really moves; the first zeroing after the L2 flush drops its pages), so the
budget is checked on the warm-up's wall time here; tests/client/test_warmup.py
checks the slicing exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fakecuda import timeline
from tests.support import GpuApi
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]
PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
FAKEGPU = REPO / "tests" / "fakecuda" / "fakegpu.py"
PROGS = Path(__file__).resolve().parent / "progs"
STANDIN = str(PROGS / "standin_smi")  # pynvml and amdsmi: the client reads its vendor's
SLACK_MS = 60.0  # host noise on a loaded test machine: one memset, one synchronization


def _run(
    factory: Factory,
    api: GpuApi,
    tmp_path: Path,
    regions: int,
    env_extra: dict[str, str],
    sibling: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[timeline.Record]]:
    """Run region_warm.py under krex; (its output, its region records, the timeline)."""
    k = factory(args=list(api.krexd_args))
    env = dict(
        api.env(k.env, str(tmp_path)),
        KREX_REGION_LOG=str(tmp_path / "regions.jsonl"),
        **env_extra,
    )
    tl = env["KREX_FAKE_TIMELINE"]
    sib = None
    if sibling:
        argv = [PY, str(FAKEGPU), "--seconds", "120", "--kernel-ns", "50000", "--sync-every", "4"]
        sib = subprocess.Popen([*k.krex, "run", "--", *argv], env=env, stdout=subprocess.DEVNULL)
    try:
        holder = [*k.krex, "run", "--", PY, str(PROGS / "region_warm.py"), str(regions)]
        p = subprocess.run(holder, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
    finally:
        if sib is not None:
            sib.terminate()
            sib.wait(30)
    out = json.loads(p.stdout.splitlines()[-1])
    log = (tmp_path / "regions.jsonl").read_text().splitlines()
    return out, [json.loads(line) for line in log], timeline.read(tl)


def _memsets_by_region(
    api: GpuApi, out: dict[str, Any], recs: list[timeline.Record]
) -> list[list[Any]]:
    """The holder's memsets per region span; fails on one outside every span, and
    checks the first of each region is the L2 flush (the device's whole L2, at the
    fake device's 1 TB/s)."""
    spans = out["spans"]
    per: list[list[Any]] = [[] for _ in spans]
    for r in recs:
        if r.pid != out["pid"] or r.kind != timeline.MEMSET:
            continue
        inside = [i for i, (s, e) in enumerate(spans) if s <= r.start_ns and r.end_ns <= e]
        assert inside, f"a memset outside every region: {r}"
        per[inside[0]].append(r)
    for memsets in per:
        assert memsets, "no L2 flush in a region"
        assert abs(memsets[0].duration_ns - api.l2_bytes / 1e3) < 2000, memsets[0]
    return per


def _kinds(rec: dict[str, Any]) -> list[str]:
    return [w["kind"] for w in rec["warnings"]]


def test_fixed_warm_up_runs_inside_the_region_only(
    krexd_factory: Factory, gpu_api: GpuApi, tmp_path: Path
) -> None:
    # No pynvml here: KREX_REGION_WARM_MS set explicitly warms for that time.
    env = {"KREX_REGION_WARM_MS": "30"}
    out, log, recs = _run(krexd_factory, gpu_api, tmp_path, 3, env, sibling=True)
    assert out["outside_rc"] == -800  # CUDA_ERROR_NOT_PERMITTED: no region held
    assert len(log) == 3
    per = _memsets_by_region(gpu_api, out, recs)
    for rec, stats, memsets in zip(log, out["stats"], per, strict=True):
        assert rec["l2_flushed"] is True
        assert rec["warmup_ms"] == stats["warmup_ms"]
        assert 30.0 <= rec["warmup_ms"] < 30.0 + SLACK_MS, rec
        assert rec["warmed"] == {"sm_clock_mhz": None} and "cold_clock" not in _kinds(rec)
        assert rec["warmup"]["kind"] == "memset" and rec["warmup"]["stop"] == "budget"
        assert rec["warmup"]["launches"] == 0 and rec["launches"] == 1
        # The L2 flush, then at least one memset for each warm-up slice, all
        # within the budget (how many fit a slice depends on the host's speed;
        # tests/client/test_warmup.py checks the slicing exactly).
        assert rec["warmup"]["slices"] >= 1
        assert len(memsets) >= 1 + rec["warmup"]["slices"], (rec, memsets)
        warm_span_ms = (memsets[-1].end_ns - memsets[1].start_ns) / 1e6
        assert warm_span_ms < 30.0 + SLACK_MS
        # The sibling was held off while the holder warmed.
        for m in memsets:
            assert timeline.overlapping(recs, m.start_ns, m.end_ns, exclude_pid=out["pid"]) == []
    assert sum(1 for r in recs if r.pid != out["pid"]) > 50, "the sibling must have launched"
    # The shim counts launches from each region's begin: one kernel in each.
    assert out["launches"] == [1, 1, 1]


def test_warm_up_stops_once_the_clock_is_warm(
    krexd_factory: Factory, gpu_api: GpuApi, tmp_path: Path
) -> None:
    # Cold for the first 3 reads (entry, after slice 1, after slice 2), then warm:
    # three 2 ms slices of a 200 ms budget; the second region enters warm.
    env = {"PYTHONPATH": STANDIN, "STANDIN_SMI_COLD_READS": "3", "KREX_REGION_WARM_MS": "200"}
    out, log, recs = _run(krexd_factory, gpu_api, tmp_path, 2, env)
    first, second = log
    assert first["entry"]["sm_clock_mhz"] == 990 and first["warmed"]["sm_clock_mhz"] == 1980
    assert 3 * 2.0 <= first["warmup_ms"] < 3 * 2.0 + 3 * SLACK_MS, first
    assert "cold_clock" not in _kinds(first)  # cold at entry, warm when the code began
    assert second["warmup_ms"] == 0.0 and second["warmed"] == {"sm_clock_mhz": 1980}
    per = _memsets_by_region(gpu_api, out, recs)
    assert len(per[0]) >= 4 and len(per[1]) == 1  # the second region: its L2 flush only


def test_a_clock_that_stays_cold_spends_the_budget_and_warns(
    krexd_factory: Factory, gpu_api: GpuApi, tmp_path: Path
) -> None:
    env = {"PYTHONPATH": STANDIN, "KREX_REGION_WARM_MS": "20"}
    out, (rec,), recs = _run(krexd_factory, gpu_api, tmp_path, 1, env)
    assert 20.0 <= rec["warmup_ms"] < 20.0 + SLACK_MS, rec
    assert rec["warmed"] == {"sm_clock_mhz": 990}
    (cold,) = [w for w in rec["warnings"] if w["kind"] == "cold_clock"]
    assert "after" in cold["message"] and "warm-up" in cold["message"]
    assert rec["warmup"]["stop"] == "budget"
    (memsets,) = _memsets_by_region(gpu_api, out, recs)
    # The L2 flush, then at least one memset for each 2 ms slice the budget
    # paid for (one slow memset on a loaded host spends several slices' time).
    assert rec["warmup"]["slices"] >= 1
    assert len(memsets) >= 1 + rec["warmup"]["slices"], (rec, memsets)
