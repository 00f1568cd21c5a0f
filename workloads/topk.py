"""Top-k and sort benchmarking commands: torch.topk, sort-and-slice, two-stage top-k, CuPy sort.

python workloads/topk.py --task topk_b256_v128k_k50 --candidate two_stage_c8192
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

TASKS = [
    Task(
        "topk_b256_v128k_k50",
        "0.1-1ms",
        (
            "torch_topk",
            "torch_topk_unsorted",
            "two_stage_c8192",
            "two_stage_c16384",
            "torch_sort_slice",
        ),
        {"batch": 256, "vocab": 128256, "k": 50},
        rtol=0,
        atol=0,
        about="top-50 of sampling logits over a 128k vocabulary",
        smoke={"batch": 3, "vocab": 20000, "k": 5},
    ),
    Task(
        "sort_32M_fp32",
        "1-10ms",
        ("torch_sort", "torch_sort_stable", "torch_argsort_gather", "cupy_sort"),
        {"n": 32 * 1024 * 1024},
        rtol=0,
        atol=0,
        about="sorting 32M fp32 keys (radix sort)",
        smoke={"n": 5000},
    ),
]


def build(c: Case) -> Bench:
    import torch

    p = c.p
    name = c.candidate
    fn: Any
    if c.task.name.startswith("topk"):
        x = torch.randn(p["batch"], p["vocab"], device=c.device, dtype=torch.float32)
        k = p["k"]

        def reference() -> Any:
            return torch.sort(x, dim=-1, descending=True).values[:, :k]

        def values(out: Any) -> Any:  # candidates return (values, indices) in any order
            vals, idx = out
            return torch.sort(vals, dim=-1, descending=True).values, torch.gather(x, 1, idx)

        def check(out: Any, ref: Any) -> tuple[bool, float]:
            vals, gathered = values(out)
            ok1, e1 = harness.compare(vals, ref, 0, 0)
            ok2, e2 = harness.compare(
                torch.sort(gathered, dim=-1, descending=True).values, ref, 0, 0
            )
            return ok1 and ok2, max(e1, e2)

        if name == "torch_topk":

            def fn() -> Any:
                return torch.topk(x, k, dim=-1)
        elif name == "torch_topk_unsorted":

            def fn() -> Any:
                return torch.topk(x, k, dim=-1, sorted=False)
        elif name.startswith("two_stage_c"):  # top-k per chunk, then top-k of the winners
            chunk = int(name.removeprefix("two_stage_c"))
            chunk = min(chunk, p["vocab"])
            pad = (-p["vocab"]) % chunk
            xp = torch.nn.functional.pad(x, (0, pad), value=float("-inf"))
            n_chunks = xp.shape[1] // chunk
            kk = min(k, chunk)
            base = (torch.arange(n_chunks, device=c.device) * chunk).view(1, n_chunks, 1)

            def fn() -> Any:
                v1, i1 = torch.topk(xp.view(x.shape[0], n_chunks, chunk), kk, dim=-1)
                flat_v = v1.reshape(x.shape[0], -1)
                flat_i = (i1 + base).reshape(x.shape[0], -1)
                v2, j = torch.topk(flat_v, k, dim=-1)
                return v2, torch.gather(flat_i, 1, j)
        elif name == "torch_sort_slice":

            def fn() -> Any:
                v, i = torch.sort(x, dim=-1, descending=True)
                return v[:, :k], i[:, :k]
        else:
            raise AssertionError(f"no builder for candidate {name}")
        return Bench(fn, reference, check)

    keys = torch.randn(p["n"], device=c.device, dtype=torch.float32)

    def ref_sort() -> Any:
        return torch.from_numpy(keys.cpu().numpy().copy()).sort().values.to(keys.device)

    if name == "torch_sort":

        def fn() -> Any:
            return torch.sort(keys).values
    elif name == "torch_sort_stable":

        def fn() -> Any:
            return torch.sort(keys, stable=True).values
    elif name == "torch_argsort_gather":

        def fn() -> Any:
            return keys[torch.argsort(keys)]
    elif name == "cupy_sort":
        c.need_cuda()
        import cupy

        kc = cupy.asarray(keys)

        def fn() -> Any:
            return torch.as_tensor(cupy.sort(kc), device=keys.device)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, ref_sort)


if __name__ == "__main__":
    harness.run("topk", TASKS, build, frameworks=("torch", "cupy"))
