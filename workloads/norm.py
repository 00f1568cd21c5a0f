"""Normalization benchmarking commands: LayerNorm and RMSNorm (torch, compiled, Triton, naive).

python workloads/norm.py --task rmsnorm_32768x4096_bf16 --candidate triton_w8
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

EPS = 1e-5

TASKS = [
    Task(
        "layernorm_8192x8192_bf16",
        "<0.1ms",
        ("torch", "triton_w8", "triton_w16", "torch_naive", "torch_compile"),
        {"rows": 8192, "cols": 8192, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=2e-2,
        about="LayerNorm with weight and bias",
        smoke={"rows": 8, "cols": 200},
    ),
    Task(
        "rmsnorm_32768x4096_bf16",
        "0.1-1ms",
        ("torch", "torch_naive", "torch_compile", "triton_w4", "triton_w8"),
        {"rows": 32768, "cols": 4096, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=2e-2,
        about="RMSNorm of a long-context batch of hidden states",
        smoke={"rows": 8, "cols": 256},
    ),
]


def build(c: Case) -> Bench:
    import torch
    import torch.nn.functional as F

    p = c.p
    dt = getattr(torch, p["dtype"])
    rows, cols = p["rows"], p["cols"]
    x = (torch.randn(rows, cols, device=c.device, dtype=torch.float32) * 2 + 0.5).to(dt)
    w = (torch.rand(cols, device=c.device, dtype=torch.float32) + 0.5).to(dt)
    b = (torch.randn(cols, device=c.device, dtype=torch.float32) * 0.1).to(dt)
    layer = c.task.name.startswith("layernorm")

    def reference() -> Any:
        xf = x.float()
        if layer:
            return F.layer_norm(xf, (cols,), w.float(), b.float(), EPS)
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()

    def naive() -> Any:  # what an agent writes first: fp32 upcast, several passes
        xf = x.float()
        if layer:
            mean = xf.mean(-1, keepdim=True)
            var = ((xf - mean) ** 2).mean(-1, keepdim=True)
            return ((xf - mean) / torch.sqrt(var + EPS) * w.float() + b.float()).to(dt)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(dt)

    name = c.candidate
    fn: Any
    if name == "torch":

        def fn() -> Any:
            if layer:
                return F.layer_norm(x, (cols,), w, b, EPS)
            return F.rms_norm(x, (cols,), w, EPS)
    elif name == "torch_naive":
        fn = naive
    elif name == "torch_compile":
        fn = torch.compile(naive, dynamic=False)
    elif name.startswith("triton_w"):
        from impl import rowwise

        warps = int(name.removeprefix("triton_w"))

        def fn() -> Any:
            if layer:
                return rowwise.layernorm(x, w, b, EPS, warps)
            return rowwise.rmsnorm(x, w, EPS, warps)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, reference)


if __name__ == "__main__":
    harness.run("norm", TASKS, build, frameworks=("torch", "triton"))
