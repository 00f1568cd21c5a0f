"""Run each framework's GPU work under the shim; check results and launch counts.

For every case: build and warm it up, then run it K times, counting the
launches with ``krex_shim_region_launches`` (the shim's own launch counter)
inside a ``torch.profiler`` window (CUPTI's kernel records,
an independent count).  Prints one JSON line per case:
``{"case", "correct", "shim_launches", "profiler_kernels", "calls"}``.
Run it under ``krex run`` (the shim preloaded, gate mapped).
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

K = 5
_lib = ctypes.CDLL(None)
# Launches the shim counted (since the last region_begin, which only the gate's
# holder may call: the difference over the block is what we need).
_launches = _lib.krex_shim_region_launches
_launches.restype = ctypes.c_uint64


def count(fn: Callable[[], Any]) -> tuple[int, int]:
    """(launches the shim saw, kernels CUPTI saw) for K calls of fn."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        before = _launches()
        for _ in range(K):
            fn()
        torch.cuda.synchronize()
        launches = _launches() - before
    kernels = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not e.name.startswith(("Memcpy", "Memset", "[memory]"))
    ]
    return int(launches), len(kernels)


def report(case: str, correct: bool, fn: Callable[[], Any], calls: str = "kernel") -> None:
    shim, prof = count(fn)
    print(
        json.dumps(
            {
                "case": case,
                "correct": bool(correct),
                "shim_launches": shim,
                "profiler_kernels": prof,
                "calls": calls,
            }
        ),
        flush=True,
    )


def main() -> None:
    dev = "cuda"
    torch.manual_seed(0)
    a = torch.randn(1 << 20, device=dev)
    b = torch.randn(1 << 20, device=dev)
    report("torch eager add", torch.allclose((a + b).cpu(), a.cpu() + b.cpu()), lambda: a + b)

    m = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
    ref = m.float().cpu() @ m.float().cpu()
    report(
        "cuBLAS bf16 matmul",
        torch.allclose((m @ m).float().cpu(), ref, rtol=5e-2, atol=2.0),
        lambda: m @ m,
    )

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    m @ m
    e.record()
    torch.cuda.synchronize()
    ms = s.elapsed_time(e)

    def timed() -> None:
        s.record()
        m @ m
        e.record()

    report("torch.cuda.Event timing", 0 < ms < 100, timed)

    static_x = torch.randn(4096, device=dev)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            y = static_x * 2 + 1
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        y = static_x * 2
        z = y + 1
    static_x.copy_(torch.arange(4096, device=dev, dtype=torch.float32))
    g.replay()
    torch.cuda.synchronize()
    ok = torch.equal(z.cpu(), torch.arange(4096, dtype=torch.float32) * 2 + 1)
    report("CUDA graph capture+replay", ok, g.replay, calls="graph")

    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs,
            tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
            mask=mask,
        )

    out = torch.empty_like(a)

    def tri() -> None:
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)

    tri()
    torch.cuda.synchronize()
    report("Triton kernel", torch.allclose(out, a + b), tri)

    f = torch.compile(lambda x: torch.relu(x * 2 + 1))
    got = f(a)
    torch.cuda.synchronize()
    report("torch.compile (inductor)", torch.allclose(got, torch.relu(a * 2 + 1)), lambda: f(a))

    import cupy as cp

    raw = cp.RawKernel(
        r"""extern "C" __global__ void sq(const float* x, float* y, int n) {
        int i = blockDim.x * blockIdx.x + threadIdx.x; if (i < n) y[i] = x[i] * x[i]; }""",
        "sq",
    )
    cx = cp.arange(1 << 16, dtype=cp.float32)
    cy = cp.empty_like(cx)

    def cup() -> None:
        raw(((1 << 16) // 256,), (256,), (cx, cy, cp.int32(1 << 16)))

    cup()
    cp.cuda.Device().synchronize()
    report("CuPy RawKernel", bool(cp.allclose(cy, cx * cx)), cup)

    from torch.utils.cpp_extension import load_inline

    cuda_src = r"""
    __global__ void neg_kernel(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = -x[i]; }
    torch::Tensor neg(torch::Tensor x) {
        auto y = torch::empty_like(x); int n = x.numel();
        neg_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
        return y; }
    """
    mod = load_inline(
        name="krex_neg",
        cpp_sources="torch::Tensor neg(torch::Tensor x);",
        cuda_sources=cuda_src,
        functions=["neg"],
        build_directory=os.environ.get("KREX_TEST_BUILD_DIR") or None,
        extra_cuda_cflags=["-O2"],
        verbose=False,
    )
    report("cpp_extension.load_inline", torch.equal(mod.neg(a), -a), lambda: mod.neg(a))


if __name__ == "__main__":
    main()
