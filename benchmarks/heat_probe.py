"""Does a GPU kept busy just before a timing measure slower than an idle one?

One process, no krex: time a compute-bound fp16 GEMM (the corpus's
gemm_fp16_8192, ``a @ b.t()``) with ``triton.testing.do_bench`` after the GPU
idled ``--idle`` seconds, and right after ``--heat`` seconds of back-to-back
GEMMs (what a GPU shared by many commands looks like just before a region:
the siblings' queued work has only just drained).  Alternates the two,
``--rounds`` times; prints one line per measure and a summary with the SM
clock, temperature, power and NVML's throttle reasons read right after each.
``--settle`` adds, per round, a measure after the heat and then a short idle
of each listed length (what a settle at region entry would buy).

    python benchmarks/heat_probe.py [--rounds 3] [--heat 20] [--idle 20]
        [--settle 0.05,0.2,1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


def nvml_state() -> dict[str, Any]:
    """SM clock (MHz), temperature (C), power (W) and throttle-reason bits of GPU 0."""
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {
        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "reasons": hex(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--heat", type=float, default=20.0, help="seconds of GEMMs before a measure")
    p.add_argument("--idle", type=float, default=20.0, help="seconds idle before a measure")
    p.add_argument("--settle", default="", help="comma-separated seconds idle after heat")
    p.add_argument("--json", help="write the measures here")
    a = p.parse_args()
    import pynvml
    import torch
    from triton.testing import do_bench

    pynvml.nvmlInit()
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.float16)
    w = torch.randn(n, n, device="cuda", dtype=torch.float16)
    do_bench(lambda: x @ w.t())  # compile and warm once
    settles = [float(v) for v in a.settle.split(",") if v]
    kinds = ["idle", "heat"] + [f"heat+{v:g}s" for v in settles]
    rows = []
    for r in range(a.rounds):
        for kind in kinds:
            if kind == "idle":
                torch.cuda.synchronize()
                time.sleep(a.idle)
            else:
                end = time.monotonic() + a.heat
                while time.monotonic() < end:
                    for _ in range(20):
                        x @ w.t()
                    torch.cuda.synchronize()
                if kind != "heat":
                    time.sleep(float(kind[5:-1]))
            ms = do_bench(lambda: x @ w.t(), return_mode="median")
            row = {"round": r, "before": kind, "median_ms": ms, **nvml_state()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for kind in kinds:
        ms = [row["median_ms"] for row in rows if row["before"] == kind]
        print(f"{kind}: median of medians {statistics.median(ms):.4f} ms over {len(ms)}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
