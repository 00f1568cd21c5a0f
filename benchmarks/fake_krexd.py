"""A private krexd over one simulated GPU, for the CPU benchmarks.

from fake_krexd import start_krexd   # benchmarks/ is on sys.path for a script here
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from krex_client.connection import Connection


def start_krexd(workdir: str, slots: int, name: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start krexd (``--fake-gpus 1``, ``slots`` slots, cgroup ``name<pid>``) on
    ``workdir/krexd.sock``; returns it and its socket once it answers ``ping``.

    The caller's ``KREX_*`` variables are left out of krexd's environment
    (``KREX_SOCKET`` would point it at another socket).  Raises SystemExit when
    krexd does not answer within 30 s (it is killed first).
    """
    socket = os.path.join(workdir, "krexd.sock")
    cfg = os.path.join(workdir, "krex.toml")
    with open(cfg, "w") as f:
        f.write(
            f'[daemon]\nsocket = "{socket}"\nlog_level = "warning"\n'
            f"[admission]\nslots_per_gpu = {slots}\n"
            f'[cgroup]\nname = "{name}{os.getpid()}"\n[cpu]\nallow_shared = true\n'
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "krexd", "--foreground", "--config", cfg, "--fake-gpus", "1"],
        env=env,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(socket):
            try:
                with Connection(socket, timeout_s=0.5) as c:
                    c.request("ping")
                return proc, socket
            except Exception:
                pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("krexd did not start")
