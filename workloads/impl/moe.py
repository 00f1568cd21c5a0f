# Triton reads kernel parameter annotations (tl.constexpr, pointer types), so @triton.jit
# kernels stay unannotated.
# mypy: disable-error-code="no-untyped-def, untyped-decorator"
"""MoE token alignment (``moe_align_block_size`` of vLLM/SGLang): Triton and CUDA versions.

Given topk_ids [tokens, k] (expert of each routed copy), block size B and E
experts: counts per expert padded up to a multiple of B, their exclusive
prefix sum gives each expert's segment; sorted_ids[segment of e] lists the
flat indices routed to e (order within a segment is free), padded with
``numel``; expert_ids[block] is the expert owning each B-block (-1 past the
end); total = padded length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# One thread block: shared-memory counts, serial prefix sum, atomic scatter.
MOE_ALIGN_CUDA = r"""
extern "C" __global__ void moe_align_block(const int* __restrict__ topk_ids,
                                           int* __restrict__ sorted_ids,
                                           int* __restrict__ expert_ids,
                                           int* __restrict__ total,
                                           int numel, int num_experts, int block_size,
                                           int max_ids, int max_blocks) {
    extern __shared__ int smem[];
    int* counts = smem;                     /* num_experts: counts, then cursors */
    int* offsets = smem + num_experts;      /* num_experts + 1 */
    for (int i = threadIdx.x; i < num_experts; i += blockDim.x) counts[i] = 0;
    for (int i = threadIdx.x; i < max_ids; i += blockDim.x) sorted_ids[i] = numel;
    for (int i = threadIdx.x; i < max_blocks; i += blockDim.x) expert_ids[i] = -1;
    __syncthreads();
    for (int i = threadIdx.x; i < numel; i += blockDim.x) atomicAdd(&counts[topk_ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        offsets[0] = 0;
        for (int e = 0; e < num_experts; ++e)
            offsets[e + 1] = offsets[e] + (counts[e] + block_size - 1) / block_size * block_size;
        *total = offsets[num_experts];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
        for (int b = offsets[e]; b < offsets[e + 1]; b += block_size)
            expert_ids[b / block_size] = e;
        counts[e] = offsets[e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < numel; i += blockDim.x) {
        int pos = atomicAdd(&counts[topk_ids[i]], 1);
        sorted_ids[pos] = i;
    }
}
"""

# The same kernel behind a torch extension entry point (torch.utils.cpp_extension.load_inline).
MOE_ALIGN_EXT_CPP = (
    "std::vector<torch::Tensor> moe_align(torch::Tensor topk_ids, int64_t num_experts,"
    " int64_t block_size, int64_t threads);"
)
MOE_ALIGN_EXT_CUDA = (
    r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <vector>
"""
    + MOE_ALIGN_CUDA
    + r"""
std::vector<torch::Tensor> moe_align(torch::Tensor topk_ids, int64_t num_experts,
                                     int64_t block_size, int64_t threads) {
    TORCH_CHECK(topk_ids.is_cuda() && topk_ids.scalar_type() == torch::kInt32
                && topk_ids.is_contiguous(), "topk_ids must be contiguous int32 on CUDA");
    int numel = (int)topk_ids.numel();
    int max_ids = numel + (int)(num_experts * (block_size - 1));
    int max_blocks = (max_ids + (int)block_size - 1) / (int)block_size;
    auto opts = topk_ids.options();
    auto sorted_ids = torch::empty({max_ids}, opts);
    auto expert_ids = torch::empty({max_blocks}, opts);
    auto total = torch::empty({1}, opts);
    size_t smem = (size_t)(2 * num_experts + 1) * sizeof(int);
    moe_align_block<<<1, (unsigned)threads, smem, at::cuda::getCurrentCUDAStream()>>>(
        topk_ids.data_ptr<int>(), sorted_ids.data_ptr<int>(), expert_ids.data_ptr<int>(),
        total.data_ptr<int>(), numel, (int)num_experts, (int)block_size, max_ids, max_blocks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {sorted_ids, expert_ids, total};
}
"""
)


def sizes(numel: int, num_experts: int, block: int) -> tuple[int, int]:
    """(length of sorted_ids, length of expert_ids) for the worst-case padding."""
    max_ids = numel + num_experts * (block - 1)
    return max_ids, triton.cdiv(max_ids, block)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    tl.atomic_add(counts_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=mask)


@triton.jit
def _offsets_kernel(
    counts_ptr,
    cursor_ptr,
    expert_ids_ptr,
    total_ptr,
    num_experts,
    max_blocks,
    block_size,
    E_P2: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    e = tl.arange(0, E_P2)
    emask = e < num_experts
    counts = tl.load(counts_ptr + e, mask=emask, other=0)
    padded = (counts + block_size - 1) // block_size * block_size
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(cursor_ptr + e, starts, mask=emask)
    tl.store(total_ptr, total)
    for b0 in range(0, max_blocks, BLOCKS):
        blk = b0 + tl.arange(0, BLOCKS)
        pos = blk * block_size
        # The owner of position pos is the number of experts whose segment ends at or before it.
        owner = tl.sum(((ends[None, :] <= pos[:, None]) & emask[None, :]).to(tl.int32), axis=1)
        owner = tl.where(pos < total, owner, -1)
        tl.store(expert_ids_ptr + blk, owner, mask=blk < max_blocks)


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    pos = tl.atomic_add(cursor_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=mask)
    tl.store(sorted_ptr + pos, offs, mask=mask)


def moe_align_triton(
    topk_ids: torch.Tensor, num_experts: int, block: int, tile: int = 1024
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_ids, expert_ids, total) with three Triton kernels: count, offsets, scatter."""
    ids = topk_ids.reshape(-1)
    numel = ids.numel()
    max_ids, max_blocks = sizes(numel, num_experts, block)
    dev = ids.device
    counts = torch.zeros(num_experts, device=dev, dtype=torch.int32)
    cursor = torch.empty(num_experts, device=dev, dtype=torch.int32)
    sorted_ids = torch.full((max_ids,), numel, device=dev, dtype=torch.int32)
    expert_ids = torch.empty(max_blocks, device=dev, dtype=torch.int32)
    total = torch.empty(1, device=dev, dtype=torch.int32)
    grid = (triton.cdiv(numel, tile),)
    _count_kernel[grid](ids, counts, numel, BLOCK=tile)
    _offsets_kernel[(1,)](
        counts,
        cursor,
        expert_ids,
        total,
        num_experts,
        max_blocks,
        block,
        E_P2=triton.next_power_of_2(num_experts),
        BLOCKS=128,
    )
    _scatter_kernel[grid](ids, cursor, sorted_ids, numel, BLOCK=tile)
    return sorted_ids, expert_ids, total
