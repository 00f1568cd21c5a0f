"""A tiny CUDA driver binding (ctypes) so Python test tenants act like GPU programs.

It loads ``libcuda.so.1`` by name, as CuPy does, so a process started with
``LD_LIBRARY_PATH=build/fakecuda`` gets the fake driver and an
LD_PRELOADed shim interposes exactly as it would for a real program.
Kernels are the fake driver's duration kernels: ``launch(duration_ns)``
occupies the stream for that many ns (tests/fakecuda/README.md).

Library use::

    import fakegpu
    fakegpu.init()
    fakegpu.launch(2_000_000)        # a 2 ms kernel on the legacy default stream
    fakegpu.synchronize()

or one :class:`FakeGpu` per device.  As a command (a tenant for tests)::

    python fakegpu.py --count 100 --kernel-ns 1000000 [--seconds S] [--sync-every K]

prints a JSON summary.  This module imports nothing from the project.

``KREX_TEST_GPU_API=hip`` makes :func:`init` (so every test tenant built on
it, and the command above) drive the fake HIP runtime instead, through
``tests/fakehip/hipgpu.py``, whose ``HipGpu`` has the same methods: the
protocol suites run over both fakes without a copy of their programs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
import time
from typing import Any

CU_STREAM_NON_BLOCKING = 0x1
CU_EVENT_DISABLE_TIMING = 0x2
CUDA_ERROR_NOT_READY = 600
CAPTURE_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}
CAPTURE_STATUS = {0: "none", 1: "active", 2: "invalidated"}

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_U = ctypes.c_uint
_I = ctypes.c_int
_SZ = ctypes.c_size_t
_PSZ = ctypes.POINTER(ctypes.c_size_t)


class MemLocation(ctypes.Structure):
    """CUmemLocation."""

    _fields_ = [("type", _I), ("id", _I)]


class MemAllocationProp(ctypes.Structure):
    """CUmemAllocationProp (its allocFlags as one 8-byte field)."""

    _fields_ = [
        ("type", _I),
        ("requestedHandleTypes", _I),
        ("location", MemLocation),
        ("win32HandleMetaData", _P),
        ("allocFlags", ctypes.c_uint64),
    ]


CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1

# name -> argument types (all return CUresult, an int)
_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [_U],
    "cuGetErrorName": [_I, ctypes.POINTER(ctypes.c_char_p)],
    "cuDeviceGet": [ctypes.POINTER(_I), _I],
    "cuDeviceGetCount": [ctypes.POINTER(_I)],
    "cuDevicePrimaryCtxRetain": [_PP, _I],
    "cuDevicePrimaryCtxRelease_v2": [_I],
    "cuCtxSetCurrent": [_P],
    "cuCtxSynchronize": [],
    "cuCtxSynchronize_v2": [_P],
    "cuCtxCreate_v4": [_PP, _P, _U, _I],
    "cuCtxDestroy_v2": [_P],
    "cuCtxGetCurrent": [_PP],
    "cuCtxPushCurrent_v2": [_P],
    "cuCtxPopCurrent_v2": [_PP],
    "cuDriverGetVersion": [ctypes.POINTER(_I)],
    "cuDeviceGetAttribute": [ctypes.POINTER(_I), _I, _I],
    "cuDeviceGetUuid_v2": [ctypes.c_char_p, _I],
    "cuDevicePrimaryCtxGetState": [_I, ctypes.POINTER(_U), ctypes.POINTER(_I)],
    "cuModuleLoadData": [_PP, ctypes.c_char_p],
    "cuModuleGetFunction": [_PP, _P, ctypes.c_char_p],
    "cuLaunchKernel": [_P, _U, _U, _U, _U, _U, _U, _U, _P, _PP, _PP],
    "cuStreamCreate": [_PP, _U],
    "cuStreamDestroy_v2": [_P],
    "cuStreamSynchronize": [_P],
    "cuStreamQuery": [_P],
    "cuStreamWaitEvent": [_P, _P, _U],
    "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), _SZ],
    "cuMemAllocAsync": [ctypes.POINTER(ctypes.c_uint64), _SZ, _P],
    "cuMemFree_v2": [ctypes.c_uint64],
    "cuMemGetInfo_v2": [_PSZ, _PSZ],
    "cuMemCreate": [
        ctypes.POINTER(ctypes.c_uint64),
        _SZ,
        ctypes.POINTER(MemAllocationProp),
        ctypes.c_ulonglong,
    ],
    "cuMemRelease": [ctypes.c_uint64],
    "cuPointerGetAttribute": [_P, _I, ctypes.c_uint64],
    "cuMemsetD8Async": [ctypes.c_uint64, ctypes.c_ubyte, _SZ, _P],
    "cuMemcpyHtoD_v2": [ctypes.c_uint64, _P, _SZ],
    "cuMemcpyDtoH_v2": [_P, ctypes.c_uint64, _SZ],
    "cuEventCreate": [_PP, _U],
    "cuEventDestroy_v2": [_P],
    "cuEventRecord": [_P, _P],
    "cuEventSynchronize": [_P],
    "cuEventQuery": [_P],
    "cuEventElapsedTime_v2": [ctypes.POINTER(ctypes.c_float), _P, _P],
    "cuStreamBeginCapture_v2": [_P, _I],
    "cuStreamEndCapture": [_P, _PP],
    "cuStreamIsCapturing": [_P, ctypes.POINTER(_I)],
    "cuThreadExchangeStreamCaptureMode": [ctypes.POINTER(_I)],
    "cuGraphInstantiateWithFlags": [_PP, _P, ctypes.c_ulonglong],
    "cuGraphLaunch": [_P, _P],
    "cuGraphExecDestroy": [_P],
    "cuGraphDestroy": [_P],
}


class CudaError(RuntimeError):
    """A driver call returned an error; ``code`` is the CUresult, ``name`` its name."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: {name} ({code})")
        self.call = call
        self.code = code
        self.name = name


class Driver:
    """The driver library, its functions typed, calls checked."""

    def __init__(self, soname: str = "libcuda.so.1") -> None:
        try:
            self.lib = ctypes.CDLL(soname)
        except OSError as exc:
            raise OSError(
                f"cannot load {soname} ({exc}); run with LD_LIBRARY_PATH naming build/fakecuda"
            ) from None
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int

    def error_name(self, code: int) -> str:
        """The CUresult's name (``CUDA_ERROR_...``), or ``?`` for an unknown code."""
        s = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(s)) != 0 or s.value is None:
            return "?"
        return s.value.decode()

    def call(self, name: str, *args: Any) -> None:
        """Call ``name``; raise CudaError unless it returns CUDA_SUCCESS."""
        code = self.try_call(name, *args)
        if code != 0:
            raise CudaError(name, code, self.error_name(code))

    def try_call(self, name: str, *args: Any) -> int:
        """Call ``name`` and return its CUresult (0 = success)."""
        return int(getattr(self.lib, name)(*args))


class FakeGpu:
    """One device's primary context, made current in the calling thread.

    Streams, events, graphs and device pointers are plain ints (handles);
    ``stream=None`` is the legacy default stream.  Methods raise CudaError.
    """

    def __init__(self, device: int = 0, driver: Driver | None = None) -> None:
        self.drv = driver or Driver()
        self.device = device
        self.drv.call("cuInit", 0)
        dev = ctypes.c_int()
        self.drv.call("cuDeviceGet", ctypes.byref(dev), device)
        self.ctx = ctypes.c_void_p()
        self.drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), dev.value)
        self.make_current()
        mod = ctypes.c_void_p()
        self.drv.call("cuModuleLoadData", ctypes.byref(mod), b"fake image")
        self.func = ctypes.c_void_p()
        self.drv.call("cuModuleGetFunction", ctypes.byref(self.func), mod, b"duration_kernel")

    def make_current(self) -> None:
        """Make this device's context current in the calling thread."""
        self.drv.call("cuCtxSetCurrent", self.ctx)

    def close(self) -> None:
        """Release the primary context (its streams and memory go with it)."""
        self.drv.call("cuDevicePrimaryCtxRelease_v2", self.device)

    # -- work --
    def launch(self, duration_ns: int, stream: int | None = None) -> None:
        """Launch one kernel running ``duration_ns`` ns on ``stream``."""
        dur = ctypes.c_uint64(duration_ns)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dur), ctypes.c_void_p))
        self.drv.call("cuLaunchKernel", self.func, 1, 1, 1, 1, 1, 1, 0, stream, params, None)

    def synchronize(self) -> None:
        """Wait for all work of the context (cuCtxSynchronize)."""
        self.drv.call("cuCtxSynchronize")

    # -- streams --
    def stream_create(self, nonblocking: bool = False) -> int:
        """Create a stream; ``nonblocking`` does not order with the legacy stream."""
        s = ctypes.c_void_p()
        self.drv.call(
            "cuStreamCreate", ctypes.byref(s), CU_STREAM_NON_BLOCKING if nonblocking else 0
        )
        assert s.value is not None
        return s.value

    def stream_destroy(self, stream: int) -> None:
        """Destroy a created stream (its enqueued work still runs)."""
        self.drv.call("cuStreamDestroy_v2", stream)

    def stream_synchronize(self, stream: int | None = None) -> None:
        """Wait for the work enqueued on ``stream``."""
        self.drv.call("cuStreamSynchronize", stream)

    def stream_wait_event(self, stream: int | None, event: int) -> None:
        """Make later work of ``stream`` wait for ``event`` (joins a capture it marks)."""
        self.drv.call("cuStreamWaitEvent", stream, event, 0)

    def stream_query(self, stream: int | None = None) -> bool:
        """True when all work of ``stream`` has completed."""
        code = self.drv.try_call("cuStreamQuery", stream)
        if code not in (0, CUDA_ERROR_NOT_READY):
            raise CudaError("cuStreamQuery", code, self.drv.error_name(code))
        return code == 0

    # -- memory --
    def alloc(self, nbytes: int) -> int:
        """Allocate ``nbytes`` of device memory; returns the device pointer."""
        p = ctypes.c_uint64()
        self.drv.call("cuMemAlloc_v2", ctypes.byref(p), nbytes)
        return p.value

    def alloc_async(self, nbytes: int, stream: int | None = None) -> int:
        """Allocate ``nbytes`` in stream order on ``stream`` (cuMemAllocAsync, a gated call)."""
        p = ctypes.c_uint64()
        self.drv.call("cuMemAllocAsync", ctypes.byref(p), nbytes, stream)
        return p.value

    def free(self, ptr: int) -> None:
        """Free device memory from :meth:`alloc` (synchronizes, like cuMemFree)."""
        self.drv.call("cuMemFree_v2", ptr)

    def mem_create(self, nbytes: int) -> int:
        """A physical allocation of ``nbytes`` on this device (cuMemCreate); the handle."""
        prop = MemAllocationProp()
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location = MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, self.device)
        h = ctypes.c_uint64()
        self.drv.call("cuMemCreate", ctypes.byref(h), nbytes, ctypes.byref(prop), 0)
        return h.value

    def mem_release(self, handle: int) -> None:
        """Release a physical allocation from :meth:`mem_create` (cuMemRelease)."""
        self.drv.call("cuMemRelease", handle)

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of this device, as all processes share it."""
        free_b, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.drv.call("cuMemGetInfo_v2", ctypes.byref(free_b), ctypes.byref(total))
        return free_b.value, total.value

    def memset(self, ptr: int, value: int, nbytes: int, stream: int | None = None) -> None:
        """Set ``nbytes`` bytes at ``ptr`` to ``value`` (a stream operation)."""
        self.drv.call("cuMemsetD8Async", ptr, value, nbytes, stream)

    def to_device(self, ptr: int, data: bytes) -> None:
        """Copy ``data`` to device memory at ``ptr`` (synchronous)."""
        buf = ctypes.create_string_buffer(data, len(data))
        self.drv.call("cuMemcpyHtoD_v2", ptr, ctypes.cast(buf, ctypes.c_void_p), len(data))

    def from_device(self, ptr: int, nbytes: int) -> bytes:
        """Copy ``nbytes`` from device memory at ``ptr`` (synchronous)."""
        buf = ctypes.create_string_buffer(nbytes)
        self.drv.call("cuMemcpyDtoH_v2", ctypes.cast(buf, ctypes.c_void_p), ptr, nbytes)
        return buf.raw

    # -- events --
    def event_create(self, timing: bool = True) -> int:
        """Create an event (``timing`` False: CU_EVENT_DISABLE_TIMING)."""
        e = ctypes.c_void_p()
        self.drv.call("cuEventCreate", ctypes.byref(e), 0 if timing else CU_EVENT_DISABLE_TIMING)
        assert e.value is not None
        return e.value

    def event_record(self, event: int, stream: int | None = None) -> None:
        """Record ``event`` at the current end of ``stream``."""
        self.drv.call("cuEventRecord", event, stream)

    def event_synchronize(self, event: int) -> None:
        """Wait until the device reaches ``event``."""
        self.drv.call("cuEventSynchronize", event)

    def event_query(self, event: int) -> bool:
        """True when the device has reached ``event``."""
        code = self.drv.try_call("cuEventQuery", event)
        if code not in (0, CUDA_ERROR_NOT_READY):
            raise CudaError("cuEventQuery", code, self.drv.error_name(code))
        return code == 0

    def event_elapsed_ms(self, start: int, end: int) -> float:
        """Device time between two completed events, in ms."""
        ms = ctypes.c_float()
        self.drv.call("cuEventElapsedTime_v2", ctypes.byref(ms), start, end)
        return ms.value

    def event_destroy(self, event: int) -> None:
        """Destroy an event."""
        self.drv.call("cuEventDestroy_v2", event)

    # -- capture and graphs --
    def begin_capture(self, stream: int, mode: str = "global") -> None:
        """Start capturing ``stream`` (mode: global, thread_local or relaxed)."""
        self.drv.call("cuStreamBeginCapture_v2", stream, CAPTURE_MODES[mode])

    def end_capture(self, stream: int) -> int:
        """End the capture of ``stream``; returns the captured graph."""
        g = ctypes.c_void_p()
        self.drv.call("cuStreamEndCapture", stream, ctypes.byref(g))
        assert g.value is not None
        return g.value

    def capture_status(self, stream: int | None) -> str:
        """``none``, ``active`` or ``invalidated``."""
        st = ctypes.c_int()
        self.drv.call("cuStreamIsCapturing", stream, ctypes.byref(st))
        return CAPTURE_STATUS[st.value]

    def exchange_capture_mode(self, mode: str) -> str:
        """Set this thread's capture interaction mode; returns the previous one."""
        m = ctypes.c_int(CAPTURE_MODES[mode])
        self.drv.call("cuThreadExchangeStreamCaptureMode", ctypes.byref(m))
        return {v: k for k, v in CAPTURE_MODES.items()}[m.value]

    def instantiate(self, graph: int) -> int:
        """Instantiate ``graph``; returns the executable graph."""
        e = ctypes.c_void_p()
        self.drv.call("cuGraphInstantiateWithFlags", ctypes.byref(e), graph, 0)
        assert e.value is not None
        return e.value

    def graph_launch(self, exec_graph: int, stream: int | None = None) -> None:
        """Launch an executable graph on ``stream``."""
        self.drv.call("cuGraphLaunch", exec_graph, stream)


_default: FakeGpu | None = None


def init(device: int = 0) -> FakeGpu:
    """Initialize the driver and make ``device`` current; returns the default FakeGpu.

    Under ``KREX_TEST_GPU_API=hip``: a ``hipgpu.HipGpu`` of the fake HIP runtime
    (the same methods; typed as FakeGpu for its callers).
    """
    global _default
    if _default is None:
        _default = _hip(device) if os.environ.get("KREX_TEST_GPU_API") == "hip" else FakeGpu(device)
    return _default


def _hipgpu() -> Any:
    """The module tests/fakehip/hipgpu.py, beside this module's folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    folder = os.path.join(os.path.dirname(here), "fakehip")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import hipgpu  # noqa: PLC0415 - only HIP tenants load it

    return hipgpu


def _hip(device: int) -> Any:
    """``hipgpu.init(device)``."""
    return _hipgpu().init(device)


def error_type() -> type[RuntimeError]:
    """What a failed call of :func:`init`'s device raises: :class:`CudaError`, or under
    ``KREX_TEST_GPU_API=hip`` ``hipgpu.HipError`` (both carry ``code`` and ``name``)."""
    if os.environ.get("KREX_TEST_GPU_API") == "hip":
        err: type[RuntimeError] = _hipgpu().HipError
        return err
    return CudaError


def _gpu() -> FakeGpu:
    return _default if _default is not None else init()


def launch(duration_ns: int, stream: int | None = None) -> None:
    """Launch a ``duration_ns`` kernel on the default device."""
    _gpu().launch(duration_ns, stream)


def synchronize() -> None:
    """Wait for all work of the default device's context."""
    _gpu().synchronize()


def alloc(nbytes: int) -> int:
    """Allocate ``nbytes`` of device memory on the default device."""
    return _gpu().alloc(nbytes)


def free(ptr: int) -> None:
    """Free device memory from :func:`alloc`."""
    _gpu().free(ptr)


def main(argv: list[str] | None = None) -> int:
    """Command-line tenant: launch kernels, print a JSON summary on stdout."""
    ap = argparse.ArgumentParser(description="launch fake-driver kernels from Python")
    ap.add_argument("--count", type=int, default=10, help="kernels to launch (default 10)")
    ap.add_argument("--seconds", type=float, help="launch for this long instead of --count")
    ap.add_argument("--kernel-ns", type=int, default=1_000_000, help="kernel duration, ns")
    ap.add_argument("--sync-every", type=int, default=0, help="synchronize every K launches")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=1, help="launching threads, each on its own stream"
    )
    args = ap.parse_args(argv)
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    gpu = init(args.device)
    start = time.monotonic_ns()
    deadline = start + int(args.seconds * 1e9) if args.seconds else None
    counts = [0] * args.threads

    def loop(i: int) -> None:
        # ctypes drops the GIL in each driver call: the threads' calls overlap.
        gpu.make_current()
        stream = gpu.stream_create() if args.threads > 1 else None
        n = 0
        while not stop and (time.monotonic_ns() < deadline if deadline else n < args.count):
            gpu.launch(args.kernel_ns, stream)
            n += 1
            if args.sync_every and n % args.sync_every == 0:
                gpu.stream_synchronize(stream)
        counts[i] = n

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(1, args.threads)]
    for w in workers:
        w.start()
    loop(0)
    for w in workers:
        w.join()
    gpu.synchronize()
    end = time.monotonic_ns()
    out = {"pid": os.getpid(), "launches": sum(counts), "start_ns": start, "end_ns": end}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
