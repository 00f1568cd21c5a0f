"""A Triton matmul tuned by Triton's own autotuner; prints the configuration it picked.

The script marks no region: the autotuner times each configuration with
``triton.testing.do_bench`` internally (paper §4.1, "an autotuner profiles
internally").  Under ``krex run --autoregion`` (or ``KREX_AUTOREGION=1`` with
the ``krex_client`` .pth installed) those measurements run in critical
regions without a change here.  ``benchmarks/autotune_fidelity.py`` runs it.

Usage: ``autotune_matmul.py [SIZE [CONFIG_SET]]`` (``CONFIG_SETS``: ``default``,
``wide``).  Output: one JSON line ``{"config": "...", "ranked": [[ms, config],
...], "pid": N}`` on stdout (every configuration's median ms, fastest first; the
process id, which names this command's regions in the region log).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl


def _configs(rows: list[tuple[int, int, int, int, int]]) -> list[triton.Config]:
    return [
        triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in rows
    ]


CONFIG_SETS = {
    # The set of docs/bench/autotune-h200.md: on an H200 at 4096 its two fastest
    # configurations lie about 7% apart (median over commands).
    "default": _configs(
        [
            (128, 128, 32, 4, 3),
            (128, 128, 64, 8, 3),
            (128, 256, 64, 8, 3),
            (256, 128, 64, 8, 3),
            (64, 128, 64, 4, 4),
            (128, 64, 64, 4, 4),
            (64, 64, 64, 4, 4),
            (128, 128, 32, 8, 4),
        ]
    ),
    # The default set's winner without the configurations closest to it (the
    # large-tile 8-warp ones), plus smaller tiles: meant to put the two fastest
    # further apart, so that a wrong pick says more than clock noise.  The gap it
    # gives is what the benchmark reports; measure before relying on it.
    "wide": _configs(
        [
            (128, 256, 64, 8, 3),
            (128, 128, 32, 4, 3),
            (64, 128, 64, 4, 4),
            (128, 64, 64, 4, 4),
            (64, 64, 64, 4, 4),
            (64, 64, 32, 4, 2),
            (32, 64, 32, 2, 2),
            (64, 32, 32, 2, 2),
        ]
    ),
}
"""Configuration sets, chosen by the second argument (default: ``default``)."""


def _matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
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


def make_kernel(configs: list[triton.Config]) -> triton.runtime.Autotuner:
    """The matmul kernel under Triton's autotuner over ``configs``."""
    return triton.autotune(configs=configs, key=["M", "N", "K"])(triton.jit(_matmul))


def _median(t: object) -> float:
    """The autotuner's figure for one configuration (its first quantile: the median)."""
    return float(t[0]) if isinstance(t, (list, tuple)) else float(t)  # type: ignore[arg-type]


def main() -> int:
    """Tune for one size (argv[1], default 4096) over a configuration set (argv[2],
    default ``default``), check the result, print the winner."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    matmul_kernel = make_kernel(CONFIG_SETS[sys.argv[2] if len(sys.argv) > 2 else "default"])
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
    print(json.dumps({"config": str(best), "ranked": ranked, "pid": os.getpid()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
