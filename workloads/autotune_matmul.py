"""A Triton matmul tuned by Triton's own autotuner; prints the configuration it picked.

The script marks no region: the autotuner times each configuration with
``triton.testing.do_bench`` internally (paper §4.1, "an autotuner profiles
internally").  Under ``krex run --autoregion`` (or ``KREX_AUTOREGION=1`` with
the ``krex_client`` .pth installed) those measurements run in critical
regions without a change here.  ``benchmarks/autotune_fidelity.py`` runs it.

Output: one JSON line ``{"config": "...", "ranked": [[ms, config], ...]}`` on stdout
(every configuration's median ms, fastest first).
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

CONFIGS = [
    triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [
        (128, 128, 32, 4, 3),
        (128, 128, 64, 8, 3),
        (128, 256, 64, 8, 3),
        (256, 128, 64, 8, 3),
        (64, 128, 64, 4, 4),
        (128, 64, 64, 4, 4),
        (64, 64, 64, 4, 4),
        (128, 128, 32, 8, 4),
    ]
]


@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """c[M, N] = a[M, K] @ b[K, N], all row-major fp16 (fp32 accumulation)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


def _median(t: object) -> float:
    """The autotuner's figure for one configuration (its first quantile: the median)."""
    return float(t[0]) if isinstance(t, (list, tuple)) else float(t)  # type: ignore[arg-type]


def main() -> int:
    """Tune for one size (argv[1], default 4096), check the result, print the winner."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    torch.manual_seed(0)
    a = torch.randn((n, n), device="cuda", dtype=torch.float16)
    b = torch.randn((n, n), device="cuda", dtype=torch.float16)
    c = torch.empty((n, n), device="cuda", dtype=torch.float16)

    def grid(meta: dict[str, int]) -> tuple[int, int]:
        return (n // meta["BM"], n // meta["BN"])

    matmul_kernel[grid](a, b, c, n, n, n)
    torch.cuda.synchronize()
    if not torch.allclose(c.float(), (a.float() @ b.float()), atol=1.0, rtol=2e-2):
        print(json.dumps({"error": "wrong result"}))
        return 1
    best = matmul_kernel.best_config
    timings = getattr(matmul_kernel, "configs_timings", None) or {}
    ranked = sorted((_median(t), str(c)) for c, t in timings.items())
    print(json.dumps({"config": str(best), "ranked": ranked}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
