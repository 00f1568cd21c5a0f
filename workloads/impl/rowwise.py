# Triton reads kernel parameter annotations (tl.constexpr, pointer types), so @triton.jit
# kernels stay unannotated.
# mypy: disable-error-code="no-untyped-def, untyped-decorator"
"""Triton row kernels: softmax, layer norm, RMS norm, row sums (one program per row)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    tl.store(y_ptr + row * stride + offs, (num / den).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_online_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr):
    # Two passes over the row in BLOCK chunks: running max and sum, then normalize.
    row = tl.program_id(0).to(tl.int64)
    m = tl.full((BLOCK,), -float("inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + offs, mask=offs < n_cols, other=-float("inf")).to(
            tl.float32
        )
        m_new = tl.maximum(m, x)
        s = s * tl.exp(tl.where(m_new == -float("inf"), 0.0, m - m_new)) + tl.where(
            m_new == -float("inf"), 0.0, tl.exp(x - m_new)
        )
        m = m_new
    row_max = tl.max(m, axis=0)
    row_sum = tl.sum(s * tl.exp(tl.where(m == -float("inf"), -float("inf"), m - row_max)), axis=0)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - row_max) / row_sum
        tl.store(y_ptr + row * stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor, num_warps: int, online_block: int = 0) -> torch.Tensor:
    """Softmax over the last dim of a contiguous 2-D tensor.

    online_block: 0 keeps a whole row in registers; > 0 streams it in chunks.
    """
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    if online_block:
        _softmax_online_kernel[(n_rows,)](
            x, y, x.stride(0), n_cols, BLOCK=online_block, num_warps=num_warps
        )
    else:
        _softmax_kernel[(n_rows,)](
            x, y, x.stride(0), n_cols, BLOCK=triton.next_power_of_2(n_cols), num_warps=num_warps
        )
    return y


@triton.jit
def _layernorm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = xc * rstd * w + b
    tl.store(y_ptr + row * stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def layernorm(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, num_warps: int
) -> torch.Tensor:
    """LayerNorm over the last dim of a contiguous 2-D tensor (weight w, bias b)."""
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    _layernorm_kernel[(n_rows,)](
        x,
        y,
        w,
        b,
        x.stride(0),
        n_cols,
        eps,
        BLOCK=triton.next_power_of_2(n_cols),
        num_warps=num_warps,
    )
    return y


@triton.jit
def _rmsnorm_kernel(x_ptr, y_ptr, w_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, num_warps: int) -> torch.Tensor:
    """RMSNorm over the last dim of a contiguous 2-D tensor (weight w)."""
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    _rmsnorm_kernel[(n_rows,)](
        x, y, w, x.stride(0), n_cols, eps, BLOCK=triton.next_power_of_2(n_cols), num_warps=num_warps
    )
    return y


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * stride + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def row_sum(x: torch.Tensor, block: int, num_warps: int) -> torch.Tensor:
    """Sum over the last dim of a contiguous 2-D tensor, fp32 out."""
    n_rows, n_cols = x.shape
    out = torch.empty(n_rows, device=x.device, dtype=torch.float32)
    _row_sum_kernel[(n_rows,)](x, out, x.stride(0), n_cols, BLOCK=block, num_warps=num_warps)
    return out


@triton.jit
def _sumsq_partial_kernel(x_ptr, part_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    acc = tl.zeros((BLOCK,), tl.float32)
    base = pid * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(part_ptr + pid, tl.sum(acc, axis=0))


def l2norm(x: torch.Tensor, block: int, iters: int, num_warps: int) -> torch.Tensor:
    """Euclidean norm of a contiguous tensor: Triton partial sums, then torch sums them."""
    n = x.numel()
    parts = triton.cdiv(n, block * iters)
    part = torch.empty(parts, device=x.device, dtype=torch.float32)
    _sumsq_partial_kernel[(parts,)](x, part, n, BLOCK=block, ITERS=iters, num_warps=num_warps)
    return part.sum().sqrt()
