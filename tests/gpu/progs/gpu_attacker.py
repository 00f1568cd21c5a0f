"""Hostile and unusual tenants on a real GPU, stamping the device clock.

For tests/gpu/test_gpu_attacks.py.

Usage: gpu_attacker.py MODE OUT.npy SECONDS

Prints ``{"pid": ..., "mode": ...}`` first and ``{"started": true}`` once
its first kernels ran, then launches stamp kernels (``stamp.py``'s, which
record ``%globaltimer`` at start and end) for SECONDS and saves their
``[[start, end], ...]`` to OUT.npy.  The attacks are those of the issue
"Exclusivity the tenant cannot subvert", now against the real driver:

* ``self-ack``: a thread writes its own drain acknowledgement at every
  closure of the gate (tests/integration/progs/attacker.py's forger) while
  the main thread keeps about 100 ms of 5 ms kernels queued.
* ``capture-busy``: honest, unusual: queue ~50 ms of kernels on a stream,
  then begin a stream capture on it without synchronizing; capture one
  kernel, instantiate, launch; again.
* ``gpu``: 1 ms kernels, synchronizing every second one: run it with
  ``env -u LD_PRELOAD``, or outside ``krex run``.
* ``sanitized``: start ``gpu`` as a child with only ``PATH`` in its
  environment (``subprocess.run(env=...)``), wait for it.
* ``deepbind``: ``dlopen`` the driver (and a copy of it) with
  ``RTLD_DEEPBIND`` and report what happened (``{"refused": [...]}``),
  then launch as ``gpu`` does through the normal path.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import cupy as cp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration", "progs"))

from stamp import _kernel  # noqa: E402

CAP = 400_000


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class Stamper:
    """Stamp kernels into one device buffer; ``save`` copies what ran to OUT.npy."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.k = _kernel()
        self.buf = cp.zeros(2 * CAP, dtype=cp.uint64)
        self.n = 0

    def launch(self, spin_ns: int, stream: cp.cuda.Stream | None = None) -> None:
        if self.n >= CAP:
            return
        with stream or cp.cuda.Stream.null:
            self.k((1,), (1,), (self.buf, np.int32(self.n), np.int64(spin_ns)))
        self.n += 1

    def save(self) -> None:
        cp.cuda.Device().synchronize()
        np.save(self.out, cp.asnumpy(self.buf[: 2 * self.n]).reshape(-1, 2))


def plain(st: Stamper, seconds: float, kernel_ns: int = 1_000_000) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and st.n < CAP:
        st.launch(kernel_ns)
        st.launch(kernel_ns)
        cp.cuda.Device().synchronize()


def self_ack(st: Stamper, seconds: float) -> None:
    from attacker import forge_acks, slot_memory_fd

    threading.Thread(target=forge_acks, args=(slot_memory_fd(),), daemon=True).start()
    say(forging=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end and st.n < CAP:
        for _ in range(20):  # 100 ms queued
            st.launch(5_000_000)
        time.sleep(0.05)  # half of it still queued when the next batch goes in
    st.save()


def capture_busy(st: Stamper, seconds: float) -> None:
    s = cp.cuda.Stream(non_blocking=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end and st.n < CAP - 20:
        for _ in range(10):  # ~50 ms queued on s
            st.launch(5_000_000, s)
        s.begin_capture()  # no synchronize: the warm-up is still running
        st.launch(1_000_000, s)
        graph = s.end_capture()
        graph.launch(s)
        s.synchronize()


def deepbind() -> list[str]:
    """Try to load the driver with RTLD_DEEPBIND; what each attempt said."""
    deep = getattr(os, "RTLD_DEEPBIND", 0x8)
    real = next(
        line.split()[-1]
        for line in open("/proc/self/maps")
        if "libcuda.so" in line and line.split()[-1].startswith("/")
    )
    copy = os.path.join(tempfile.mkdtemp(), "libcuda-plugin.so.1")
    shutil.copy(real, copy)
    said = []
    for path in (real, copy):
        try:
            ctypes.CDLL(path, mode=deep | os.RTLD_NOW)
            said.append(f"loaded {path}")
        except OSError as exc:
            said.append(f"refused: {exc}")
    return said


def main() -> None:
    mode, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    say(pid=os.getpid(), mode=mode)
    if mode == "sanitized":
        child = [sys.executable, os.path.abspath(__file__), "gpu", out, str(seconds)]
        rc = subprocess.run(child, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}).returncode
        sys.exit(rc)
    st = Stamper(out)
    st.launch(1000)  # registers with krexd (under the shim), compiles, loads
    cp.cuda.Device().synchronize()
    if mode == "deepbind":
        say(refused=deepbind())
    say(started=True)
    if mode == "self-ack":
        self_ack(st, seconds)
        return
    if mode == "capture-busy":
        capture_busy(st, seconds)
    else:
        plain(st, seconds)
    st.save()


if __name__ == "__main__":
    main()
