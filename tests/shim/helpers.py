"""Helpers for the shim tests: build paths and a tenant process of the gate tests."""

from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"

STATS_FIELDS = ("started", "finished", "slot", "acks", "ready", "forgotten")
_STATS = struct.Struct("<" + "Q" * len(STATS_FIELDS))


@dataclass(frozen=True)
class ShimBuild:
    """Paths of the built libraries and test programs."""

    shim: Path = BUILD / "lib" / "libkrex_shim.so"
    gate_lib: Path = BUILD / "lib" / "libkrex_gate.so"
    tests: Path = BUILD / "shim-tests"

    def prog(self, name: str) -> Path:
        """A test program of tests/shim/c."""
        return self.tests / name


def wait_for(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``cond`` every ms until true; AssertionError naming ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.001)


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` (all threads), in clock ticks (/proc/<pid>/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)


@dataclass
class Tenant:
    """A running ``gate_tenant`` program and its shared statistics."""

    proc: subprocess.Popen[bytes]
    stats_path: Path
    _map: mmap.mmap | None = field(default=None, repr=False)

    @classmethod
    def start(
        cls, build: ShimBuild, gate_path: str, tenant: int, workdir: Path, *args: str
    ) -> Tenant:
        """Start gate_tenant for ``tenant``; ``args`` are its options."""
        stats = workdir / f"stats-{tenant}-{time.monotonic_ns()}"
        stats.write_bytes(b"\0" * _STATS.size)
        proc = subprocess.Popen(
            [str(build.prog("gate_tenant")), gate_path, str(tenant), str(stats), *args]
        )
        return cls(proc, stats)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def stats(self) -> dict[str, int]:
        """The program's counters now (calls started/finished, slot, acks, ready, forgotten)."""
        if self._map is None:
            with open(self.stats_path, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), _STATS.size)
        return dict(zip(STATS_FIELDS, _STATS.unpack(self._map[: _STATS.size]), strict=True))

    def wait_ready(self, calls: int = 1) -> None:
        """Until it registered, started its threads and made ``calls`` calls."""
        wait_for(
            lambda: self.stats()["ready"] == 1 and self.stats()["started"] >= calls,
            what=f"tenant {self.pid} ready",
        )

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
