"""GPU kernels that stamp the device's global timer, for region tests on a real GPU.

``%globaltimer`` is one nanosecond clock for the whole GPU, so intervals
recorded by kernels of different processes can be compared.  On ROCm (CuPy
built for HIP) the kernel reads ``wall_clock64()``, the GPU's constant-rate
clock (100 MHz on MI200/MI300: a stamp's units are then 10 ns ticks); one
clock for every process all the same, which is all the overlap check needs.

    stamp.py sibling OUT.npy SECONDS   launch 100 µs stamp kernels back to back
                                       for SECONDS, then save [[start, end], ...]
    stamp.py holder OUT.json REGIONS   enter REGIONS critical regions, each
                                       running one 5 ms stamp kernel; save the
                                       intervals and region.stats()
"""

from __future__ import annotations

import json
import sys
import time

import cupy as cp
import numpy as np

_SRC = r"""
extern "C" __global__ void stamp(unsigned long long* out, int idx, long long spin_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    t = t0;
    while ((long long)(t - t0) < spin_ns) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    }
    out[2 * idx] = t0;
    out[2 * idx + 1] = t;
}
"""


_SRC_HIP = r"""
extern "C" __global__ void stamp(unsigned long long* out, int idx, long long spin_ns) {
    // wall_clock64(): the constant clock, 100 MHz on the Instinct GPUs (10 ns a tick).
    long long spin = spin_ns / 10;
    unsigned long long t0 = wall_clock64(), t = t0;
    while ((long long)(t - t0) < spin) {
        t = wall_clock64();
    }
    out[2 * idx] = t0;
    out[2 * idx + 1] = t;
}
"""


def _kernel() -> cp.RawKernel:
    return cp.RawKernel(_SRC_HIP if cp.cuda.runtime.is_hip else _SRC, "stamp")


def sibling(out: str, seconds: float) -> None:
    k = _kernel()
    cap = 200_000
    buf = cp.zeros(2 * cap, dtype=cp.uint64)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and n < cap:
        for _ in range(50):
            k((1,), (1,), (buf, np.int32(n), np.int64(100_000)))
            n += 1
        cp.cuda.Device().synchronize()
        if n == 50:
            open(out + ".started", "w").close()
    np.save(out, cp.asnumpy(buf[: 2 * n]).reshape(-1, 2))


def holder(out: str, regions: int) -> None:
    from krex_client import region

    k = _kernel()
    buf = cp.zeros(2 * regions, dtype=cp.uint64)
    k((1,), (1,), (buf, np.int32(0), np.int64(1000)))  # compile + load outside regions
    cp.cuda.Device().synchronize()
    stats = []
    for i in range(regions):
        with region.critical():
            k((1,), (1,), (buf, np.int32(i), np.int64(5_000_000)))
            cp.cuda.Device().synchronize()
        stats.append(region.stats())
        time.sleep(0.05)
    with open(out, "w") as f:
        json.dump({"intervals": cp.asnumpy(buf).reshape(-1, 2).tolist(), "stats": stats}, f)


if __name__ == "__main__":
    if sys.argv[1] == "sibling":
        sibling(sys.argv[2], float(sys.argv[3]))
    else:
        holder(sys.argv[2], int(sys.argv[3]))
