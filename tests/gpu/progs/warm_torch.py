"""A PyTorch and Triton command for tests/gpu/test_gpu_warm.py: one matmul in a region.

Prints one JSON line: seconds from the process's start to its first line
(``start_s``, from /proc/self/stat), the import time, the region's result
checksum, and whether the shim gates this process.
"""

import time

T0 = time.monotonic()

import ctypes  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402, F401

from krex_client import region  # noqa: E402

imports_s = time.monotonic() - T0
with open("/proc/self/stat") as f:
    started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
x = torch.ones(2048, 2048, device="cuda")
with region.critical():
    y = x @ x
    torch.cuda.synchronize()
print(
    json.dumps(
        {
            "imports_s": imports_s,
            "checksum": float(y.sum().item()),
            "gating": ctypes.CDLL(None).krex_shim_active(),
            "pid": os.getpid(),
            "started_ticks": started_ticks,
        }
    )
)
