"""A HIP tenant for the shim's HIP tests, driven one command line at a time.

Run over the fake HIP runtime (tests/fakehip: ``hipgpu`` on PYTHONPATH) under
the shim.  Each command gets one JSON reply line ``{"cmd", "rc", "t0", "t1",
...}`` (``rc`` 0, or the HIP error code; t0/t1 CLOCK_MONOTONIC ns around the
call).  Commands:

  init                      hipInit, the device, a module and its function
  count                     hipGetDeviceCount (class D: not gated; "count")
  malloc MIB [HOW]          MIB MiB of device memory ("ptr": the pointer or handle), by
                            hipMalloc, or HOW: async (hipMallocAsync on the null stream),
                            memcreate (hipMemCreate), malloc3d (hipMalloc3D: MIB slices of
                            1024 rows of 1000 bytes, padded to a 1024-byte pitch), array
                            (hipMalloc3DArray of float4 elements, 1024 x 64 x MIB)
  free PTR [HOW]            free what ``malloc MIB HOW`` gave: hipFree, hipFreeAsync,
                            hipMemRelease, hipFree, hipFreeArray
  launch NS [S] [N]         hipModuleLaunchKernel of an NS-ns kernel (S: a stream index), N times
  launch_ptr NS [S]         hipLaunchKernel (a host function as the kernel's key)
  ext NS [S]                hipExtModuleLaunchKernel
  stream [nonblocking]      a new stream, blocking unless said (its index in "stream")
  capture_begin S [MODE]    hipStreamBeginCapture (global, thread_local, relaxed)
  capture_end S             hipStreamEndCapture, then hipGraphInstantiate (the graph kept)
  capture_status S          hipStreamIsCapturing ("status")
  graph_launch [S]          hipGraphLaunch of the last instantiated graph
  sync                      hipDeviceSynchronize
  region_begin EPOCH L2     krex_shim_region_begin ("rc" its result): adds "flushed"
                            (krex_shim_region_l2_flushed) and "last_error" (hipPeekAtLastError)
  region_end                krex_shim_region_end: adds "sync_ns" and "launches"
  region_warm US            krex_shim_region_warm: adds "spent" (its result)
  cuda_init                 the fake CUDA driver too (tests/fakecuda/fakegpu.py)
  cuda_launch NS            a CUDA kernel of NS ns
  fork                      fork; the child answers the next commands (the parent waits
                            for it, then replies {"cmd": "fork", "child_rc": ...})
  quit
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from typing import Any

import hipgpu

_P = ctypes.c_void_p
_U = ctypes.c_uint32


def now() -> int:
    return time.monotonic_ns()


class Tenant:
    def __init__(self) -> None:
        self.hip = hipgpu.Hip()
        lib = self.hip.lib
        lib.hipExtModuleLaunchKernel.argtypes = [_P, _U, _U, _U, _U, _U, _U, ctypes.c_size_t, _P,
                                                 ctypes.POINTER(_P), ctypes.POINTER(_P), _P, _P,
                                                 _U]  # fmt: skip
        lib.hipExtModuleLaunchKernel.restype = ctypes.c_int
        self.gpu: hipgpu.HipGpu | None = None
        self.streams: list[int | None] = [None]
        self.exec_graph = 0
        self.cuda: Any = None
        self.keep: list[Any] = []

    def stream(self, args: list[str], at: int) -> int | None:
        return self.streams[int(args[at])] if len(args) > at else None

    def params(self, ns: int) -> Any:
        dur = ctypes.c_uint64(ns)
        self.keep.append(dur)
        p = (_P * 1)(ctypes.cast(ctypes.byref(dur), _P))
        self.keep.append(p)
        return p

    def mem(self) -> hipgpu.HipGpu:
        """The device (made by ``init`` or now) for the allocations hipgpu spells."""
        if self.gpu is None:
            self.gpu = hipgpu.HipGpu(self.hip)
        return self.gpu

    def malloc(self, mib: int, how: str) -> int:
        size = mib << 20
        if how == "memcreate":
            return self.mem().mem_create(size)
        if how == "malloc3d":
            return self.mem().malloc3d(1000, 1024, mib)[0]
        if how == "array":
            return self.mem().array_create(1024, 64, mib, how="hipMalloc3DArray")
        p = ctypes.c_void_p()
        if how == "async":
            self.hip.call("hipMallocAsync", ctypes.byref(p), size, None)
        else:
            self.hip.call("hipMalloc", ctypes.byref(p), size)
        return p.value or 0

    def free(self, ptr: int, how: str) -> None:
        if how == "async":
            self.hip.call("hipFreeAsync", ptr, None)
        else:
            fn = {"memcreate": "hipMemRelease", "array": "hipFreeArray"}.get(how, "hipFree")
            self.hip.call(fn, ptr)

    def run(self, cmd: str, args: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        g = self.gpu
        if cmd == "init":
            self.gpu = hipgpu.HipGpu(self.hip)
        elif cmd == "malloc":
            out["ptr"] = self.malloc(int(args[0]), args[1] if len(args) > 1 else "sync")
        elif cmd == "free":
            self.free(int(args[0]), args[1] if len(args) > 1 else "sync")
        elif cmd == "count":
            n = ctypes.c_int(0)
            self.hip.call("hipGetDeviceCount", ctypes.byref(n))
            out["count"] = n.value
        elif cmd == "launch":
            assert g is not None
            for _ in range(int(args[2]) if len(args) > 2 else 1):
                g.launch(int(args[0]), self.stream(args, 1))
        elif cmd == "launch_ptr":
            assert g is not None
            key = ctypes.cast(self.hip.lib.hipGetErrorName, _P).value or 0
            g.launch_host_ptr(int(args[0]), key, self.stream(args, 1))
        elif cmd == "ext":
            assert g is not None
            code = self.hip.lib.hipExtModuleLaunchKernel(
                g.fn, 1, 1, 1, 1, 1, 1, 0, self.stream(args, 1), self.params(int(args[0])),
                None, None, None, 0,
            )  # fmt: skip
            if code:
                raise hipgpu.HipError("hipExtModuleLaunchKernel", code, self.hip.error_name(code))
        elif cmd == "stream":
            assert g is not None
            self.streams.append(g.stream_create(nonblocking=args[:1] == ["nonblocking"]))
            out["stream"] = len(self.streams) - 1
        elif cmd == "capture_begin":
            assert g is not None
            g.begin_capture(self.streams[int(args[0])] or 0, args[1] if len(args) > 1 else "global")
        elif cmd == "capture_end":
            assert g is not None
            graph = g.end_capture(self.streams[int(args[0])] or 0)
            self.exec_graph = g.instantiate(graph)
        elif cmd == "capture_status":
            assert g is not None
            out["status"] = g.capture_status(self.streams[int(args[0])] or 0)
        elif cmd == "graph_launch":
            assert g is not None
            g.graph_launch(self.exec_graph, self.stream(args, 0))
        elif cmd == "sync":
            assert g is not None
            g.synchronize()
        elif cmd == "region_begin":
            shim = ctypes.CDLL(None)
            begin = shim.krex_shim_region_begin
            begin.argtypes, begin.restype = [_U, ctypes.c_int], ctypes.c_int
            out["rc"] = begin(int(args[0]), int(args[1]))
            out["flushed"] = shim.krex_shim_region_l2_flushed()
            # What the program's next hipGetLastError would read (not consumed here).
            out["last_error"] = self.hip.try_call("hipPeekAtLastError")
        elif cmd == "region_end":
            end = ctypes.CDLL(None).krex_shim_region_end
            sync_ns, launches = ctypes.c_uint64(), ctypes.c_uint64()
            end.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 2
            out["rc"] = end(ctypes.byref(sync_ns), ctypes.byref(launches))
            out["sync_ns"], out["launches"] = sync_ns.value, launches.value
        elif cmd == "region_warm":
            warm = ctypes.CDLL(None).krex_shim_region_warm
            warm.argtypes, warm.restype = [_U], ctypes.c_int
            out["spent"] = warm(int(args[0]))
        elif cmd == "cuda_init":
            import fakegpu

            self.cuda = fakegpu.init()
        elif cmd == "cuda_launch":
            self.cuda.launch(int(args[0]))
        else:
            raise ValueError(f"unknown command {cmd}")
        return out


def reply(d: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()


def main() -> None:
    t = Tenant()
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd, args = words[0], words[1:]
        if cmd == "quit":
            break
        if cmd == "fork":
            pid = os.fork()
            if pid == 0:
                reply({"cmd": "fork", "child": os.getpid()})
                continue  # the child reads the next commands
            _, status = os.waitpid(pid, 0)
            reply({"cmd": "fork", "child_rc": os.waitstatus_to_exitcode(status)})
            continue
        t0 = now()
        try:
            extra = t.run(cmd, args)
            rc = 0
        except hipgpu.HipError as e:
            extra, rc = {"error": str(e)}, e.code
        reply({"cmd": cmd, "rc": rc, "t0": t0, "t1": now(), "pid": os.getpid(), **extra})


if __name__ == "__main__":
    main()
