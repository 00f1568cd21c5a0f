"""A tiny HIP runtime binding (ctypes) so Python test tenants act like HIP programs.

It loads ``libamdhip64.so.6`` by name, as a ROCm PyTorch does, so a process
started with ``LD_LIBRARY_PATH=build/fakehip`` gets the fake runtime and an
LD_PRELOADed interposer sees its calls as it would a real program's.
Kernels are duration kernels: ``launch(duration_ns)`` occupies the stream
for that many ns (tests/fakehip/README.md).

Library use::

    import hipgpu
    g = hipgpu.init()
    g.launch(2_000_000)        # a 2 ms kernel on the null stream
    g.synchronize()

This module imports nothing from the project.
"""

from __future__ import annotations

import ctypes
from typing import Any

HIP_STREAM_NON_BLOCKING = 0x1
HIP_EVENT_DISABLE_TIMING = 0x2
HIP_ERROR_NOT_READY = 600
MEMCPY = {"h2h": 0, "h2d": 1, "d2h": 2, "d2d": 3, "default": 4}
CAPTURE_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}
CAPTURE_STATUS = {0: "none", 1: "active", 2: "invalidated"}

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_U = ctypes.c_uint
_I = ctypes.c_int
_SZ = ctypes.c_size_t
_PSZ = ctypes.POINTER(ctypes.c_size_t)


class Dim3(ctypes.Structure):
    """HIP's dim3, passed by value."""

    _fields_ = [("x", ctypes.c_uint32), ("y", ctypes.c_uint32), ("z", ctypes.c_uint32)]


class Extent(ctypes.Structure):
    """hipExtent, passed by value (width in bytes for linear memory, in elements for arrays)."""

    _fields_ = [("width", _SZ), ("height", _SZ), ("depth", _SZ)]


class PitchedPtr(ctypes.Structure):
    """hipPitchedPtr, what hipMalloc3D fills in."""

    _fields_ = [("ptr", _P), ("pitch", _SZ), ("xsize", _SZ), ("ysize", _SZ)]


class ChannelFormatDesc(ctypes.Structure):
    """hipChannelFormatDesc: bits per channel and the channels' kind."""

    _fields_ = [("x", _I), ("y", _I), ("z", _I), ("w", _I), ("f", _I)]


class ArrayDescriptor(ctypes.Structure):
    """HIP_ARRAY_DESCRIPTOR (hipArrayCreate)."""

    _fields_ = [("Width", _SZ), ("Height", _SZ), ("Format", _I), ("NumChannels", _U)]


class Array3DDescriptor(ctypes.Structure):
    """HIP_ARRAY3D_DESCRIPTOR (hipArray3DCreate)."""

    _fields_ = [
        ("Width", _SZ),
        ("Height", _SZ),
        ("Depth", _SZ),
        ("Format", _I),
        ("NumChannels", _U),
        ("Flags", _U),
    ]


class MemLocation(ctypes.Structure):
    """hipMemLocation."""

    _fields_ = [("type", _I), ("id", _I)]


class MemAllocationProp(ctypes.Structure):
    """hipMemAllocationProp, HIP 5.2's layout (the fake's, tests/fakehip/hip_api.h)."""

    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("location", MemLocation),
        ("requestedHandleType", _I),
        ("type", _I),
        ("usage", ctypes.c_ushort),
        ("win32HandleMetaData", _P),
    ]


# Arrays of float4 elements: 16 bytes each.
CHANNEL_FORMAT_KIND_FLOAT = 2
AD_FORMAT_FLOAT = 0x20
FLOAT4_BYTES = 16
MEM_LOCATION_TYPE_DEVICE = 1
MEM_ALLOCATION_TYPE_PINNED = 1
# How an array is made, and the free that goes with it.
ARRAY_CALLS = {
    "hipMallocArray": "hipFreeArray",
    "hipMalloc3DArray": "hipFreeArray",
    "hipArrayCreate": "hipArrayDestroy",
    "hipArray3DCreate": "hipArrayDestroy",
}


# name -> argument types (all return hipError_t, an int)
_SIGNATURES: dict[str, list[Any]] = {
    "hipInit": [_U],
    "hipGetDeviceCount": [ctypes.POINTER(_I)],
    "hipSetDevice": [_I],
    "hipGetDevice": [ctypes.POINTER(_I)],
    "hipDeviceSynchronize": [],
    "hipDeviceGetAttribute": [ctypes.POINTER(_I), _I, _I],
    "hipMemGetInfo": [_PSZ, _PSZ],
    "hipMalloc": [_PP, _SZ],
    "hipFree": [_P],
    "hipMallocAsync": [_PP, _SZ, _P],
    "hipFreeAsync": [_P, _P],
    "hipMalloc3D": [ctypes.POINTER(PitchedPtr), Extent],
    "hipMallocArray": [_PP, ctypes.POINTER(ChannelFormatDesc), _SZ, _SZ, _U],
    "hipMalloc3DArray": [_PP, ctypes.POINTER(ChannelFormatDesc), Extent, _U],
    "hipArrayCreate": [_PP, ctypes.POINTER(ArrayDescriptor)],
    "hipArray3DCreate": [_PP, ctypes.POINTER(Array3DDescriptor)],
    "hipFreeArray": [_P],
    "hipArrayDestroy": [_P],
    "hipMemCreate": [_PP, _SZ, ctypes.POINTER(MemAllocationProp), ctypes.c_ulonglong],
    "hipMemRelease": [_P],
    "hipHostMalloc": [_PP, _SZ, _U],
    "hipHostFree": [_P],
    "hipMemcpy": [_P, _P, _SZ, _I],
    "hipMemcpyAsync": [_P, _P, _SZ, _I, _P],
    "hipMemset": [_P, _I, _SZ],
    "hipMemsetAsync": [_P, _I, _SZ, _P],
    "hipStreamCreateWithFlags": [_PP, _U],
    "hipStreamCreateWithPriority": [_PP, _U, _I],
    "hipStreamGetPriority": [_P, ctypes.POINTER(_I)],
    "hipStreamDestroy": [_P],
    "hipStreamSynchronize": [_P],
    "hipStreamQuery": [_P],
    "hipStreamWaitEvent": [_P, _P, _U],
    "hipEventCreateWithFlags": [_PP, _U],
    "hipEventRecord": [_P, _P],
    "hipEventSynchronize": [_P],
    "hipEventQuery": [_P],
    "hipEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _P, _P],
    "hipEventDestroy": [_P],
    "hipModuleLoadData": [_PP, ctypes.c_char_p],
    "hipModuleGetFunction": [_PP, _P, ctypes.c_char_p],
    "hipModuleLaunchKernel": [_P, _U, _U, _U, _U, _U, _U, _U, _P, _PP, _PP],
    "hipLaunchKernel": [_P, Dim3, Dim3, _PP, _SZ, _P],
    "hipLaunchHostFunc": [_P, _P, _P],
    "hipStreamBeginCapture": [_P, _I],
    "hipStreamEndCapture": [_P, _PP],
    "hipStreamIsCapturing": [_P, ctypes.POINTER(_I)],
    "hipGraphInstantiate": [_PP, _P, _PP, ctypes.c_char_p, _SZ],
    "hipGraphLaunch": [_P, _P],
    "hipGraphExecDestroy": [_P],
    "hipGraphDestroy": [_P],
    "hipGetLastError": [],
    "hipPeekAtLastError": [],
}

HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class HipError(RuntimeError):
    """A HIP call returned ``code`` (named by hipGetErrorName)."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call}: {name} ({code})")
        self.call = call
        self.code = code
        self.name = name


class Hip:
    """The loaded runtime; ``call`` raises HipError, ``try_call`` returns the code."""

    def __init__(self, name: str = "libamdhip64.so.6") -> None:
        self.lib = ctypes.CDLL(name)
        for fn, args in _SIGNATURES.items():
            f = getattr(self.lib, fn)
            f.argtypes = args
            f.restype = _I
        for fn in ("hipGetErrorName", "hipGetErrorString"):
            f = getattr(self.lib, fn)
            f.argtypes = [_I]
            f.restype = ctypes.c_char_p

    def error_name(self, code: int) -> str:
        """hipGetErrorName(code)."""
        return str(self.lib.hipGetErrorName(code).decode())

    def error_string(self, code: int) -> str:
        """hipGetErrorString(code)."""
        return str(self.lib.hipGetErrorString(code).decode())

    def try_call(self, fn: str, *args: Any) -> int:
        """Call ``fn``; return its hipError_t."""
        return int(getattr(self.lib, fn)(*args))

    def call(self, fn: str, *args: Any) -> None:
        """Call ``fn``; raise HipError unless it returns hipSuccess."""
        code = self.try_call(fn, *args)
        if code != 0:
            raise HipError(fn, code, self.error_name(code))


class HipGpu:
    """The calling thread's current device, through a :class:`Hip`."""

    def __init__(self, hip: Hip, device: int = 0) -> None:
        self.hip = hip
        self.device = device
        hip.call("hipInit", 0)
        hip.call("hipSetDevice", device)
        mod = ctypes.c_void_p()
        hip.call("hipModuleLoadData", ctypes.byref(mod), b"fake hip code object")
        self.module = mod
        fn = ctypes.c_void_p()
        hip.call("hipModuleGetFunction", ctypes.byref(fn), mod, b"duration_kernel")
        self.fn = fn
        self._keep: list[Any] = []  # host functions and arguments in flight

    def stream_create(self, nonblocking: bool = False, priority: int | None = None) -> int:
        """A new stream (a handle as an int)."""
        s = ctypes.c_void_p()
        flags = HIP_STREAM_NON_BLOCKING if nonblocking else 0
        if priority is None:
            self.hip.call("hipStreamCreateWithFlags", ctypes.byref(s), flags)
        else:
            self.hip.call("hipStreamCreateWithPriority", ctypes.byref(s), flags, priority)
        return int(s.value or 0)

    def launch(self, duration_ns: int, stream: int | None = None) -> None:
        """A duration kernel through hipModuleLaunchKernel (stream None: the null stream)."""
        dur = ctypes.c_uint64(duration_ns)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dur), ctypes.c_void_p))
        self.hip.call("hipModuleLaunchKernel", self.fn, 1, 1, 1, 1, 1, 1, 0, stream, params, None)

    def launch_host_ptr(self, duration_ns: int, key: int, stream: int | None = None) -> None:
        """A duration kernel through hipLaunchKernel, ``key`` its host function pointer."""
        dur = ctypes.c_uint64(duration_ns)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dur), ctypes.c_void_p))
        one = Dim3(1, 1, 1)
        self.hip.call("hipLaunchKernel", key, one, one, params, 0, stream)

    def host_func(self, fn: Any, stream: int | None = None) -> None:
        """hipLaunchHostFunc of a Python callable taking no argument."""
        cb = HOST_FN(lambda _arg: fn())
        self._keep.append(cb)
        self.hip.call("hipLaunchHostFunc", stream, cb, None)

    def synchronize(self) -> None:
        """hipDeviceSynchronize."""
        self.hip.call("hipDeviceSynchronize")

    def stream_synchronize(self, stream: int | None) -> None:
        """hipStreamSynchronize."""
        self.hip.call("hipStreamSynchronize", stream)

    def stream_query(self, stream: int | None) -> bool:
        """True when the stream's work has ended (hipStreamQuery)."""
        code = self.hip.try_call("hipStreamQuery", stream)
        if code not in (0, HIP_ERROR_NOT_READY):
            raise HipError("hipStreamQuery", code, self.hip.error_name(code))
        return code == 0

    def event_create(self, timing: bool = True) -> int:
        """A new event."""
        e = ctypes.c_void_p()
        flags = 0 if timing else HIP_EVENT_DISABLE_TIMING
        self.hip.call("hipEventCreateWithFlags", ctypes.byref(e), flags)
        return int(e.value or 0)

    def event_record(self, event: int, stream: int | None = None) -> None:
        """hipEventRecord."""
        self.hip.call("hipEventRecord", event, stream)

    def event_synchronize(self, event: int) -> None:
        """hipEventSynchronize."""
        self.hip.call("hipEventSynchronize", event)

    def event_query(self, event: int) -> bool:
        """True when the event has completed (hipEventQuery)."""
        code = self.hip.try_call("hipEventQuery", event)
        if code not in (0, HIP_ERROR_NOT_READY):
            raise HipError("hipEventQuery", code, self.hip.error_name(code))
        return code == 0

    def event_elapsed_ms(self, start: int, end: int) -> float:
        """hipEventElapsedTime."""
        ms = ctypes.c_float()
        self.hip.call("hipEventElapsedTime", ctypes.byref(ms), start, end)
        return float(ms.value)

    def malloc(self, size: int) -> int:
        """hipMalloc; the device pointer as an int."""
        p = ctypes.c_void_p()
        self.hip.call("hipMalloc", ctypes.byref(p), size)
        return int(p.value or 0)

    def malloc_async(self, size: int, stream: int | None = None) -> int:
        """hipMallocAsync on ``stream`` (None: the null stream); the device pointer."""
        p = ctypes.c_void_p()
        self.hip.call("hipMallocAsync", ctypes.byref(p), size, stream)
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        """hipFree."""
        self.hip.call("hipFree", ptr)

    def malloc3d(self, width: int, height: int, depth: int) -> tuple[int, int]:
        """hipMalloc3D of rows of ``width`` bytes; (the device pointer, the pitch)."""
        pp = PitchedPtr()
        self.hip.call("hipMalloc3D", ctypes.byref(pp), Extent(width, height, depth))
        return int(pp.ptr or 0), int(pp.pitch)

    def array_create(
        self, width: int, height: int = 0, depth: int = 0, how: str = "hipArray3DCreate"
    ) -> int:
        """An array of float4 elements (16 bytes) made by ``how`` (a key of ARRAY_CALLS;
        hipMallocArray and hipArrayCreate take no depth); its handle."""
        a = ctypes.c_void_p()
        desc = ChannelFormatDesc(32, 32, 32, 32, CHANNEL_FORMAT_KIND_FLOAT)
        if how == "hipMallocArray":
            assert depth == 0
            self.hip.call(how, ctypes.byref(a), ctypes.byref(desc), width, height, 0)
        elif how == "hipMalloc3DArray":
            self.hip.call(how, ctypes.byref(a), ctypes.byref(desc), Extent(width, height, depth), 0)
        elif how == "hipArrayCreate":
            assert depth == 0
            d2 = ArrayDescriptor(width, height, AD_FORMAT_FLOAT, 4)
            self.hip.call(how, ctypes.byref(a), ctypes.byref(d2))
        else:
            d3 = Array3DDescriptor(width, height, depth, AD_FORMAT_FLOAT, 4, 0)
            self.hip.call("hipArray3DCreate", ctypes.byref(a), ctypes.byref(d3))
        return int(a.value or 0)

    def array_free(self, array: int, how: str = "hipFreeArray") -> None:
        """hipFreeArray (or ``how`` = hipArrayDestroy) of an array."""
        self.hip.call(how, array)

    def mem_create(self, size: int) -> int:
        """hipMemCreate of ``size`` bytes on this object's device; the handle."""
        prop = MemAllocationProp()
        prop.type = MEM_ALLOCATION_TYPE_PINNED
        prop.location = MemLocation(MEM_LOCATION_TYPE_DEVICE, self.device)
        h = ctypes.c_void_p()
        self.hip.call("hipMemCreate", ctypes.byref(h), size, ctypes.byref(prop), 0)
        return int(h.value or 0)

    def mem_release(self, handle: int) -> None:
        """hipMemRelease."""
        self.hip.call("hipMemRelease", handle)

    def memcpy(self, dst: int, src: int, size: int, kind: str, stream: int | None = None) -> None:
        """hipMemcpy (stream None) or hipMemcpyAsync; ``kind`` a key of MEMCPY."""
        if stream is None:
            self.hip.call("hipMemcpy", dst, src, size, MEMCPY[kind])
        else:
            self.hip.call("hipMemcpyAsync", dst, src, size, MEMCPY[kind], stream)

    def mem_get_info(self) -> tuple[int, int]:
        """hipMemGetInfo: (free, total)."""
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.hip.call("hipMemGetInfo", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def begin_capture(self, stream: int, mode: str = "global") -> None:
        """hipStreamBeginCapture."""
        self.hip.call("hipStreamBeginCapture", stream, CAPTURE_MODES[mode])

    def end_capture(self, stream: int) -> int:
        """hipStreamEndCapture; the graph."""
        g = ctypes.c_void_p()
        self.hip.call("hipStreamEndCapture", stream, ctypes.byref(g))
        return int(g.value or 0)

    def capture_status(self, stream: int) -> str:
        """hipStreamIsCapturing, as none/active/invalidated."""
        st = ctypes.c_int()
        self.hip.call("hipStreamIsCapturing", stream, ctypes.byref(st))
        return CAPTURE_STATUS[st.value]

    def instantiate(self, graph: int) -> int:
        """hipGraphInstantiate; the executable graph."""
        x = ctypes.c_void_p()
        self.hip.call("hipGraphInstantiate", ctypes.byref(x), graph, None, None, 0)
        return int(x.value or 0)

    def graph_launch(self, exec_graph: int, stream: int | None) -> None:
        """hipGraphLaunch."""
        self.hip.call("hipGraphLaunch", exec_graph, stream)

    # The names tests/fakecuda/fakegpu.py's FakeGpu gives the same calls, so a test
    # tenant written against it runs over HIP unchanged (KREX_TEST_GPU_API=hip).

    def make_current(self) -> None:
        """hipSetDevice of this object's device on the calling thread."""
        self.hip.call("hipSetDevice", self.device)

    def alloc(self, size: int) -> int:
        """:meth:`malloc`."""
        return self.malloc(size)

    def alloc_async(self, size: int, stream: int | None = None) -> int:
        """:meth:`malloc_async`."""
        return self.malloc_async(size, stream)

    def mem_info(self) -> tuple[int, int]:
        """:meth:`mem_get_info`: (free, total) bytes."""
        return self.mem_get_info()

    def close(self) -> None:
        """Nothing to release: the process's primary context lives as long as it does."""


def init(device: int = 0) -> HipGpu:
    """Load the runtime and make ``device`` current."""
    return HipGpu(Hip(), device)
