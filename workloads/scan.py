"""Prefix-sum (scan) benchmarking commands: torch.cumsum, Triton scans, CuPy.

python workloads/scan.py --task cumsum_rows_4096x8192_fp32 --candidate triton_chunk1024
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

TASKS = [
    Task(
        "cumsum_rows_4096x8192_fp32",
        "<0.1ms",
        ("torch", "triton_row", "triton_chunk1024", "triton_chunk2048", "cupy"),
        {"rows": 4096, "cols": 8192},
        rtol=1e-3,
        atol=2e-3,
        about="row-wise inclusive scan (e.g. cumulative attention weights)",
        smoke={"rows": 4, "cols": 3000},
    ),
    Task(
        "cumsum_1d_64M_int32",
        "0.1-1ms",
        ("torch", "triton_b2048", "triton_b8192", "cupy"),
        {"n": 64 * 1024 * 1024},
        rtol=0,
        atol=0,
        about="exclusive-offset style int32 scan of 64M counts",
        smoke={"n": 10_000},
    ),
]


def build(c: Case) -> Bench:
    import torch

    p = c.p
    name = c.candidate
    fn: Any
    if c.task.name.startswith("cumsum_rows"):
        x = torch.rand(p["rows"], p["cols"], device=c.device, dtype=torch.float32) - 0.5

        def reference() -> Any:
            return torch.cumsum(x.double(), dim=1).float()

        if name == "torch":

            def fn() -> Any:
                return torch.cumsum(x, dim=1)
        elif name.startswith("triton_"):
            from impl import pointwise

            chunk = 0 if name == "triton_row" else int(name.removeprefix("triton_chunk"))

            def fn() -> Any:
                return pointwise.row_cumsum(x, chunk, num_warps=8 if chunk != 1024 else 4)
        elif name == "cupy":
            c.need_cuda()
            import cupy

            xc = cupy.asarray(x)

            def fn() -> Any:
                return torch.as_tensor(cupy.cumsum(xc, axis=1), device=x.device)
        else:
            raise AssertionError(f"no builder for candidate {name}")
        return Bench(fn, reference)

    v = torch.randint(0, 8, (p["n"],), device=c.device, dtype=torch.int32)

    def ref_1d() -> Any:
        return torch.cumsum(v.to(torch.int64), 0)

    if name == "torch":

        def fn() -> Any:
            return torch.cumsum(v, 0, dtype=torch.int32)
    elif name.startswith("triton_b"):
        from impl import pointwise

        block = int(name.removeprefix("triton_b"))

        def fn() -> Any:
            return pointwise.cumsum_1d(v, block, num_warps=8 if block >= 8192 else 4)
    elif name == "cupy":
        c.need_cuda()
        import cupy

        vc = cupy.asarray(v)

        def fn() -> Any:
            return torch.as_tensor(cupy.cumsum(vc, dtype=cupy.int32), device=v.device)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, ref_1d)


if __name__ == "__main__":
    harness.run("scan", TASKS, build, frameworks=("torch", "triton", "cupy"))
