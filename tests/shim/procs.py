"""Shim test support: build paths, polling, and the tenant processes the tests drive."""

from __future__ import annotations

import json
import mmap
import os
import queue
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


class CuTenant:
    """A running ``cu_tenant`` (tests/shim/c/cu_tenant.c) driven line by line."""

    def __init__(self, build: ShimBuild, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(build.prog("cu_tenant"))],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._replies.put(json.loads(line))
        self._replies.put(None)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def send(self, command: str) -> None:
        """Send one command line without waiting for its reply."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next reply; AssertionError when none comes within ``timeout`` s."""
        try:
            r = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"cu_tenant {self.pid}: no reply in {timeout} s") from None
        if r is None:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"cu_tenant {self.pid} ended: rc {self.proc.wait()}\n{err}")
        return r

    def pending(self) -> bool:
        """True when no reply is waiting."""
        return self._replies.empty()

    def run(self, command: str, timeout: float = 10.0) -> dict[str, Any]:
        """Send ``command``, return its reply, assert it succeeded (rc 0)."""
        self.send(command)
        r = self.reply(timeout)
        assert r["rc"] == 0, f"{command}: {r}"
        return r

    def close(self) -> None:
        """Quit (or kill) and reap."""
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
