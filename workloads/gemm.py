"""GEMM benchmarking commands: cuBLAS through torch, Triton tiles, worse layouts and extra passes.

python workloads/gemm.py --task gemm_bf16_4096 --candidate triton_128x256x64
python workloads/gemm.py --list
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

SMALL = {"m": 64, "n": 64, "k": 64}
# Triton's CPU interpreter multiplies bf16 wrongly: smoke runs of bf16 tasks use fp16.
SMALL_BF16 = {**SMALL, "dtype": "float16"}

TASKS = [
    Task(
        "gemm_bf16_4096",
        "0.1-1ms",
        ("torch", "triton_128x256x64", "triton_128x128x64", "triton_64x128x32", "torch_plus_scale"),
        {"m": 4096, "n": 4096, "k": 4096, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=2e-2,
        about="square bf16 GEMM, the common agent target",
        smoke=SMALL_BF16,
    ),
    Task(
        "gemm_fp16_8192",
        "1-10ms",
        ("torch", "torch_bt", "triton_128x256x64", "triton_128x128x64"),
        {"m": 8192, "n": 8192, "k": 8192, "dtype": "float16"},
        rtol=2e-2,
        atol=2e-2,
        about="large fp16 GEMM; B given transposed in torch_bt",
        smoke=SMALL,
    ),
    Task(
        "gemm_bf16_16384",
        ">=10ms",
        ("torch", "torch_split_k", "triton_128x256x64", "triton_128x128x64"),
        {"m": 16384, "n": 16384, "k": 16384, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=2e-2,
        warmup_ms=50,
        rep_ms=200,
        about="very large bf16 GEMM (>= 10 ms)",
        smoke=SMALL_BF16,
    ),
    Task(
        "gemm_fp32_8192",
        ">=10ms",
        ("torch", "torch_split_k", "torch_split_n", "triton_ieee_128x128x32"),
        {"m": 8192, "n": 8192, "k": 8192, "dtype": "float32"},
        rtol=1e-4,
        atol=1e-4,
        warmup_ms=50,
        rep_ms=300,
        about="fp32 GEMM without TF32 (~20 ms)",
        smoke=SMALL,
    ),
    Task(
        "gemm_bf16_decode",
        "<0.1ms",
        ("torch_linear", "torch_mm", "triton_16x64x128", "triton_16x32x256"),
        {"m": 16, "n": 8192, "k": 8192, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=2e-2,
        about="skinny decode GEMM: 16 tokens through an 8192x8192 weight",
        smoke={"m": 16, "n": 128, "k": 128, "dtype": "float16"},
    ),
]

# Triton tiles: candidate -> ((BLOCK_M, BLOCK_N, BLOCK_K), num_warps, num_stages, ieee).
TRITON: dict[str, tuple[tuple[int, int, int], int, int, bool]] = {
    "triton_128x256x64": ((128, 256, 64), 8, 3, False),
    "triton_128x128x64": ((128, 128, 64), 4, 4, False),
    "triton_64x128x32": ((64, 128, 32), 4, 4, False),
    "triton_ieee_128x128x32": ((128, 128, 32), 8, 3, True),
    "triton_16x64x128": ((16, 64, 128), 4, 4, False),
    "triton_16x32x256": ((16, 32, 256), 4, 3, False),
}


def build(c: Case) -> Bench:
    """Inputs scaled so every output element is ~N(0, 1); reference in fp32/fp64."""
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    p = c.p
    dt = getattr(torch, p["dtype"])
    m, n, k = p["m"], p["n"], p["k"]
    scale = k**-0.25
    a = (torch.randn(m, k, device=c.device, dtype=torch.float32) * scale).to(dt)
    b = (torch.randn(k, n, device=c.device, dtype=torch.float32) * scale).to(dt)
    ref_dt = torch.float64 if dt == torch.float32 else torch.float32

    def reference() -> Any:
        return (a.to(ref_dt) @ b.to(ref_dt)).to(torch.float32)

    name = c.candidate
    fn: Any
    if name in ("torch", "torch_mm"):

        def fn() -> Any:
            return torch.mm(a, b)
    elif name == "torch_plus_scale":  # an extra elementwise pass over C

        def fn() -> Any:
            return torch.mm(a, b).mul_(1.0)
    elif name == "torch_bt":  # B kept as [N, K]: cuBLAS reads it transposed
        bt = b.t().contiguous()

        def fn() -> Any:
            return torch.mm(a, bt.t())
    elif name == "torch_linear":  # weight [N, K] as nn.Linear keeps it
        w = b.t().contiguous()

        def fn() -> Any:
            return F.linear(a, w)
    elif name == "torch_split_k":  # two half-K GEMMs, the second accumulating
        h = k // 2

        def fn() -> Any:
            return torch.addmm(torch.mm(a[:, :h], b[:h]), a[:, h:], b[h:])
    elif name == "torch_split_n":  # two half-N GEMMs and a concatenation
        h = n // 2

        def fn() -> Any:
            return torch.cat([torch.mm(a, b[:, :h]), torch.mm(a, b[:, h:])], dim=1)
    elif name in TRITON:
        from impl import gemm as kern

        block, warps, stages, ieee = TRITON[name]

        def fn() -> Any:
            return kern.matmul(a, b, block, num_warps=warps, num_stages=stages, ieee=ieee)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, reference)


if __name__ == "__main__":
    harness.run("gemm", TASKS, build, frameworks=("torch", "triton"))
