# Triton reads kernel parameter annotations (tl.constexpr, pointer types), so @triton.jit
# kernels stay unannotated.
# mypy: disable-error-code="no-untyped-def, untyped-decorator"
"""Triton flash-attention forward: FlashAttention-2 online softmax, one Q tile per program."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _attn_fwd_kernel(
    Q,
    K,
    V,
    Out,
    sm_scale,
    H,
    N_CTX,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qk,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kk,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vk,
    stride_oz,
    stride_oh,
    stride_om,
    stride_ok,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh
    o_base = Out + off_z * stride_oz + off_h * stride_oh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk,
        mask=offs_m[:, None] < N_CTX,
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): exp2 instead of exp
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX)
    else:
        hi = N_CTX
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(
            k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kk,
            mask=cols[None, :] < N_CTX,
            other=0.0,
        )
        qk = tl.dot(q, k) * qk_scale
        valid = cols[None, :] < N_CTX
        if CAUSAL:
            valid = valid & (offs_m[:, None] >= cols[None, :])
        qk = tl.where(valid, qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vk,
            mask=cols[:, None] < N_CTX,
            other=0.0,
        )
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(
        o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok,
        acc.to(Out.dtype.element_ty),
        mask=offs_m[:, None] < N_CTX,
    )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for q, k, v [batch, heads, seq, head_dim] of one seq length."""
    z, h, n_ctx, d = q.shape
    o = torch.empty_like(q)
    grid = (triton.cdiv(n_ctx, block_m), z * h)
    _attn_fwd_kernel[grid](
        q,
        k,
        v,
        o,
        d**-0.5,
        h,
        n_ctx,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *o.stride(),
        HEAD_DIM=d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        CAUSAL=causal,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return o
