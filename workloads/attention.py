"""Attention benchmarking commands: SDPA backends, a Triton flash kernel, a hand-written bmm.

python workloads/attention.py --task attn_prefill_b4_h32_s2048_d128 --candidate sdpa_flash
"""

from __future__ import annotations

from typing import Any

import harness
from harness import Bench, Case, Task

SDPA = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
# Triton tiles: candidate -> (BLOCK_M, BLOCK_N, num_warps, num_stages).
TRITON = {"triton_128x64": (128, 64, 8, 3), "triton_64x64": (64, 64, 4, 3)}
# Triton's CPU interpreter multiplies bf16 wrongly: smoke runs use fp16.
SMOKE = {"b": 1, "h": 2, "s": 100, "d": 16, "dtype": "float16"}

TASKS = [
    Task(
        "attn_prefill_b4_h32_s2048_d128",
        "0.1-1ms",
        ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "triton_128x64", "triton_64x64"),
        {"b": 4, "h": 32, "s": 2048, "d": 128, "causal": False, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=2e-2,
        about="non-causal prefill attention, 2k tokens",
        smoke=SMOKE,
    ),
    Task(
        "attn_causal_b2_h32_s8192_d128",
        "1-10ms",
        ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "triton_128x64"),
        {"b": 2, "h": 32, "s": 8192, "d": 128, "causal": True, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=2e-2,
        about="causal long-context prefill, 8k tokens",
        smoke={**SMOKE, "causal": True},
    ),
    Task(
        "attn_decode_b32_h32_kv4096_d128",
        "0.1-1ms",
        ("sdpa_flash", "sdpa_efficient", "manual_bmm"),
        {"b": 32, "h": 32, "s": 4096, "d": 128, "q_len": 1, "dtype": "bfloat16"},
        rtol=2e-2,
        atol=2e-2,
        about="one decode step over a 4k-token KV cache (2 GiB)",
        smoke={**SMOKE, "q_len": 1},
    ),
]


def reference_attention(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """fp32 attention one (batch, head) at a time: the score matrix of one head at most."""
    import torch

    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    scale = q.shape[-1] ** -0.5
    n_q, n_k = q.shape[2], k.shape[2]
    mask = None
    if causal:
        mask = torch.ones(n_q, n_k, device=q.device, dtype=torch.bool).tril(n_k - n_q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = (q[b, h].float() @ k[b, h].float().T) * scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            out[b, h] = torch.softmax(s, dim=-1) @ v[b, h].float()
    return out


def build(c: Case) -> Bench:
    import torch
    import torch.nn.functional as F

    p = c.p
    dt = getattr(torch, p["dtype"])
    b, h, s, d = p["b"], p["h"], p["s"], p["d"]
    causal = bool(p.get("causal", False))
    q = torch.randn(b, h, p.get("q_len", s), d, device=c.device, dtype=dt)
    k = torch.randn(b, h, s, d, device=c.device, dtype=dt)
    v = torch.randn(b, h, s, d, device=c.device, dtype=dt)

    def reference() -> Any:
        return reference_attention(q, k, v, causal)

    name = c.candidate
    fn: Any
    if name in SDPA:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if name != "sdpa_flash":
            c.need_cuda()
        backend = {
            "sdpa_flash": SDPBackend.FLASH_ATTENTION,
            "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
            "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
        }[name]

        def fn() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    elif name == "manual_bmm":  # scores, softmax, weighted sum: three kernels
        scale = d**-0.5

        def fn() -> Any:
            scores = torch.matmul(q, k.transpose(-1, -2)) * scale
            return torch.matmul(torch.softmax(scores.float(), dim=-1).to(dt), v)
    elif name in TRITON:
        from impl import attention as kern

        bm, bn, warps, stages = TRITON[name]

        def fn() -> Any:
            return kern.attention(q, k, v, causal, bm, bn, warps, stages)
    else:
        raise AssertionError(f"no builder for candidate {name}")
    return Bench(fn, reference)


if __name__ == "__main__":
    harness.run("attention", TASKS, build, frameworks=("torch", "triton"))
