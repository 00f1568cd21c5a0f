"""Reduction benchmarking commands: row sums and a global L2 norm (torch, Triton, CuPy).

python workloads/reduce.py --task rowsum_8192x16384_fp32 --candidate cupy_block256
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

# One block per row, shared-memory tree reduction (CuPy RawKernel, NVRTC-compiled).
ROW_SUM_CUDA = r"""
extern "C" __global__ void row_sum(const float* __restrict__ x, float* __restrict__ out,
                                   long long n_cols) {
    extern __shared__ float buf[];
    const float* row = x + (long long)blockIdx.x * n_cols;
    float acc = 0.0f;
    for (long long i = threadIdx.x; i < n_cols; i += blockDim.x) acc += row[i];
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}
"""

TASKS = [
    Task(
        "rowsum_8192x16384_fp32",
        "0.1-1ms",
        ("torch", "triton_b1024", "triton_b4096", "cupy_block256", "torch_matmul_ones"),
        {"rows": 8192, "cols": 16384},
        rtol=1e-4,
        atol=1e-2,
        about="sum over the last dim of a 512 MiB fp32 matrix",
        smoke={"rows": 8, "cols": 3000},
    ),
    Task(
        "l2norm_256M_fp32",
        "0.1-1ms",
        ("torch", "torch_sqrt_sum_sq", "triton_b2048_i8", "triton_b1024_i4"),
        {"n": 256 * 1024 * 1024},
        rtol=1e-4,
        atol=1e-3,
        about="global Euclidean norm of 1 GiB of fp32",
        smoke={"n": 100_000},
    ),
]


def build(c: Case) -> Bench:
    import torch

    p = c.p
    name = c.candidate
    fn: Any
    if c.task.name.startswith("rowsum"):
        x = torch.randn(p["rows"], p["cols"], device=c.device, dtype=torch.float32)

        def reference() -> Any:
            return x.double().sum(-1).float()

        if name == "torch":

            def fn() -> Any:
                return x.sum(-1)
        elif name == "torch_matmul_ones":  # a GEMV against a ones vector
            ones = torch.ones(p["cols"], device=c.device, dtype=torch.float32)

            def fn() -> Any:
                return torch.mv(x, ones)
        elif name.startswith("triton_b"):
            from impl import rowwise

            block = int(name.removeprefix("triton_b"))

            def fn() -> Any:
                return rowwise.row_sum(x, block, num_warps=8 if block >= 4096 else 4)
        elif name == "cupy_block256":
            c.need_cuda()
            import cupy

            kernel = cupy.RawKernel(ROW_SUM_CUDA, "row_sum")
            xc = cupy.asarray(x)
            out = torch.empty(p["rows"], device=c.device, dtype=torch.float32)
            oc = cupy.asarray(out)

            def fn() -> Any:
                kernel((p["rows"],), (256,), (xc, oc, cupy.int64(p["cols"])), shared_mem=256 * 4)
                return out
        else:
            raise AssertionError(f"no builder for candidate {name}")
        return Bench(fn, reference)

    v = torch.randn(p["n"], device=c.device, dtype=torch.float32)

    def ref_norm() -> Any:
        return v.double().norm().float().reshape(1)

    if name == "torch":

        def fn() -> Any:
            return torch.linalg.vector_norm(v).reshape(1)
    elif name == "torch_sqrt_sum_sq":  # materializes v*v: an extra write and read

        def fn() -> Any:
            return (v * v).sum().sqrt().reshape(1)
    elif name.startswith("triton_b"):
        from impl import rowwise

        block_s, iters_s = name.removeprefix("triton_b").split("_i")
        block, iters = int(block_s), int(iters_s)

        def fn() -> Any:
            return rowwise.l2norm(v, block, iters, num_warps=8 if block >= 2048 else 4).reshape(1)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, ref_norm)


if __name__ == "__main__":
    harness.run("reduce", TASKS, build, frameworks=("torch", "triton", "cupy"))
