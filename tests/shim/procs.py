"""Shim test support: build paths, polling, and the tenant processes the tests drive."""

from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import support
from tests.support import REPO, GpuApi, JsonLineReader, ShimBuild, tenant_env

__all__ = [
    "REPO",
    "CuTenant",
    "HipTenant",
    "RegionTenant",
    "ShimBuild",
    "Tenant",
    "alive_judge",
    "cpu_ticks",
    "slot_of",
    "wait_for",
]

HIP_TENANT = Path(__file__).with_name("hip_tenant.py")
STATS_FIELDS = ("started", "finished", "slot", "acks", "ready", "forgotten")
_STATS = struct.Struct("<" + "Q" * len(STATS_FIELDS))


def wait_for(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """``tests.support.wait_for`` polling every ms (the shim's races are short)."""
    support.wait_for(cond, timeout, what, every_s=0.001)


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
    tenant: int = 0
    _map: mmap.mmap | None = field(default=None, repr=False)

    @classmethod
    def start(cls, build: ShimBuild, gate: Any, tenant: int, workdir: Path, *args: str) -> Tenant:
        """Start gate_tenant for ``tenant`` on ``gate`` (krexd.gate.Gate); ``args``: options."""
        stats = workdir / f"stats-{tenant}-{time.monotonic_ns()}"
        stats.write_bytes(b"\0" * _STATS.size)
        slots = tenant_env(gate, tenant)["KREX_SLOTS"]
        proc = subprocess.Popen(
            [str(build.prog("gate_tenant")), gate.path, slots, str(tenant), str(stats), *args]
        )
        return cls(proc, stats, tenant)

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


def slot_of(gate: Any, tenant: int, index: int) -> Any:
    """Registration ``index`` of ``tenant`` on ``gate`` (krexd.gate.RegistrationInfo)."""
    for s in gate.registrations():
        if s.tenant == tenant and s.index == index:
            return s
    raise AssertionError(f"no slot {index} of tenant {tenant}: {gate.registrations()}")


def alive_judge(s: Any) -> bool:
    """A drain judge for registrants without a shim image: the pid lives, same start time."""
    from krexd.tenancy.registrations import identity

    who = identity(s.pid)
    return who is not None and who.start_ticks == s.start_ticks


class LineTenant:
    """A tenant program driven line by line: one command a line in, one JSON reply a line
    out (``rc`` 0 on success); ``timeout_s``: the default wait for a reply."""

    def __init__(
        self, argv: list[str], env: dict[str, str], name: str, timeout_s: float = 10.0
    ) -> None:
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.timeout_s = timeout_s
        assert self.proc.stdout is not None
        self._replies = JsonLineReader(self.proc.stdout, f"{name} {self.pid}", self._ended)

    def _ended(self) -> str:
        err = self.proc.stderr.read() if self.proc.stderr else ""
        return f"rc {self.proc.wait()}\n{err}"

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def send(self, command: str) -> None:
        """Send one command line without waiting for its reply."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float | None = None) -> dict[str, Any]:
        """The next reply; AssertionError when none comes within ``timeout`` s."""
        return self._replies.next(self.timeout_s if timeout is None else timeout)

    def pending(self) -> bool:
        """True when no reply is waiting."""
        return self._replies.empty()

    def run(self, command: str, timeout: float | None = None) -> dict[str, Any]:
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
                self.proc.wait(timeout=self.timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class CuTenant(LineTenant):
    """A running ``cu_tenant`` (tests/shim/c/cu_tenant.c) driven line by line."""

    def __init__(self, build: ShimBuild, env: dict[str, str]) -> None:
        super().__init__([str(build.prog("cu_tenant"))], env, "cu_tenant")


class HipTenant(LineTenant):
    """A running ``hip_tenant.py`` (tests/shim, over the fake HIP runtime) driven line
    by line."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__([sys.executable, str(HIP_TENANT)], env, "hip_tenant", timeout_s=15.0)


class RegionTenant:
    """A tenant of the region tests that run over both fakes (``gpu_api``): cu_tenant
    over the CUDA driver, hip_tenant.py over the HIP runtime.  :meth:`run`,
    :meth:`send` and :meth:`reply` take the commands both programs spell alike
    (``init``, ``region_begin EPOCH L2``, ``region_end``); streams, launches and
    captures are methods, each sent in its program's words."""

    def __init__(self, api: GpuApi, build: ShimBuild, env: dict[str, str]) -> None:
        self.api = api.name
        self.tenant: LineTenant = CuTenant(build, env) if api.name == "cuda" else HipTenant(env)
        self.streams = 0

    @property
    def pid(self) -> int:
        """The process id."""
        return self.tenant.pid

    def send(self, command: str) -> None:
        """Send one command line without waiting for its reply."""
        self.tenant.send(command)

    def reply(self, timeout: float | None = None) -> dict[str, Any]:
        """The next reply."""
        return self.tenant.reply(timeout)

    def run(self, command: str, timeout: float | None = None) -> dict[str, Any]:
        """Send ``command``, return its reply, assert it succeeded (rc 0)."""
        return self.tenant.run(command, timeout)

    def stream(self, nonblocking: bool = False) -> int:
        """A new stream; its number (1, 2, ...) for the methods below."""
        self.streams += 1
        flag = " nonblocking" if nonblocking else ""
        if self.api == "cuda":
            self.run(f"stream {self.streams}{flag}")
        else:
            assert self.run(f"stream{flag}")["stream"] == self.streams
        return self.streams

    def launch(self, stream: int, n: int, ns: int) -> dict[str, Any]:
        """``n`` kernels of ``ns`` ns on ``stream`` (0: the legacy / null stream)."""
        if self.api == "cuda":
            return self.run(f"launch {stream} {n} {ns}")
        return self.run(f"launch {ns} {stream} {n}")

    def capture_begin(self, stream: int) -> None:
        """Begin a global-mode capture on ``stream``."""
        self.run(f"begin {stream} global" if self.api == "cuda" else f"capture_begin {stream}")

    def capture_end(self, stream: int) -> None:
        """End the capture of ``stream`` and instantiate its graph (rc 0: still valid)."""
        self.run(f"end {stream}" if self.api == "cuda" else f"capture_end {stream}")

    def close(self) -> None:
        """Quit (or kill) and reap."""
        self.tenant.close()
