"""On a real NVIDIA GPU: the compute-bound clock warm-up at region entry.

Skipped without a GPU (``@pytest.mark.gpu``).  Real krexd, the shim
preloaded by ``krex run --region-log``, PyTorch and pynvml in the
interpreter running the tests.  ``progs/warmup_matmul.py`` idles before each
of two regions; the second warms with matmuls.  Prints the records (``-s``):
whether the clock reached the threshold within the budget, and how long it
took, is the measurement docs/bench/autotune-h200.md asks for.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.gpu.region_logged import run_logged

pytestmark = [pytest.mark.gpu, pytest.mark.root, pytest.mark.slow]


def test_matmul_warm_up_on_real_nvml(krexd_factory: Any) -> None:
    off, on = run_logged(krexd_factory, "warmup_matmul.py", KREX_REGION_WARM_MS="200")
    print(json.dumps([off, on], indent=1))
    assert off["warmup"]["kind"] == "none" and off["warmup"]["stop"] == "off"
    warm = on["warmup"]
    assert warm["budget_ms"] == 200.0 and warm["error"] is None
    # The same code in both regions: the warm-up's launches are not counted as the region's.
    assert on["launches"] == off["launches"] >= 5
    top = on["device"]["sm_clock_max_mhz"]
    if warm["stop"] == "warm_at_entry":
        pytest.skip(f"the SM clock did not drop while idle ({warm['sm_clock_before_mhz']} MHz)")
    assert warm["kind"] == "matmul" and warm["launches"] >= warm["slices"] >= 1
    assert warm["ms"] < 200.0 + 20.0
    after = warm["sm_clock_after_mhz"]
    assert warm["stop"] in ("warm", "budget"), warm
    if warm["stop"] == "warm":
        assert after >= 0.9 * top, warm
