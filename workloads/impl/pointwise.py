# Triton reads kernel parameter annotations (tl.constexpr, pointer types), so @triton.jit
# kernels stay unannotated.
# mypy: disable-error-code="no-untyped-def, untyped-decorator"
"""Triton elementwise, gather and scan kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tanh(u):
    return 2.0 / (1.0 + tl.exp(-2.0 * u)) - 1.0


@triton.jit
def _bias_gelu_residual_kernel(x_ptr, bias_ptr, res_ptr, y_ptr, n, n_cols, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + offs % n_cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = x + bias
    g = 0.5 * u * (1.0 + _tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)))
    tl.store(y_ptr + offs, (g + r).to(y_ptr.dtype.element_ty), mask=mask)


def bias_gelu_residual(
    x: torch.Tensor, bias: torch.Tensor, res: torch.Tensor, block: int, num_warps: int
) -> torch.Tensor:
    """gelu_tanh(x + bias) + res for contiguous x, res [rows, cols] and bias [cols]."""
    y = torch.empty_like(x)
    n = x.numel()
    _bias_gelu_residual_kernel[(triton.cdiv(n, block),)](
        x, bias, res, y, n, x.shape[-1], BLOCK=block, num_warps=num_warps
    )
    return y


@triton.jit
def _swiglu_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def swiglu(a: torch.Tensor, b: torch.Tensor, block: int, num_warps: int) -> torch.Tensor:
    """silu(a) * b for contiguous a, b of one shape."""
    y = torch.empty_like(a)
    n = a.numel()
    _swiglu_kernel[(triton.cdiv(n, block),)](a, b, y, n, BLOCK=block, num_warps=num_warps)
    return y


@triton.jit
def _gather_rows_kernel(idx_ptr, w_ptr, out_ptr, dim, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < dim
    row = tl.load(idx_ptr + t).to(tl.int64)
    v = tl.load(w_ptr + row * dim + offs, mask=mask)
    tl.store(out_ptr + t * dim + offs, v, mask=mask)


def gather_rows(
    weight: torch.Tensor, idx: torch.Tensor, block: int, num_warps: int
) -> torch.Tensor:
    """weight[idx] for a contiguous [V, D] weight and 1-D indices."""
    n, dim = idx.numel(), weight.shape[1]
    out = torch.empty((n, dim), device=weight.device, dtype=weight.dtype)
    _gather_rows_kernel[(n, triton.cdiv(dim, block))](
        idx, weight, out, dim, BLOCK=block, num_warps=num_warps
    )
    return out


@triton.jit
def _row_cumsum_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr):
    # The whole row in one tile: one scan.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride + offs, tl.cumsum(x, axis=0), mask=mask)


@triton.jit
def _row_cumsum_chunked_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr):
    # BLOCK-wide chunks carrying the running total.
    row = tl.program_id(0).to(tl.int64)
    carry = tl.sum(tl.zeros((BLOCK,), tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride + offs, tl.cumsum(x, axis=0) + carry, mask=mask)
        carry += tl.sum(x, axis=0)


def row_cumsum(x: torch.Tensor, chunk: int, num_warps: int) -> torch.Tensor:
    """Inclusive prefix sum along the last dim of a contiguous fp32 [rows, cols] tensor.

    chunk: 0 scans each row as one tile; > 0 scans it in chunks of that width.
    """
    rows, cols = x.shape
    y = torch.empty_like(x)
    if chunk:
        _row_cumsum_chunked_kernel[(rows,)](
            x, y, x.stride(0), cols, BLOCK=chunk, num_warps=num_warps
        )
    else:
        _row_cumsum_kernel[(rows,)](
            x, y, x.stride(0), cols, BLOCK=triton.next_power_of_2(cols), num_warps=num_warps
        )
    return y


@triton.jit
def _block_sums_kernel(x_ptr, sums_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(sums_ptr + pid, tl.sum(x, axis=0))


@triton.jit
def _block_scan_kernel(x_ptr, offsets_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0)
    base = tl.load(offsets_ptr + pid)
    tl.store(y_ptr + offs, tl.cumsum(x, axis=0) + base, mask=mask)


def cumsum_1d(x: torch.Tensor, block: int, num_warps: int) -> torch.Tensor:
    """Inclusive int32 prefix sum of a 1-D int32 tensor: block sums, their scan, block scans."""
    n = x.numel()
    nb = triton.cdiv(n, block)
    sums = torch.empty(nb, device=x.device, dtype=torch.int32)
    _block_sums_kernel[(nb,)](x, sums, n, BLOCK=block, num_warps=num_warps)
    offsets = torch.cumsum(sums, 0, dtype=torch.int32) - sums
    y = torch.empty_like(x)
    _block_scan_kernel[(nb,)](x, offsets, y, n, BLOCK=block, num_warps=num_warps)
    return y
