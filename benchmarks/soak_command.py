"""One command of benchmarks/soak.py: kernels outside and inside critical regions (fake driver).

Usage: soak_command.py REGIONS OUT.json

Launches 20 kernels of 100 µs outside any region (synchronizing every 5),
then REGIONS times: a critical region with one 200 µs kernel, synchronized,
whose span (CLOCK_MONOTONIC ns, grant to just before the exit) is recorded,
and 10 more kernels outside.  Writes ``{"pid": ..., "regions": [[s, e], ...]}``
to OUT.json; exit 0 only when every region was granted.
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fakecuda"))

import fakegpu  # noqa: E402

from krex_client import region  # noqa: E402


def outside(gpu: fakegpu.FakeGpu, n: int) -> None:
    for i in range(n):
        gpu.launch(100_000)
        if i % 5 == 4:
            gpu.synchronize()
    gpu.synchronize()


def main() -> None:
    regions, out = int(sys.argv[1]), sys.argv[2]
    gpu = fakegpu.init()
    outside(gpu, 20)
    spans = []
    for _ in range(regions):
        with region.critical():
            start = time.monotonic_ns()
            gpu.launch(200_000)
            gpu.synchronize()
            spans.append([start, time.monotonic_ns()])
        outside(gpu, 10)
    with open(out, "w") as f:
        json.dump({"pid": os.getpid(), "regions": spans}, f)


if __name__ == "__main__":
    main()
