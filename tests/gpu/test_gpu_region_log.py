"""On a real NVIDIA GPU: the region record's NVML figures and its warnings.

Skipped without a GPU (``@pytest.mark.gpu``).  Real krexd (no fake GPUs),
real cgroups, the shim preloaded by ``krex run --region-log``, PyTorch and
pynvml in the interpreter running the tests.  Prints the records (``-s``):
``other_streams_ms`` of the clean region is the exit synchronization of an
idle context, the floor below which record.OTHER_STREAMS_WARN_MS must stay.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.gpu.region_logged import run_logged

pytestmark = [pytest.mark.gpu, pytest.mark.root, pytest.mark.slow]


def test_region_record_on_real_nvml(krexd_factory: Any) -> None:
    recs = run_logged(krexd_factory, "region_log.py")
    print(json.dumps(recs, indent=1))
    assert len(recs) == 2
    left, clean = recs
    for r in recs:
        dev = r["device"]
        assert dev["name"] and dev["uuid"].startswith("GPU-") and dev["sm_clock_max_mhz"] > 0
        for when in ("entry", "exit"):
            s = r[when]
            assert s["sm_clock_mhz"] > 0 and s["mem_clock_mhz"] > 0, s
            assert 0 < s["temperature_c"] < 120 and s["power_w"] > 0, s
        assert r["l2_flushed"] is True and r["launches"] >= 5
        assert r["sync_ms"] >= 0 and r["region_ms"] > 0
    kinds = {w["kind"] for w in left["warnings"]}
    assert {"timing_outside_region", "work_on_other_stream"} <= kinds, left
    assert left["other_streams_ms"] > 5.0
    assert left["events_outside"]["timed"] >= 1
    assert "work_on_other_stream" not in {w["kind"] for w in clean["warnings"]}, clean
    assert "timing_outside_region" not in {w["kind"] for w in clean["warnings"]}, clean
    assert clean["other_streams_ms"] is not None and clean["other_streams_ms"] < 0.1
    # Warmed for a second just before: the SM clock at entry is near its maximum.
    assert clean["entry"]["sm_clock_mhz"] >= 0.5 * clean["device"]["sm_clock_max_mhz"]
