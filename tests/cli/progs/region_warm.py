"""A command for the clock warm-up tests: regions over the fake driver.

Usage: region_warm.py REGIONS

Calls the shim's ``krex_shim_region_warm`` once outside any region (it must
refuse), then enters REGIONS regions, each timing a 0.1 ms kernel, and
records each region's span (CLOCK_MONOTONIC ns, from just before entering
to just after leaving: the warm-up lies inside), and the shim's launch
count (``krex_shim_region_launches``) after the kernel.  Prints
``{"pid", "outside_rc", "spans", "stats", "launches"}`` (``stats``:
``region.stats()`` of each region).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fakecuda"))

import fakegpu  # noqa: E402

from krex_client import region  # noqa: E402


def main() -> None:
    gpu = fakegpu.init()
    warm = ctypes.CDLL(None).krex_shim_region_warm
    warm.argtypes, warm.restype = [ctypes.c_uint32], ctypes.c_int
    launches = ctypes.CDLL(None).krex_shim_region_launches
    launches.argtypes, launches.restype = [], ctypes.c_uint64
    outside_rc = warm(5000)
    spans, stats, counts = [], [], []
    for _ in range(int(sys.argv[1])):
        start = time.monotonic_ns()
        with region.critical():
            gpu.launch(100_000)
            gpu.synchronize()
            counts.append(launches())
        spans.append([start, time.monotonic_ns()])
        stats.append(region.stats())
    out = {
        "pid": os.getpid(),
        "outside_rc": outside_rc,
        "spans": spans,
        "stats": stats,
        "launches": counts,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
