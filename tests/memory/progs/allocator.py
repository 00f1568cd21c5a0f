"""A tenant that allocates device memory on the fake driver, step by step.

Usage: allocator.py STEP...   (one JSON line per step on stdout, flushed)

  alloc=SIZE     cuMemAlloc_v2 of SIZE (e.g. 300M); raises on failure unless
                 the next step is ``tolerate``
  allocasync=SIZE  the same with cuMemAllocAsync on the legacy stream (a
                 gated call: counted in flight, parked by a closed gate)
  tolerate       the previous alloc may fail: report it and go on
  free           cuMemFree_v2 of everything held
  hold=S         sleep S seconds
  wait           print {"op": "wait"} and block until a line on stdin
  launch=N       launch N 100 µs kernels and synchronize
  lasterror      report the runtime's last error (HIP: hipGetLastError, which
                 also clears it; the CUDA driver keeps none: its success)
  region=STEPS   run STEPS (comma-separated, same syntax) inside
                 region.critical()

Under ``KREX_TEST_GPU_API=hip`` the same steps go through the fake HIP runtime
(fakegpu.init): hipMalloc, hipMallocAsync on the null stream, hipFree.

An allocation that fails raises the runtime's error (fakegpu.error_type()):
the program exits 1 with the error's name on stderr, as a benchmark would on
torch.OutOfMemoryError.  Each alloc reports its result's name (the runtime's:
``CUDA_SUCCESS``, ``hipErrorOutOfMemory``, ...) and how long the call took
(``ms``).
"""

from __future__ import annotations

import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

from krex_client.sizes import parse_size  # noqa: E402
from tests.fakecuda import fakegpu  # noqa: E402

held: list[int] = []
GpuError = fakegpu.error_type()
SUCCESS = "hipSuccess" if os.environ.get("KREX_TEST_GPU_API") == "hip" else "CUDA_SUCCESS"


def say(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def run(steps: list[str], gpu: fakegpu.FakeGpu) -> None:
    i = 0
    while i < len(steps):
        step = steps[i]
        key, _, val = step.partition("=")
        tolerate = i + 1 < len(steps) and steps[i + 1] == "tolerate"
        if key in ("alloc", "allocasync"):
            t0 = time.monotonic()
            nbytes = parse_size(val)
            try:
                held.append(gpu.alloc_async(nbytes) if key == "allocasync" else gpu.alloc(nbytes))
                say(op="alloc", bytes=nbytes, rc=SUCCESS, ms=_ms(t0))
            except GpuError as exc:
                say(op="alloc", bytes=nbytes, rc=getattr(exc, "name", "?"), ms=_ms(t0))
                if not tolerate:
                    raise
        elif key == "free":
            while held:
                gpu.free(held.pop())
            say(op="free")
        elif key == "hold":
            time.sleep(float(val))
        elif key == "wait":
            say(op="wait")
            sys.stdin.readline()
        elif key == "lasterror":
            hip = getattr(gpu, "hip", None)
            rc = hip.error_name(hip.try_call("hipGetLastError")) if hip is not None else SUCCESS
            say(op="lasterror", rc=rc)
        elif key == "launch":
            for _ in range(int(val)):
                gpu.launch(100_000)
            gpu.synchronize()
            say(op="launch", n=int(val))
        elif key == "region":
            from krex_client import region

            with region.critical():
                t0 = time.monotonic()
                run(val.split(","), gpu)
            say(op="region", ms=_ms(t0))
        elif key != "tolerate":
            raise SystemExit(f"allocator.py: unknown step {step!r}")
        i += 1


def _ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1e3, 3)


def main() -> int:
    gpu = fakegpu.init()
    say(op="start", pid=os.getpid())
    try:
        run(sys.argv[1:], gpu)
    except GpuError as exc:
        print(f"allocator.py: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
