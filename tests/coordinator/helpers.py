"""Helpers for region tests: sibling counters, holders and tenant shells under krex run."""

from __future__ import annotations

import json
import mmap
import os
import struct
import subprocess
import sys
import time
from typing import Any

from tests.support import json_lines

PROGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs")
COUNTER = os.path.join(PROGS, "counter.py")
HOLDER = os.path.join(PROGS, "holder.py")
SHELL = os.path.join(PROGS, "tenant_shell.py")


class Counters:
    """A shared file of uint64 counters that sibling commands increment."""

    def __init__(self, path: str, nslots: int) -> None:
        self.path = path
        self.nslots = nslots
        with open(path, "wb") as f:
            f.write(b"\0" * 8 * nslots)
        with open(path, "r+b") as f:
            self._mem = mmap.mmap(f.fileno(), 0)

    def read(self) -> list[int]:
        return [struct.unpack_from("<Q", self._mem, 8 * i)[0] for i in range(self.nslots)]

    def wait_running(self, slots: list[int], timeout_s: float = 30.0) -> None:
        """Wait until every slot in ``slots`` has counted."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = self.read()
            if all(now[i] > 0 for i in slots):
                return
            time.sleep(0.05)
        raise AssertionError(f"counters {slots} never started: {self.read()}")

    def advancing(self, interval_s: float = 0.2) -> list[int]:
        """Slots that advanced over ``interval_s``."""
        a = self.read()
        time.sleep(interval_s)
        b = self.read()
        return [i for i in range(self.nslots) if b[i] != a[i]]


def start_counter(
    k: Any, counters: Counters, index: int, fork: bool = True
) -> subprocess.Popen[bytes]:
    """A sibling command counting in slot ``index`` (and ``index + 1`` in a grandchild)."""
    argv = [*k.krex, "run", "--", sys.executable, COUNTER, counters.path, str(index)]
    if fork:
        argv.append("--fork")
    return subprocess.Popen(argv, env=k.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def holder_argv(k: Any, counters: Counters, *extra: str) -> list[str]:
    return [
        *k.krex,
        "run",
        "--",
        sys.executable,
        HOLDER,
        counters.path,
        str(counters.nslots),
        *extra,
    ]


def parse_cycles(out: bytes) -> list[dict[str, Any]]:
    return json_lines(out.decode(), only_objects=True)


def start_shell(k: Any) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """A tenant shell and its credentials (tenant, token, pid, tid)."""
    proc = subprocess.Popen(
        [*k.krex, "run", "--", sys.executable, SHELL], env=k.env, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, json.loads(line)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
