"""Holder for the HIP timeline test: short critical regions over the fake HIP runtime.

Usage: hip_holder.py CYCLES SEED

As timeline_holder.py, through HIP (tests/fakehip/hipgpu.py): each cycle
waits a random 0-3 ms, enters ``region.critical()``, launches one 20-300 µs
kernel and synchronizes, and records the region's span (CLOCK_MONOTONIC ns).
Prints ``{"pid": ..., "regions": [[start_ns, end_ns], ...]}``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fakehip"))

import hipgpu  # noqa: E402

from krex_client import region  # noqa: E402


def main() -> None:
    cycles, seed = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    gpu = hipgpu.init()
    spans = []
    for _ in range(cycles):
        time.sleep(rng.uniform(0, 0.003))
        with region.critical():
            start = time.monotonic_ns()
            gpu.launch(rng.randrange(20_000, 300_000))
            gpu.synchronize()
            end = time.monotonic_ns()
        spans.append([start, end])
    print(json.dumps({"pid": os.getpid(), "regions": spans}))


if __name__ == "__main__":
    main()
