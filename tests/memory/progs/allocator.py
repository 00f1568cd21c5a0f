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
  region=STEPS   run STEPS (comma-separated, same syntax) inside
                 region.critical()

An allocation that fails raises fakegpu.CudaError: the program exits 1 with
the driver's error name on stderr, as a benchmark would on
torch.OutOfMemoryError.  Each alloc reports its CUresult name and how long
the call took (``ms``).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

from krex_client.sizes import parse_size  # noqa: E402
from tests.fakecuda import fakegpu  # noqa: E402

held: list[int] = []


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
            try:
                held.append(_alloc(gpu, parse_size(val), key == "allocasync"))
                say(op="alloc", bytes=parse_size(val), rc="CUDA_SUCCESS", ms=_ms(t0))
            except fakegpu.CudaError as exc:
                say(op="alloc", bytes=parse_size(val), rc=exc.name, ms=_ms(t0))
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


def _alloc(gpu: fakegpu.FakeGpu, nbytes: int, stream_ordered: bool) -> int:
    if not stream_ordered:
        return gpu.alloc(nbytes)
    fn = gpu.drv.lib.cuMemAllocAsync
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    ptr = ctypes.c_uint64()
    code = int(fn(ctypes.byref(ptr), nbytes, None))
    if code != 0:
        raise fakegpu.CudaError("cuMemAllocAsync", code, gpu.drv.error_name(code))
    return ptr.value


def _ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1e3, 3)


def main() -> int:
    gpu = fakegpu.init()
    say(op="start", pid=os.getpid())
    try:
        run(sys.argv[1:], gpu)
    except fakegpu.CudaError as exc:
        print(f"allocator.py: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
