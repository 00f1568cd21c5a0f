"""Holder for restart tests: regions in a loop over the fake driver, for a while.

Usage: region_loop.py SECONDS HOLD_MS [GAP_MS [STOP_FILE]]

Enters ``region.critical()`` again and again for SECONDS (or until
STOP_FILE exists), each time launching kernels for HOLD_MS inside, then
sleeping GAP_MS (default 20) off-region.
Prints ``{"pid": ..., "regions": [[start_ns, end_ns], ...]}`` (CLOCK_MONOTONIC,
grant to just before exit) and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fakecuda"))

import fakegpu  # noqa: E402

from krex_client import region  # noqa: E402


def main() -> None:
    seconds, hold_ms = float(sys.argv[1]), float(sys.argv[2])
    gap_s = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.02
    stop_file = sys.argv[4] if len(sys.argv) > 4 else None
    gpu = fakegpu.init()
    spans = []
    end_at = time.monotonic() + seconds
    while time.monotonic() < end_at and not (stop_file and os.path.exists(stop_file)):
        with region.critical():
            start = time.monotonic_ns()
            until = time.monotonic() + hold_ms / 1000
            while time.monotonic() < until:
                gpu.launch(200_000)
                gpu.synchronize()
            end = time.monotonic_ns()
        spans.append([start, end])
        time.sleep(gap_s)
    print(json.dumps({"pid": os.getpid(), "regions": spans}))


if __name__ == "__main__":
    main()
