"""Triton's autotuner under auto-regions, with a stand-in krexd: where each launch ran.

Run by tests/gpu/test_gpu_autoregion.py in a fresh interpreter with
``KREX_AUTOREGION=1`` and the ``KREX_*`` variables of a tenant set, so the
regions are real ``region.critical()`` calls answered by the in-process
connection below (no krexd, no shim).  Every launch of the tuned kernel
records its ``BLOCK`` and whether a region was held; prints one JSON object.
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

from krex_client.region import region


class Connection:
    """Grants every region at once and logs the requests."""

    def __init__(self) -> None:
        self.held = False
        self.ops: list[str] = []

    def request(self, op, body=None, timeout_s=None, *, forever=False):  # type: ignore[no-untyped-def]
        self.ops.append(op)
        self.held = op == "region_enter"
        return {"epoch": len(self.ops), "l2_flush": False}


conn = Connection()
region.connect = lambda: conn


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


tuned = triton.autotune(
    configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"]
)(add)
launches: list[list[object]] = []
run = add.run


def logged_run(*args, **kwargs):  # type: ignore[no-untyped-def]
    launches.append([kwargs.get("BLOCK"), conn.held])
    return run(*args, **kwargs)


add.run = logged_run  # the autotuner launches through its JITFunction's run
n = 1 << 20
x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
out = torch.empty_like(x)
tuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
torch.cuda.synchronize()
assert torch.equal(out, x + y)
json.dump({"triton": triton.__version__, "launches": launches, "ops": conn.ops}, sys.stdout)
