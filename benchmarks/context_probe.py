"""One command of benchmarks/context_creation.py: how long until its first CUDA operation.

Usage: ``context_probe.py START_NS WORKLOAD`` with START_NS the benchmark's
common start (``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every
process of the machine) and WORKLOAD:

* ``torch``: ``import torch``, then ``torch.zeros(1, device="cuda")`` and
  ``torch.cuda.synchronize()``;
* ``fake``: ``import ctypes``, then through the CUDA driver API by ctypes
  (``libcuda.so.1``: the fake driver of tests/fakecuda on its
  ``LD_LIBRARY_PATH``, or a real one): ``cuInit``, the primary context of
  device 0 made current, an 8-byte allocation, a memset and a context
  synchronization.

Prints one JSON line, times in seconds since START_NS: ``interp`` (this
script's first line ran: process start, interpreter start and, under ``krex
run``, admission), ``imported`` (the import done), ``first_op`` (the CUDA
operation done); and ``pid``, ``tenant`` (``KREX_TENANT``: its krex tenant
id, null outside krex) and ``mps`` (``CUDA_MPS_PIPE_DIRECTORY`` is set: an
MPS client).  Imports nothing before the first timestamp.
"""

import time

T_INTERP = time.monotonic_ns()

import json  # noqa: E402 - after the first timestamp, on purpose
import os  # noqa: E402
import sys  # noqa: E402


def _driver_op() -> None:
    """The first CUDA operation through the driver API (``fake`` workload)."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")

    def call(name: str, *args: object) -> None:
        rc = getattr(cuda, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} returned CUresult {rc}")

    dev, ctx, ptr = ctypes.c_int(0), ctypes.c_void_p(), ctypes.c_uint64(0)
    call("cuInit", ctypes.c_uint(0))
    call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(0))
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)
    call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(8))
    call("cuMemsetD8_v2", ptr, ctypes.c_ubyte(0), ctypes.c_size_t(8))
    call("cuCtxSynchronize")


def main() -> int:
    """Time the import and the first CUDA operation; print the JSON line."""
    start, workload = int(sys.argv[1]), sys.argv[2]
    if workload == "torch":
        import torch

        t_import = time.monotonic_ns()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    elif workload == "fake":
        import ctypes  # noqa: F401 - the cheap stand-in for ``import torch``

        t_import = time.monotonic_ns()
        _driver_op()
    else:
        raise SystemExit(f"unknown workload {workload!r}")
    t_op = time.monotonic_ns()
    out = {
        "interp": (T_INTERP - start) / 1e9,
        "imported": (t_import - start) / 1e9,
        "first_op": (t_op - start) / 1e9,
        "pid": os.getpid(),
        "tenant": os.environ.get("KREX_TENANT"),
        "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
