"""A tenant that forges the flags of its slot memory that pause others (fake driver).

Usage: flagforger.py MODE

Registers (one kernel through the shim), writes its forgery into its own
tenant's slot memory (``KREX_SLOTS_FD`` / ``KREX_SLOTS``), prints
``{"forged": MODE, "pid": ...}`` and sleeps until killed.

* ``wait``: its own slot (verified: it is this live process) says an
  allocation waits for co-tenants' memory (``oom`` WAITING) while holding
  100 MiB, for ever.
* ``fault``: a free slot gets a registration of no process (pid 2**30) with
  a fatal-error record (700, launched): a GPU-wide fault under MPS, forged.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fakecuda"))

import fakegpu  # noqa: E402
from attacker import slot_memory_fd  # noqa: E402  (this folder: the same slot memory)

HEADER, SLOT = 64, 128  # krex_gate.h: struct krex_tenant_mem, struct krex_slot
TENANT_IN_HEADER = 12
TENANT, MEM_MIB, OOM, FAULT = 16, 56, 60, 80  # offsets in struct krex_slot
OOM_WAITING = 0x8000_0000
ACTIVE = 2


def u32(m: mmap.mmap, off: int) -> int:
    return int.from_bytes(m[off : off + 4], "little")


def put32(m: mmap.mmap, off: int, v: int) -> None:
    m[off : off + 4] = v.to_bytes(4, "little")


def main() -> None:
    mode = sys.argv[1]
    gpu = fakegpu.init()
    gpu.launch(100_000)
    gpu.synchronize()
    fd = slot_memory_fd()
    size = os.fstat(fd).st_size
    with mmap.mmap(fd, size) as m:
        tenant = u32(m, TENANT_IN_HEADER)
        bases = [HEADER + i * SLOT for i in range((size - HEADER) // SLOT)]
        owners = {b: int.from_bytes(m[b : b + 8], "little") for b in bases}
        if mode == "wait":
            (mine,) = [
                b for b, o in owners.items() if o >> 32 == os.getpid() and o & 0xFF == ACTIVE
            ]
            put32(m, mine + MEM_MIB, 100)
            put32(m, mine + OOM, u32(m, mine + OOM) | OOM_WAITING)
        else:
            free = [b for b, o in owners.items() if o == 0][-1]
            put32(m, free + TENANT, tenant)
            put32(m, free + FAULT, 700 | 0x10000)
            m[free : free + 8] = ((1 << 30) << 32 | 2 << 8 | ACTIVE).to_bytes(8, "little")
    print(json.dumps({"forged": mode, "pid": os.getpid()}), flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
