"""MoE token-alignment benchmarking commands (moe_align_block_size): torch, Triton, CUDA.

The paper's motivating trajectory (§2.2) ranked candidates of this kernel a
few percent apart.  The CUDA kernel is built two ways, as agents do: through
torch.utils.cpp_extension.load_inline (1024 threads) and as a CuPy RawKernel
(256 threads).

    python workloads/moe_align.py --task moe_align_t4096_e64_k8_b64 --candidate triton_3kernel
"""

from __future__ import annotations

import hashlib
from typing import Any

import harness
from harness import Bench, Case, Task

CANDIDATES = (
    "torch_argsort",
    "torch_onehot",
    "triton_3kernel",
    "cuda_inline_t1024",
    "cupy_raw_t256",
)

TASKS = [
    Task(
        "moe_align_t4096_e64_k8_b64",
        "<0.1ms",
        CANDIDATES,
        {"tokens": 4096, "experts": 64, "topk": 8, "block": 64},
        about="prefill routing: 4096 tokens, top-8 of 64 experts, 64-row GEMM blocks",
        smoke={"tokens": 50, "experts": 8, "topk": 2, "block": 4},
    ),
    Task(
        "moe_align_t256_e256_k8_b16",
        "<0.1ms",
        CANDIDATES,
        {"tokens": 256, "experts": 256, "topk": 8, "block": 16},
        about="decode routing: 256 tokens, top-8 of 256 experts, 16-row blocks",
        smoke={"tokens": 20, "experts": 16, "topk": 4, "block": 4},
    ),
]


def sizes(numel: int, experts: int, block: int) -> tuple[int, int]:
    """(length of sorted_ids, length of expert_ids) for the worst-case padding."""
    max_ids = numel + experts * (block - 1)
    return max_ids, -(-max_ids // block)


def torch_align(
    topk_ids: Any, experts: int, block: int, onehot: bool = False, bincount: bool = False
) -> tuple[Any, Any, Any]:
    """Sort-free-of-syncs torch version (bincount=True: bincount, which syncs the host)."""
    import torch
    import torch.nn.functional as F

    flat = topk_ids.reshape(-1).to(torch.int64)
    numel = flat.numel()
    dev = flat.device
    max_ids, max_blocks = sizes(numel, experts, block)
    if onehot:  # rank of each copy within its expert from a running one-hot count
        oh = F.one_hot(flat, experts)
        csum = oh.cumsum(0)
        counts = csum[-1]
        rank_orig = csum.gather(1, flat[:, None]).squeeze(1) - 1
    elif bincount:
        counts = torch.bincount(flat, minlength=experts)
    else:
        counts = torch.zeros(experts, device=dev, dtype=torch.int64).scatter_add_(
            0, flat, torch.ones_like(flat)
        )
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    sorted_ids = torch.full((max_ids,), numel, device=dev, dtype=torch.int32)
    if onehot:
        sorted_ids[starts[flat] + rank_orig] = torch.arange(numel, device=dev, dtype=torch.int32)
    else:
        order = torch.argsort(flat, stable=True)
        sorted_e = flat[order]
        rank = torch.arange(numel, device=dev) - (torch.cumsum(counts, 0) - counts)[sorted_e]
        sorted_ids[starts[sorted_e] + rank] = order.to(torch.int32)
    blk_pos = torch.arange(max_blocks, device=dev) * block
    total = ends[-1:]
    owner = torch.searchsorted(ends, blk_pos, right=True)
    expert_ids = torch.where(blk_pos < total, owner, -1).to(torch.int32)
    return sorted_ids, expert_ids, total.to(torch.int32)


def build(c: Case) -> Bench:
    import torch

    p = c.p
    experts, block = p["experts"], p["block"]
    # Routing with a skew, as real routers have: some experts get far more tokens.
    weights = torch.rand(experts, device=c.device) ** 3 + 0.01
    topk_ids = (
        torch.multinomial(weights.expand(p["tokens"], experts), p["topk"], replacement=False)
        .to(torch.int32)
        .contiguous()
    )
    numel = topk_ids.numel()
    max_ids, max_blocks = sizes(numel, experts, block)

    def reference() -> Any:
        return torch_align(topk_ids, experts, block, bincount=True)

    def canonical(out: Any) -> tuple[int, Any, Any]:
        sorted_ids, expert_ids, total = out
        t = int(total.reshape(-1)[0].item())
        nb = t // block
        seg_expert = expert_ids[:nb].to(torch.int64).repeat_interleave(block)
        keys = seg_expert * (numel + 1) + sorted_ids[:t].to(torch.int64)
        return t, expert_ids[:nb].to(torch.int64), torch.sort(keys).values

    def check(out: Any, ref: Any) -> tuple[bool, float]:
        if out[0].numel() != max_ids or out[1].numel() != max_blocks:
            return False, float("inf")
        t, e, k = canonical(out)
        rt, re_, rk = canonical(ref)
        if t != rt:
            return False, float(abs(t - rt))
        ok_e, err_e = harness.compare(e, re_, 0, 0)
        ok_k, err_k = harness.compare(k, rk, 0, 0)
        return ok_e and ok_k, max(err_e, err_k)

    name = c.candidate
    fn: Any
    if name == "torch_argsort":

        def fn() -> Any:
            return torch_align(topk_ids, experts, block)
    elif name == "torch_onehot":

        def fn() -> Any:
            return torch_align(topk_ids, experts, block, onehot=True)
    elif name == "triton_3kernel":
        from impl import moe

        def fn() -> Any:
            return moe.moe_align_triton(topk_ids, experts, block)
    elif name == "cuda_inline_t1024":
        c.need_cuda()
        from impl import moe
        from torch.utils.cpp_extension import load_inline

        tag = hashlib.sha1((moe.MOE_ALIGN_EXT_CPP + moe.MOE_ALIGN_EXT_CUDA).encode()).hexdigest()
        ext = load_inline(
            name=f"krex_moe_align_{tag[:12]}",
            cpp_sources=moe.MOE_ALIGN_EXT_CPP,
            cuda_sources=moe.MOE_ALIGN_EXT_CUDA,
            functions=["moe_align"],
            extra_cuda_cflags=["-O3"],
            verbose=False,
        )

        def fn() -> Any:
            return tuple(ext.moe_align(topk_ids, experts, block, 1024))
    elif name == "cupy_raw_t256":
        c.need_cuda()
        import cupy
        from impl import moe

        kernel = cupy.RawKernel(moe.MOE_ALIGN_CUDA, "moe_align_block")
        sorted_ids = torch.empty(max_ids, device=c.device, dtype=torch.int32)
        expert_ids = torch.empty(max_blocks, device=c.device, dtype=torch.int32)
        total = torch.empty(1, device=c.device, dtype=torch.int32)
        args = tuple(cupy.asarray(t) for t in (topk_ids.reshape(-1), sorted_ids, expert_ids, total))
        ints = tuple(cupy.int32(v) for v in (numel, experts, block, max_ids, max_blocks))
        smem = (2 * experts + 1) * 4

        def fn() -> Any:
            kernel((1,), (256,), args + ints, shared_mem=smem)
            return sorted_ids, expert_ids, total
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, reference, check)


if __name__ == "__main__":
    harness.run("moe_align", TASKS, build, frameworks=("torch", "triton", "cupy"))
