"""A tenant that allocates device memory on the fake driver, step by step.

Usage: allocator.py STEP...   (one JSON line per step on stdout, flushed)

  via=KIND       how the alloc steps after it allocate (default ``malloc``):
                 malloc       cuMemAlloc_v2 / hipMalloc
                 memcreate    cuMemCreate / hipMemCreate (released with
                              cuMemRelease / hipMemRelease)
                 and, over HIP only, with SIZE a multiple of 1 MiB:
                 malloc3d     hipMalloc3D of SIZE/1Mi slices of 1024 rows of
                              1000 bytes (the runtime pads each row to its
                              pitch: 1024 on the fake, so SIZE in all)
                 mallocarray, arraycreate
                              hipMallocArray / hipArrayCreate of float4
                              elements (16 bytes), 4096 wide, SIZE/64Ki high
                 malloc3darray, array3dcreate
                              hipMalloc3DArray / hipArray3DCreate of float4
                              elements, 1024 x 64 x SIZE/1Mi
                 (arrays freed with hipFreeArray after the hipMalloc* calls,
                 hipArrayDestroy after the hipArray*Create ones)
  alloc=SIZE     an allocation of SIZE (e.g. 300M); raises on failure unless
                 the next step is ``tolerate``
  allocasync=SIZE  cuMemAllocAsync on the legacy stream (a gated call:
                 counted in flight, parked by a closed gate)
  tolerate       the previous alloc may fail: report it and go on
  free           free everything held
  free=I         free the I-th allocation made (from 0)
  info           the device's memory in use, all processes together
                 (``used``: total less free bytes)
  hold=S         sleep S seconds
  wait           print {"op": "wait"} and block until a line on stdin
  launch=N       launch N 100 µs kernels and synchronize
  lasterror      report the runtime's last error (HIP: hipGetLastError, which
                 also clears it; the CUDA driver keeps none: its success)
  region=STEPS   run STEPS (comma-separated, same syntax) inside
                 region.critical()

Under ``KREX_TEST_GPU_API=hip`` the same steps go through the fake HIP runtime
(fakegpu.init): hipMalloc, hipMallocAsync on the null stream, hipFree, and the
HIP-only kinds of ``via``.

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
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

from krex_client.sizes import parse_size  # noqa: E402
from tests.fakecuda import fakegpu  # noqa: E402

# Every allocation made: (how to free it, its pointer or handle), None once freed.
held: list[tuple[str, int] | None] = []
GpuError = fakegpu.error_type()
SUCCESS = "hipSuccess" if os.environ.get("KREX_TEST_GPU_API") == "hip" else "CUDA_SUCCESS"
MIB = 1 << 20
# via= kinds of arrays: the call that makes them, the one that frees them, and
# whether they are 3D.
ARRAYS = {
    "mallocarray": ("hipMallocArray", "hipFreeArray", False),
    "arraycreate": ("hipArrayCreate", "hipArrayDestroy", False),
    "malloc3darray": ("hipMalloc3DArray", "hipFreeArray", True),
    "array3dcreate": ("hipArray3DCreate", "hipArrayDestroy", True),
}


def say(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def allocate(gpu: fakegpu.FakeGpu, via: str, nbytes: int) -> tuple[str, int]:
    """An allocation of ``nbytes`` made as ``via`` says; (how to free it, its handle)."""
    if via == "malloc":
        return "free", gpu.alloc(nbytes)
    if via == "memcreate":
        return "mem_release", gpu.mem_create(nbytes)
    hip: Any = gpu  # the HIP-only calls: tests/fakehip/hipgpu.py's HipGpu
    if nbytes % MIB:
        raise SystemExit(f"allocator.py: via={via} needs a multiple of 1 MiB")
    if via == "malloc3d":
        return "free", hip.malloc3d(1000, 1024, nbytes // MIB)[0]
    call, free, three_d = ARRAYS[via]
    if three_d:
        return f"array_free:{free}", hip.array_create(1024, 64, nbytes // MIB, how=call)
    return f"array_free:{free}", hip.array_create(4096, nbytes // (64 << 10), how=call)


def release(gpu: fakegpu.FakeGpu, i: int) -> None:
    """Free allocation ``i`` (if still held)."""
    entry = held[i]
    if entry is None:
        return
    how, handle = entry
    method, _, arg = how.partition(":")
    getattr(gpu, method)(handle, *([arg] if arg else []))
    held[i] = None


def run(steps: list[str], gpu: fakegpu.FakeGpu) -> None:
    via = "malloc"
    i = 0
    while i < len(steps):
        step = steps[i]
        key, _, val = step.partition("=")
        tolerate = i + 1 < len(steps) and steps[i + 1] == "tolerate"
        if key == "via":
            if val not in ("malloc", "memcreate", "malloc3d", *ARRAYS):
                raise SystemExit(f"allocator.py: unknown via={val}")
            via = val
        elif key in ("alloc", "allocasync"):
            t0 = time.monotonic()
            nbytes = parse_size(val)
            try:
                if key == "allocasync":
                    held.append(("free", gpu.alloc_async(nbytes)))
                else:
                    held.append(allocate(gpu, via, nbytes))
                say(op="alloc", bytes=nbytes, rc=SUCCESS, ms=_ms(t0))
            except GpuError as exc:
                say(op="alloc", bytes=nbytes, rc=getattr(exc, "name", "?"), ms=_ms(t0))
                if not tolerate:
                    raise
        elif key == "free":
            for j in [int(val)] if val else range(len(held)):
                release(gpu, j)
            say(op="free")
        elif key == "info":
            free_b, total = gpu.mem_info()
            say(op="info", used=total - free_b)
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
