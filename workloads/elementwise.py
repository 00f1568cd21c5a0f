"""Elementwise-fusion benchmarking commands: eager chains vs torch.compile, Triton, CuPy.

python workloads/elementwise.py --task swiglu_8192x8192_bf16 --candidate triton_b2048
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

# gelu_tanh(x + bias) + res over bf16 stored as uint16 (no header needed under NVRTC).
BIAS_GELU_CUDA = r"""
__device__ __forceinline__ float bf2f(unsigned short v) {
    return __uint_as_float(((unsigned int)v) << 16);
}
__device__ __forceinline__ unsigned short f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    u += 0x7FFFu + ((u >> 16) & 1u);  /* round to nearest even */
    return (unsigned short)(u >> 16);
}
extern "C" __global__ void bias_gelu_residual(const unsigned short* __restrict__ x,
                                              const unsigned short* __restrict__ bias,
                                              const unsigned short* __restrict__ res,
                                              unsigned short* __restrict__ y,
                                              long long n, long long n_cols) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        float u = bf2f(x[i]) + bf2f(bias[i % n_cols]);
        float g = 0.5f * u * (1.0f + tanhf(0.7978845608028654f * (u + 0.044715f * u * u * u)));
        y[i] = f2bf(g + bf2f(res[i]));
    }
}
"""

TASKS = [
    Task(
        "bias_gelu_residual_1024x4096_bf16",
        "<0.1ms",
        ("torch_eager", "torch_compile", "triton_b1024", "triton_b4096", "cupy_grid_stride"),
        {"rows": 1024, "cols": 4096},
        rtol=2e-2,
        atol=3e-2,
        about="MLP epilogue after a GEMM: bias, GELU(tanh), residual (8 MiB tensors)",
        smoke={"rows": 4, "cols": 300},
    ),
    Task(
        "swiglu_8192x8192_bf16",
        "0.1-1ms",
        ("torch_eager", "torch_compile", "triton_b1024", "triton_b2048"),
        {"rows": 8192, "cols": 8192},
        rtol=2e-2,
        atol=2e-2,
        about="SwiGLU gate silu(a) * b over 128 MiB operands",
        smoke={"rows": 4, "cols": 300},
    ),
]


def build(c: Case) -> Bench:
    import torch
    import torch.nn.functional as F

    p = c.p
    bf = torch.bfloat16
    rows, cols = p["rows"], p["cols"]
    name = c.candidate
    fn: Any
    if c.task.name.startswith("bias_gelu"):
        x = torch.randn(rows, cols, device=c.device, dtype=bf)
        bias = torch.randn(cols, device=c.device, dtype=bf)
        res = torch.randn(rows, cols, device=c.device, dtype=bf)

        def reference() -> Any:
            return F.gelu(x.float() + bias.float(), approximate="tanh") + res.float()

        def eager() -> Any:  # three kernels: add, gelu, add
            return F.gelu(x + bias, approximate="tanh") + res

        if name == "torch_eager":
            fn = eager
        elif name == "torch_compile":
            fn = torch.compile(eager, dynamic=False)
        elif name.startswith("triton_b"):
            from impl import pointwise

            block = int(name.removeprefix("triton_b"))

            def fn() -> Any:
                return pointwise.bias_gelu_residual(
                    x, bias, res, block, num_warps=8 if block >= 4096 else 4
                )
        elif name == "cupy_grid_stride":
            c.need_cuda()
            import cupy

            kernel = cupy.RawKernel(BIAS_GELU_CUDA, "bias_gelu_residual")
            y = torch.empty_like(x)
            xs, bs, rs, ys = (cupy.asarray(t.view(torch.int16)) for t in (x, bias, res, y))
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count

            def fn() -> Any:
                kernel(
                    (sms * 4,), (256,), (xs, bs, rs, ys, cupy.int64(x.numel()), cupy.int64(cols))
                )
                return y
        else:
            raise AssertionError(f"no builder for candidate {name}")
        return Bench(fn, reference)

    a = torch.randn(rows, cols, device=c.device, dtype=bf)
    b = torch.randn(rows, cols, device=c.device, dtype=bf)

    def ref_swiglu() -> Any:
        return F.silu(a.float()) * b.float()

    def swiglu_eager() -> Any:  # two kernels: silu, multiply
        return F.silu(a) * b

    if name == "torch_eager":
        fn = swiglu_eager
    elif name == "torch_compile":
        fn = torch.compile(swiglu_eager, dynamic=False)
    elif name.startswith("triton_b"):
        from impl import pointwise

        block = int(name.removeprefix("triton_b"))

        def fn() -> Any:
            return pointwise.swiglu(a, b, block, num_warps=8 if block >= 2048 else 4)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, ref_swiglu)


if __name__ == "__main__":
    harness.run("elementwise", TASKS, build, frameworks=("torch", "triton", "cupy"))
