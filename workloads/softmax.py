"""Softmax benchmarking commands: torch, Triton row kernels (warps, streaming), naive passes.

python workloads/softmax.py --task softmax_4096x4096_fp32 --candidate triton_w8
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

CANDIDATES = (
    "torch",
    "triton_w4",
    "triton_w8",
    "triton_online_b1024",
    "torch_naive",
    "torch_compile",
)

TASKS = [
    Task(
        "softmax_4096x4096_fp32",
        "<0.1ms",
        CANDIDATES,
        {"rows": 4096, "cols": 4096, "dtype": "float32"},
        rtol=1e-4,
        atol=1e-6,
        about="attention-score softmax, fp32",
        smoke={"rows": 8, "cols": 300},
    ),
    Task(
        "softmax_32768x8192_bf16",
        "0.1-1ms",
        ("torch", "triton_w8", "triton_w16", "torch_upcast"),
        {"rows": 32768, "cols": 8192, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=1e-3,
        about="large bf16 softmax over 8192 columns",
        smoke={"rows": 8, "cols": 1000},
    ),
]


def build(c: Case) -> Bench:
    import torch

    p = c.p
    dt = getattr(torch, p["dtype"])
    x = (torch.randn(p["rows"], p["cols"], device=c.device, dtype=torch.float32) * 3).to(dt)

    def reference() -> Any:
        return torch.softmax(x.float(), dim=-1)

    name = c.candidate
    fn: Any
    if name == "torch":

        def fn() -> Any:
            return torch.softmax(x, dim=-1)
    elif name in ("torch_naive", "torch_compile"):  # max, subtract, exp, sum, divide: five passes

        def naive() -> Any:
            e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
            return e / e.sum(dim=-1, keepdim=True)

        fn = naive if name == "torch_naive" else torch.compile(naive, dynamic=False)
    elif name == "torch_upcast":  # compute in fp32, cast back: two extra passes

        def fn() -> Any:
            return torch.softmax(x.float(), dim=-1).to(dt)
    elif name.startswith("triton_"):
        from impl import rowwise

        if name.startswith("triton_online_b"):
            block = int(name.removeprefix("triton_online_b"))

            def fn() -> Any:
                return rowwise.softmax(x, num_warps=4, online_block=block)
        else:
            warps = int(name.removeprefix("triton_w"))

            def fn() -> Any:
                return rowwise.softmax(x, num_warps=warps)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, reference)


if __name__ == "__main__":
    harness.run("softmax", TASKS, build, frameworks=("torch", "triton"))
