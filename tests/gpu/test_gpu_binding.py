"""On a real NVIDIA GPU: a tenant is bound to its GPU by UUID, in PCI bus order.

Skipped without a GPU.  Real krexd over the real inventory (NVML), ``krex
run``, the shim preloaded.  The command sees one device, whose UUID is the
one krexd gave it; pointing ``CUDA_VISIBLE_DEVICES`` elsewhere itself (a
multi-GPU host) ends it with exit 83.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.root]

_PROBE = """
import ctypes, os, sys
if len(sys.argv) > 1:
    os.environ["CUDA_VISIBLE_DEVICES"] = sys.argv[1]
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
n, dev, ctx = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
cu.cuDeviceGetCount(ctypes.byref(n))
cu.cuDeviceGet(ctypes.byref(dev), 0)
u = ctypes.create_string_buffer(16)
cu.cuDeviceGetUuid(u, dev)
h = u.raw.hex()
r = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
text = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
print(n.value, text, r, os.environ.get("KREX_GPU_UUID"))
"""


def test_tenant_is_bound_to_its_gpu_by_uuid(krexd_factory: Any) -> None:
    k = krexd_factory(fake_gpus=0, slots=2)
    gpus = k.status()["gpus"]
    last = gpus[-1]["index"]
    run = subprocess.run(
        [*k.krex, "run", "--gpu", str(last), "--", sys.executable, "-c", _PROBE],
        env=k.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    count, uuid, result, bound = run.stdout.split()
    assert count == "1" and result == "0" and uuid == bound
    if len(gpus) > 1:  # the command picks GPU 0 itself: refused
        other = subprocess.run(
            [*k.krex, "run", "--gpu", str(last), "--", sys.executable, "-c", _PROBE, "0"],
            env=k.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert other.returncode == 83, other.stderr
        assert "refusing to create a CUDA context" in other.stderr
