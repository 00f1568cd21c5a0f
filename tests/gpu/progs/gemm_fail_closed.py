"""GEMM programs for the fail-closed check on a real GPU (tests/gpu/test_gpu_fail_closed.py).

gemm_fail_closed.py holder OUT.json REGIONS   REGIONS critical regions, each timing
                                             20 4096x4096 fp16 GEMMs with CUDA
                                             events; save the times (ms) and the
                                             median.  Off krex the regions are
                                             no-ops: the native baseline.
gemm_fail_closed.py sibling                  GEMMs back to back until killed
                                             (run it with env -u LD_PRELOAD)
gemm_fail_closed.py exec                     one GEMM through the shim, then
                                             exec ``sibling`` without LD_PRELOAD
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

GAP_S = 0.02  # between regions (s)


def _mats() -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    return a, torch.randn(4096, 4096, device="cuda", dtype=torch.float16)


def holder(out: str, regions: int) -> None:
    from krex_client import region

    a, b = _mats()
    # Warm-up, the same with and without krex: cuBLAS heuristics, then 1 s of
    # GEMMs so that the first regions do not start on an idle clock.
    t_end = time.monotonic() + 1.0
    while time.monotonic() < t_end:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
    times = []
    for _ in range(regions):
        # The same duty cycle with and without krex (a region's entry takes a
        # few ms): back-to-back GEMMs alone would hold the GPU at its power cap,
        # and a run with gaps would then time faster for that reason alone.
        time.sleep(GAP_S)
        with region.critical():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                a @ b
            end.record()
            end.synchronize()
        times.append(start.elapsed_time(end))
    with open(out, "w") as f:
        json.dump({"times_ms": times, "median_ms": statistics.median(times)}, f)


def sibling() -> None:
    a, b = _mats()
    print("started", flush=True)
    while True:
        for _ in range(50):
            a @ b
        torch.cuda.synchronize()


def exec_unshimmed() -> None:
    a, b = _mats()
    a @ b
    torch.cuda.synchronize()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), "sibling"], env)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "holder":
        holder(sys.argv[2], int(sys.argv[3]))
    elif mode == "sibling":
        sibling()
    else:
        exec_unshimmed()
