"""A hostile tenant command for tests/integration/test_attacks.py (fake driver).

Usage: attacker.py MODE [ARG]

Prints ``{"pid": ..., "mode": ...}`` first, then what the attack did as one
JSON line (``{"denied": ...}`` etc.), then, for the modes that keep using
the GPU, launches 200 µs kernels on the fake driver until killed.

Modes (the attacks of the issues "Gate v2" and "Tenant identity" 12.5):

* ``gate-word``: write 8 bytes over the gate word (offset 24 of the gate
  file ``KREX_GATE``), once, then exit.
* ``truncate-gate``: truncate the gate file to 0 bytes, then exit.
* ``relabel HOLDER``: register (first GPU call), then write tenant id
  HOLDER into every slot of this tenant's slot memory (``KREX_SLOTS_FD`` /
  ``KREX_SLOTS``) and an acknowledgement of an epoch far ahead; keep
  launching.
* ``garbage``: register, then fill this tenant's slot memory (header
  included) with 0xff bytes; keep launching.
* ``truncate-slots``: register, then try to shrink and grow the slot
  memory; keep launching.
* ``gpu [KERNEL_NS]``: just keep launching, kernels of KERNEL_NS (default
  200 µs), synchronizing every second one (run it with ``env -u
  LD_PRELOAD`` or under ``unshare -pf --mount-proc``).
* ``exec-unshimmed``: one kernel through the shim, then ``execve`` this
  program in mode ``gpu`` without ``LD_PRELOAD``.
* ``self-ack [KERNEL_NS]``: register, then a thread watches the gate word
  and, at each closure, writes the new epoch as its own acknowledgement
  with a zero in-flight count into every slot of its slot memory (issue
  "Exclusivity", self-acknowledgement), while the main thread keeps about
  100 ms of kernels (default 5 ms each) queued.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fakecuda"))

import fakegpu  # noqa: E402

WORD_OFFSET = 24  # krex_gate.h: magic 8, version 4, ntenants 4, gpu 4, reserved 4
SLOTS_HEADER = 64
SLOT_BYTES = 128  # krex_gate.h struct krex_slot
INFLIGHT_OFFSET, ACK_OFFSET, TENANT_OFFSET = 8, 12, 16


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def slot_memory_fd() -> int:
    fd_s = os.environ.get("KREX_SLOTS_FD")
    if fd_s is not None:
        try:
            os.fstat(int(fd_s))
            return os.dup(int(fd_s))
        except OSError:
            pass
    return os.open(os.environ["KREX_SLOTS"], os.O_RDWR)


def denied(fn: object) -> bool:
    try:
        fn()  # type: ignore[operator]
    except OSError as exc:
        say(error=exc.strerror)
        return True
    return False


def write_word() -> None:
    with open(os.environ["KREX_GATE"], "r+b") as f:
        f.seek(WORD_OFFSET)
        f.write((0xFFFF_FFFF_0000_0001).to_bytes(8, "little"))


def launch_forever(gpu: fakegpu.FakeGpu, kernel_ns: int = 200_000) -> None:
    n = 0
    while True:
        gpu.launch(kernel_ns)
        n += 1
        if n % 2 == 0:
            gpu.synchronize()


def forge_acks(fd: int) -> None:
    """Acknowledge every closure of the gate at once, in every slot (a thread)."""
    size = os.fstat(fd).st_size
    with open(os.environ["KREX_GATE"], "rb") as g, mmap.mmap(fd, size) as m:
        gate = mmap.mmap(g.fileno(), 0, prot=mmap.PROT_READ)
        seen = 0
        while True:
            word = int.from_bytes(gate[WORD_OFFSET : WORD_OFFSET + 8], "little")
            epoch = word >> 32
            if word and epoch != seen:
                for i in range((size - SLOTS_HEADER) // SLOT_BYTES):
                    base = SLOTS_HEADER + i * SLOT_BYTES
                    if int.from_bytes(m[base : base + 8], "little"):
                        m[base + INFLIGHT_OFFSET : base + INFLIGHT_OFFSET + 4] = bytes(4)
                        m[base + ACK_OFFSET : base + ACK_OFFSET + 4] = epoch.to_bytes(4, "little")
                seen = epoch
            time.sleep(0.0001)


def keep_queued(gpu: fakegpu.FakeGpu, kernel_ns: int) -> None:
    """About 100 ms of kernels always queued: launch a batch, wait for half of it."""
    batch = max(2, 100_000_000 // kernel_ns)
    while True:
        for _ in range(batch):
            gpu.launch(kernel_ns)
        time.sleep(batch * kernel_ns / 2e9)


def main() -> None:
    mode = sys.argv[1]
    say(pid=os.getpid(), mode=mode)
    if mode == "gate-word":
        say(denied=denied(write_word))
        return
    if mode == "truncate-gate":
        say(denied=denied(lambda: os.truncate(os.environ["KREX_GATE"], 0)))
        return
    gpu = fakegpu.init()
    gpu.launch(100_000)
    gpu.synchronize()
    if mode == "exec-unshimmed":
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), "gpu"], env)
    if mode == "self-ack":
        threading.Thread(target=forge_acks, args=(slot_memory_fd(),), daemon=True).start()
        say(forging=True)
        keep_queued(gpu, int(sys.argv[2]) if len(sys.argv) > 2 else 5_000_000)
    if mode in ("relabel", "garbage", "truncate-slots"):
        fd = slot_memory_fd()
        size = os.fstat(fd).st_size
        if mode == "truncate-slots":
            say(
                shrink_denied=denied(lambda: os.ftruncate(fd, 0)),
                grow_denied=denied(lambda: os.ftruncate(fd, size * 2)),
            )
        else:
            with mmap.mmap(fd, size) as m:
                if mode == "garbage":
                    m[:] = b"\xff" * size
                else:
                    holder = int(sys.argv[2])
                    for i in range((size - SLOTS_HEADER) // SLOT_BYTES):
                        base = SLOTS_HEADER + i * SLOT_BYTES
                        m[base + TENANT_OFFSET : base + TENANT_OFFSET + 4] = holder.to_bytes(
                            4, "little"
                        )
                        m[base + ACK_OFFSET : base + ACK_OFFSET + 4] = (1 << 30).to_bytes(
                            4, "little"
                        )
            say(written=True)
    launch_forever(gpu, int(sys.argv[2]) if mode == "gpu" and len(sys.argv) > 2 else 200_000)


if __name__ == "__main__":
    main()
