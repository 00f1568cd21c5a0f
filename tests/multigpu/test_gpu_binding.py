"""GPU binding by identity: a tenant reaches only its own GPU, whatever it sets itself.

Real krexd over two simulated GPUs, ``krex run --gpu 1``, the real shim over
the fake driver.  Before: the command got ``CUDA_VISIBLE_DEVICES=1`` (an
index, no ``CUDA_DEVICE_ORDER``) and a script that set the variable itself
ran on GPU 0, which GPU 1's coordinator neither drains nor freezes.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from krexd.hardware.inventory import fake_uuid
from tests.fakecuda.harness import FakeCuda
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root

WRONG_GPU = 83  # krex_client.errors.ExitCode.WRONG_GPU

_PROBE = """
import ctypes, os, sys
if len(sys.argv) > 2:
    os.environ["CUDA_VISIBLE_DEVICES"] = sys.argv[2]  # the script picks its own GPU
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev = ctypes.c_int()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p()
if sys.argv[1] == "primary":
    r = cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
else:
    r = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
uuid = ctypes.create_string_buffer(16)
cu.cuDeviceGetUuid(uuid, dev)
print(r, uuid.raw[15], flush=True)
"""


def _run(k: Krexd, fc: FakeCuda, *args: str) -> subprocess.CompletedProcess[str]:
    env = fc.env(KREX_FAKE_GPUS="2", KREX_SOCKET=k.socket)
    return subprocess.run(
        [*k.krex, "run", "--gpu", "1", "--", sys.executable, "-c", _PROBE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_tenant_creates_contexts_only_on_its_own_gpu(
    krexd_factory: Any, built: None, fc: FakeCuda
) -> None:
    k = krexd_factory(fake_gpus=2, slots=2)
    own = _run(k, fc, "primary")
    assert own.returncode == 0, own.stderr
    assert own.stdout.split() == ["0", "1"]  # CUDA_SUCCESS on simulated GPU 1
    for how in ("primary", "create"):
        other = _run(k, fc, how, "0")
        assert other.returncode == WRONG_GPU, (how, other.stdout, other.stderr)
        assert other.stdout == ""
        assert f"refusing to create a CUDA context on {fake_uuid(0)}" in other.stderr
        assert f"bound to {fake_uuid(1)}" in other.stderr
    assert k.status()["tenants"] == []
