"""On a real NVIDIA GPU: a warm pool of torch and triton serves PyTorch commands.

Skipped without a GPU (``@pytest.mark.gpu``).  Real krexd on the real GPU,
``[warm] modules`` at their default (torch, triton).  The pool must come up
(its imports leave no thread running, initialise no CUDA driver), serve,
and its command must compute what a cold one computes, gated by the shim;
the import time a warm command saves is printed (``-s``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli.warm_support import Pools

pytestmark = [pytest.mark.gpu, pytest.mark.root, pytest.mark.slow]

PROG = Path(__file__).resolve().parent / "progs" / "warm_torch.py"


def test_a_torch_pool_serves_cuda_commands(krexd_factory: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    k = krexd_factory(fake_gpus=0, slots=2, config={"warm": {"idle_s": 300.0}})
    pools = Pools(k, tmp_path)
    pools.ready(timeout_s=300)
    assert not list(pools.dir.glob("*.refused")), pools.logs()
    assert pools.pools()[0]["modules"] == ["torch", "triton"]
    times = {}
    outs = {}
    for start in ("--cold", "--warm"):
        t0 = time.monotonic()
        p = (
            pools.cold([sys.executable, str(PROG)], timeout=600)
            if start == "--cold"
            else (pools.warm([sys.executable, str(PROG)], timeout=600))
        )
        times[start] = time.monotonic() - t0
        assert p.returncode == 0, p.stderr[-4000:]
        outs[start] = json.loads(p.stdout.strip().splitlines()[-1])
    print(json.dumps({"wall_s": times, "out": outs}, indent=1))
    assert outs["--warm"]["checksum"] == outs["--cold"]["checksum"] == 2048.0 * 2048 * 2048
    assert outs["--warm"]["gating"] == outs["--cold"]["gating"] == 1
    assert outs["--warm"]["imports_s"] < outs["--cold"]["imports_s"] / 2
