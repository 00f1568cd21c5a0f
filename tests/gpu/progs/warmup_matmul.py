"""Regions after idling, for the compute warm-up test (tests/gpu/test_gpu_warmup_matmul.py).

Initializes CUDA through torch, then twice: idles for ``IDLE_S`` seconds (the
SM clock drops), enters a region and times 5 matmuls with CUDA events.  The
first region runs with the warm-up off (``KREX_REGION_WARM_MS=0``), the
second with it on (the default budget unless the test sets one): the same
code, so the records' ``launches`` must agree.  Prints ``{"ms": [a, b]}``.
"""

from __future__ import annotations

import json
import os
import time

import torch

from krex_client import region

IDLE_S = 3.0


def timed(a: torch.Tensor) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        a @ a
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def main() -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    timed(a)  # cuBLAS set up outside the regions
    budget = os.environ.get("KREX_REGION_WARM_MS", "")
    out = []
    for warm in ("0", budget):
        if warm:
            os.environ["KREX_REGION_WARM_MS"] = warm
        else:
            os.environ.pop("KREX_REGION_WARM_MS", None)
        time.sleep(IDLE_S)
        with region.critical():
            out.append(timed(a))
    print(json.dumps({"ms": out}))


if __name__ == "__main__":
    main()
