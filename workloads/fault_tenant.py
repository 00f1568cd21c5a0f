"""Tenants for the GPU-wide fault scenario (benchmarks/mps_faults.py; docs/design/faults.md).

    python workloads/fault_tenant.py gemm SECONDS   # bf16 4096^3 matmuls in a loop
    python workloads/fault_tenant.py fault DELAY    # matmuls for DELAY s, then a
                                                    # kernel that writes to address 0x10

Prints one JSON line ``{"mode", "matmuls", "seconds"}`` when it ends
normally; the faulting one dies with CUDA's illegal-address error (exit 1).
The write uses CuPy's RawKernel when CuPy is installed, else a Triton store
far out of bounds.
"""

from __future__ import annotations

import json
import sys
import time


def _gemm_for(seconds: float) -> int:
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            a @ b
        n += 8
        torch.cuda.synchronize()
    return n


def _illegal_write() -> None:
    try:
        import cupy

        k = cupy.RawKernel(
            r'extern "C" __global__ void bad() { *(volatile int *)0x10 = 1; }', "bad"
        )
        k((1,), (1,), ())
        cupy.cuda.Device().synchronize()
        return
    except ImportError:
        pass
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def bad(ptr, off):  # type: ignore[no-untyped-def]
        tl.store(ptr + off, 1.0)

    x = torch.empty(1, device="cuda")
    bad[(1,)](x, 1 << 40)
    torch.cuda.synchronize()


def main() -> int:
    """Run the mode named by argv[1] with its number argv[2] (seconds)."""
    mode, value = sys.argv[1], float(sys.argv[2])
    t0 = time.monotonic()
    n = _gemm_for(value)
    if mode == "fault":
        _illegal_write()
    print(json.dumps({"mode": mode, "matmuls": n, "seconds": round(time.monotonic() - t0, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
