# Triton reads kernel parameter annotations (tl.constexpr, pointer types), so @triton.jit
# kernels stay unannotated.
# mypy: disable-error-code="no-untyped-def, untyped-decorator"
"""Triton causal depthwise 1-D convolution (the short conv of Mamba-style blocks)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _causal_dwconv1d_kernel(
    x_ptr, w_ptr, y_ptr, n_ch, length, WIDTH: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)  # (batch, channel) pair
    ch = row % n_ch
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for j in tl.static_range(WIDTH):
        src = offs - (WIDTH - 1) + j
        x = tl.load(x_ptr + row * length + src, mask=(src >= 0) & (src < length), other=0.0)
        acc += x.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + j).to(tl.float32)
    tl.store(y_ptr + row * length + offs, acc.to(y_ptr.dtype.element_ty), mask=offs < length)


def causal_dwconv1d(x: torch.Tensor, w: torch.Tensor, block: int, num_warps: int) -> torch.Tensor:
    """y[b, c, t] = sum_j w[c, j] x[b, c, t - (W-1) + j] for contiguous x [B, C, L], w [C, W]."""
    bsz, ch, length = x.shape
    y = torch.empty_like(x)
    grid = (bsz * ch, triton.cdiv(length, block))
    _causal_dwconv1d_kernel[grid](
        x, w, y, ch, length, WIDTH=w.shape[1], BLOCK=block, num_warps=num_warps
    )
    return y
