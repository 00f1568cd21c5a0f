"""Regions on a real GPU for the region-record test (tests/gpu/test_gpu_region_log.py).

1. Times a matmul with CUDA events outside any region (timing outside).
2. Region "left": times a matmul on the current stream with events and
   leaves ~50 ms of matmuls running on a side stream.
3. Warms the GPU for ~1 s outside any region (no timing).
4. Region "clean": times matmuls on the current stream with events, inside.

Prints ``{"outside_ms", "left_ms", "clean_ms"}``.
"""

from __future__ import annotations

import json
import time

import torch

from krex_client import region


def timed(a: torch.Tensor, n: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        a @ a
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def main() -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    outside = timed(a, 5)
    side = torch.cuda.Stream()
    with region.critical():
        left = timed(a, 5)
        with torch.cuda.stream(side):
            for _ in range(200):  # ~0.25 ms each on an H200: ~50 ms left at exit
                a @ a
    t = time.monotonic()
    while time.monotonic() - t < 1.0:
        a @ a
    torch.cuda.synchronize()
    with region.critical():
        clean = timed(a, 20)
    print(json.dumps({"outside_ms": outside, "left_ms": left, "clean_ms": clean}))


if __name__ == "__main__":
    main()
