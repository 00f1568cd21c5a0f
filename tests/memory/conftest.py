"""Fixtures: a simulated GPU of 1 GiB shared by shimmed processes, with its gate.

``shared_gpu`` builds the shim, the gate library and the fake driver once,
creates a gate for GPU 0 in the test's directory and gives processes on it:
``start(tenant, *steps)`` runs ``fakealloc`` (tests/fakecuda) with the shim
preloaded as tenant ``tenant`` (``tenant=None``: no shim, a process krex does
not run); ``run_allocator(tenant, *steps, api=...)`` runs ``progs/allocator.py``
over the fake CUDA driver or the fake HIP runtime (tests.support.GpuApi; the
``gpu_api`` fixture builds the latter); ``slot(pid)`` reads that process's
memory fields from the gate as krexd does (``krexd.gate.Gate.registrations``).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from krexd.gate import Gate, RegistrationInfo
from krexd.tenancy.registrations import identity  # here: imported in the auditor, the first

# test of a process had no audit for its first second, and its co-tenant was not seen
from tests.support import (
    BUILD,
    FAKE_DIR,
    GPU_APIS,
    GpuApi,
    JsonLineReader,
    clean_env,
    forget_gate,
    tenant_env,
)

SHIM = BUILD / "lib" / "libkrex_shim.so"
FAKEALLOC = FAKE_DIR / "bin" / "fakealloc"
FAKECALL = FAKE_DIR / "bin" / "fakecall"
ALLOCATOR = Path(__file__).resolve().parent / "progs" / "allocator.py"
CAPACITY = "1G"

__all__ = ["ALLOCATOR", "FAKECALL", "FAKE_DIR", "Proc", "SharedGpu"]


class Proc:
    """A fakealloc (or allocator.py) process; its JSON lines are collected as they come."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        assert popen.stdout is not None
        self._reader = JsonLineReader(popen.stdout, f"process {popen.pid}", self._ended)

    def _ended(self) -> str:
        return f"({self.popen.poll()})"

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def lines(self) -> list[dict[str, Any]]:
        """The lines read so far."""
        return self._reader.lines

    def next(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The next JSON line (fails after ``timeout_s`` or at the end of output)."""
        return self._reader.next(timeout_s)

    def drain(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Every line, to the end of the output (``lines`` then holds them all)."""
        return self._reader.drain(timeout_s)

    def quiet(self) -> bool:
        """True when no line is waiting to be read."""
        return self._reader.empty()

    def go(self) -> None:
        """Release a ``wait`` step."""
        assert self.popen.stdin is not None
        self.popen.stdin.write("\n")
        self.popen.stdin.flush()

    def finish(self, timeout_s: float = 15.0) -> tuple[int, str]:
        """Wait for the end; (exit code, stderr)."""
        assert self.popen.stderr is not None
        self.popen.wait(timeout_s)
        return self.popen.returncode, self.popen.stderr.read()


@dataclass
class SharedGpu:
    """One simulated GPU of ``CAPACITY`` and its gate, in ``workdir``."""

    workdir: Path
    gate: Any  # krexd.gate.Gate
    procs: list[Proc] = field(default_factory=list)

    def env(
        self, tenant: int | None, oom_wait_s: float = 30.0, api: GpuApi = GPU_APIS["cuda"]
    ) -> dict[str, str]:
        env = clean_env(
            LD_LIBRARY_PATH=str(FAKE_DIR),
            KREX_FAKE_MEM_BYTES=CAPACITY,
            KREX_FAKE_STATE=str(self.workdir / "fakestate"),
            KREX_SHIM_LOG="info",
        )
        if tenant is not None:
            env.update(
                LD_PRELOAD=str(SHIM),
                **tenant_env(self.gate, tenant),
                KREX_OOM_WAIT_S=f"{oom_wait_s:g}",
            )
        return api.runtime_env(env)

    def start(
        self, tenant: int | None, *steps: str, oom_wait_s: float = 30.0, prog: Path = FAKEALLOC
    ) -> Proc:
        """Start ``fakealloc STEPS`` (or ``prog STEPS``) as tenant ``tenant`` (None: no shim)."""
        p = Proc(
            subprocess.Popen(
                [str(prog), *steps],
                env=self.env(tenant, oom_wait_s),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        self.procs.append(p)
        return p

    def run_allocator(
        self, tenant: int, *steps: str, oom_wait_s: float = 30.0, api: GpuApi = GPU_APIS["cuda"]
    ) -> Proc:
        """Start ``progs/allocator.py STEPS`` (Python, fakegpu) as tenant ``tenant``, over
        ``api``'s fake."""
        p = Proc(
            subprocess.Popen(
                [sys.executable, str(ALLOCATOR), *steps],
                env=self.env(tenant, oom_wait_s, api),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        self.procs.append(p)
        return p

    def slot(self, pid: int) -> RegistrationInfo:
        """The gate slot of process ``pid`` (its last record, even after it ended)."""
        mine = [s for s in self.gate.registrations() if s.pid == pid]
        assert mine, f"pid {pid} has no gate slot"
        return mine[0]


def _audit(gate: Any, stop: threading.Event) -> None:
    """What krexd's gate watch does for the shims' memory judgement (orchestration/gatewatch.py).

    Every 5 ms: ``Gate.audit()`` publishes the per-tenant memory summary and
    relays frees; every 50 ms, registrations whose process exited are
    ignored (judged by pid and start time: these tests run no cgroups).
    """
    n = 0
    while not stop.wait(0.005):
        n += 1
        if n % 10 == 0:
            for s in gate.registrations():
                who = identity(s.pid)
                if s.state == "active" and (who is None or who.start_ticks != s.start_ticks):
                    gate.ignore(s)
        gate.audit()


@pytest.fixture
def shared_gpu(built: None, tmp_path: Path) -> Iterator[SharedGpu]:
    """A fresh 1 GiB simulated GPU and its gate, audited as krexd does; processes killed after."""
    gate = Gate.create(str(tmp_path / "gpu0.gate"), 0)
    gpu = SharedGpu(tmp_path, gate)
    stop = threading.Event()
    auditor = threading.Thread(target=_audit, args=(gate, stop), daemon=True)
    auditor.start()
    yield gpu
    for p in gpu.procs:
        if p.popen.poll() is None:
            p.popen.kill()
        p.popen.wait()
    stop.set()
    auditor.join()
    gate.unmap()
    forget_gate(gate)
