"""Fixtures: a simulated GPU of 1 GiB shared by shimmed processes, with its gate.

``shared_gpu`` builds the shim, the gate library and the fake driver once,
creates a gate for GPU 0 in the test's directory and gives processes on it:
``start(tenant, *steps)`` runs ``fakealloc`` (tests/fakecuda) with the shim
preloaded as tenant ``tenant`` (``tenant=None``: no shim, a process krex does
not run); ``slot(pid)`` reads that process's memory fields from the gate as
krexd does (``krexd.memory.gatemem``).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from krexd.memory.gatemem import GateMemory, SlotMemory

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
SHIM = BUILD / "lib" / "libkrex_shim.so"
GATE_LIB = BUILD / "lib" / "libkrex_gate.so"
FAKE_DIR = BUILD / "fakecuda"
FAKEALLOC = FAKE_DIR / "bin" / "fakealloc"
ALLOCATOR = Path(__file__).resolve().parent / "progs" / "allocator.py"
CAPACITY = "1G"

_SCRUB = (
    "CUDA_VISIBLE_DEVICES",
    "KREX_FAKE_GPUS",
    "KREX_FAKE_MEM_BYTES",
    "KREX_FAKE_STATE",
    "KREX_FAKE_TIMELINE",
    "LD_PRELOAD",
    "KREX_GATE",
    "KREX_TENANT",
    "KREX_TOKEN",
    "KREX_SOCKET",
    "KREX_OOM_WAIT_S",
)


@pytest.fixture(scope="session")
def built() -> None:
    """Build the shim, the gate library and the fake driver (once)."""
    for target in ("shim", "fakecuda"):
        subprocess.run(
            ["make", "-s", "-C", str(REPO), target], check=True, stdout=subprocess.DEVNULL
        )
    os.environ["KREX_GATE_LIB"] = str(GATE_LIB)


class Proc:
    """A fakealloc process; a thread collects its JSON lines as they come."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        self.lines: list[dict[str, Any]] = []
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._q.put(json.loads(line))
        self._q.put(None)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def next(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The next JSON line (fails after ``timeout_s`` or at the end of output)."""
        try:
            item = self._q.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no line from {self.pid} within {timeout_s} s") from None
        if item is None:
            self._q.put(None)
            raise AssertionError(f"process {self.pid} ended ({self.popen.poll()})")
        self.lines.append(item)
        return item

    def drain(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Every line, to the end of the output (``lines`` then holds them all)."""
        while True:
            try:
                item = self._q.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"output of {self.pid} did not end in {timeout_s} s") from None
            if item is None:
                self._q.put(None)
                return self.lines
            self.lines.append(item)

    def quiet(self) -> bool:
        """True when no line is waiting to be read."""
        return self._q.empty()

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

    def env(self, tenant: int | None, oom_wait_s: float = 30.0) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        env.update(
            LD_LIBRARY_PATH=str(FAKE_DIR),
            KREX_FAKE_MEM_BYTES=CAPACITY,
            KREX_FAKE_STATE=str(self.workdir / "fakestate"),
            KREX_SHIM_LOG="info",
        )
        if tenant is not None:
            env.update(
                LD_PRELOAD=str(SHIM),
                KREX_GATE=self.gate.path,
                KREX_TENANT=str(tenant),
                KREX_OOM_WAIT_S=f"{oom_wait_s:g}",
            )
        return env

    def start(self, tenant: int | None, *steps: str, oom_wait_s: float = 30.0) -> Proc:
        """Start ``fakealloc STEPS`` as tenant ``tenant`` (None: without the shim)."""
        p = Proc(
            subprocess.Popen(
                [str(FAKEALLOC), *steps],
                env=self.env(tenant, oom_wait_s),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        self.procs.append(p)
        return p

    def run_allocator(self, tenant: int, *steps: str, oom_wait_s: float = 30.0) -> Proc:
        """Start ``progs/allocator.py STEPS`` (Python, fakegpu) as tenant ``tenant``."""
        p = Proc(
            subprocess.Popen(
                [sys.executable, str(ALLOCATOR), *steps],
                env=self.env(tenant, oom_wait_s),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        self.procs.append(p)
        return p

    def slot(self, pid: int) -> SlotMemory:
        """The gate slot of process ``pid`` (its last record, even after it ended)."""
        gm = GateMemory(self.gate.path)
        try:
            mine = [s for s in gm.slots() if s.pid == pid]
        finally:
            gm.close()
        assert mine, f"pid {pid} has no gate slot"
        return mine[0]


@pytest.fixture
def shared_gpu(built: None, tmp_path: Path) -> Iterator[SharedGpu]:
    """A fresh 1 GiB simulated GPU and its gate; every process is killed afterwards."""
    from krexd.gate import Gate

    gate = Gate.create(str(tmp_path / "gpu0.gate"), 0)
    gpu = SharedGpu(tmp_path, gate)
    yield gpu
    for p in gpu.procs:
        if p.popen.poll() is None:
            p.popen.kill()
        p.popen.wait()
    gate.unmap()
