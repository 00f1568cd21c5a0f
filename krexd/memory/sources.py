"""Where krexd sees a GPU's memory: NVML, the fake driver's shared state, or nothing.

Each source reads, per GPU, the total, the memory every process uses and
the usage per pid where the driver accounts it, and says who has the GPU
open (``users``).  What each gives: docs/design/memory.md "1. The memory
view"; amdsmi's source is ``krexd.memory.amd_source``, the choice per GPU
``krexd.memory.opening``.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from krex_client.sizes import parse_size
from krexd.hardware.inventory import GpuInfo
from krexd.system.procfs import pid_alive

_log = logging.getLogger("krexd.memory")


@dataclass(frozen=True)
class DeviceMemory:
    """One GPU as a source sees it (bytes).

    ``used`` is None when the source cannot see the whole device, ``per_pid``
    None when it has no per-process figures; ``listed`` the processes it
    lists on the device even without a figure (NVML under MPS), empty when
    it lists none.
    """

    total: int
    used: int | None
    per_pid: dict[int, int] | None
    source: str  # "nvml" | "fake" | "shim"
    listed: frozenset[int] = frozenset()


class Source(Protocol):
    """A device-memory reader for the GPUs krexd manages.

    ``users(gpu)``: the pids (in krexd's namespace) with a context on the GPU,
    or None when the source cannot tell (NVML's compute processes; the fake
    driver's context mask; :class:`NoSource` cannot tell); the fail-closed
    check (``krexd.tenancy.registrations``) compares them with the gate
    registrations.  Processes that died without cleanup are skipped, as the
    drivers reclaim their memory.
    """

    name: str

    def read(self) -> dict[int, DeviceMemory]:
        """GPU index -> its memory now."""
        ...

    def users(self, gpu: int) -> set[int] | None:
        """Pids with a context on GPU ``gpu`` now; None when the source cannot tell."""
        ...

    def close(self) -> None:
        """Release what the source holds."""
        ...


class NoSource:
    """Totals from the inventory; usage left to the shim's count."""

    name = "shim"

    def __init__(self, gpus: list[GpuInfo]) -> None:
        self._totals = {g.index: g.total_mem_bytes for g in gpus}

    def read(self) -> dict[int, DeviceMemory]:
        """GPU index -> total only."""
        return {i: DeviceMemory(t, None, None, self.name) for i, t in self._totals.items()}

    def users(self, gpu: int) -> set[int] | None:
        """Cannot tell: None."""
        return None

    def close(self) -> None:
        """Nothing to release."""


class NvmlSource:
    """NVML's view (raises RuntimeError when NVML is unavailable)."""

    name = "nvml"

    def __init__(self, gpus: list[GpuInfo]) -> None:
        try:
            import pynvml
        except ImportError:
            raise RuntimeError("nvidia-ml-py is not installed") from None
        nv: Any = pynvml
        try:
            nv.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise RuntimeError(f"NVML unavailable: {exc}") from None
        self._nv = nv
        self._handles = {g.index: nv.nvmlDeviceGetHandleByIndex(g.index) for g in gpus}
        # Reads run in a worker thread; close() must not shut NVML down under one.
        self._mu = threading.Lock()
        self._open = True

    def read(self) -> dict[int, DeviceMemory]:
        """GPU index -> NVML's totals and per-process usage ({} once closed)."""
        with self._mu:
            return self._read() if self._open else {}

    def _read(self) -> dict[int, DeviceMemory]:
        out: dict[int, DeviceMemory] = {}
        for index, h in self._handles.items():
            info = self._nv.nvmlDeviceGetMemoryInfo(h)
            per_pid: dict[int, int] = {}
            listed: set[int] = set()
            for p in self._nv.nvmlDeviceGetComputeRunningProcesses(h):
                listed.add(int(p.pid))
                used = getattr(p, "usedGpuMemory", None)
                if used is not None:
                    per_pid[int(p.pid)] = per_pid.get(int(p.pid), 0) + int(used)
            out[index] = DeviceMemory(
                int(info.total), int(info.used), per_pid or None, self.name, frozenset(listed)
            )
        return out

    def users(self, gpu: int) -> set[int] | None:
        """Pids of NVML's live compute processes on ``gpu`` (None once closed or unknown GPU).

        A process that has exited is left out although NVML may still name
        it while its context is torn down: it can submit nothing, the
        driver's lock answers "no such process" for it, and it is nobody's
        foreign process (as the fake driver's list, :class:`FakeStateSource`).
        """
        with self._mu:
            h = self._handles.get(gpu) if self._open else None
            if h is None:
                return None
            listed = {int(p.pid) for p in self._nv.nvmlDeviceGetComputeRunningProcesses(h)}
        return {p for p in listed if pid_alive(p)}

    def close(self) -> None:
        """Shut NVML down (after a read in progress)."""
        with self._mu:
            if not self._open:
                return
            self._open = False
            try:
                self._nv.nvmlShutdown()
            except Exception as exc:
                _log.debug("nvmlShutdown: %s", exc)


# The simulated GPU state file, format "rexfksv3": the table of
# docs/design/interfaces.md ("Simulated GPU memory state") is its declaration
# (krexd/memory/activity.py reads the activity rings after the records).
FAKE_MAGIC = 0x3376736B66786572
FAKE_MAX_GPUS = 16
FAKE_PROCS = 1024
FAKE_USED_OFF = 64  # after the magic and 56 reserved bytes
FAKE_PROCS_OFF = FAKE_USED_OFF + 8 * FAKE_MAX_GPUS
FAKE_PROC_BYTES = 184  # pid, ctx_mask, start_time, used[16], lock words, activity
FAKE_FLAGS_OFF = 156  # in a record: uint32 flags
FAKE_LISTED = 1  # flags: the process allocated or had a context
FAKE_RECORDS_BYTES = FAKE_PROCS_OFF + FAKE_PROCS * FAKE_PROC_BYTES  # what the memory view maps


def _listed(snap: bytes, off: int) -> bool:
    """Whether the record at ``off`` is listed (every cuInit has a record; the
    memory view lists those that allocated or had a context)."""
    (flags,) = struct.unpack_from("<I", snap, off + FAKE_FLAGS_OFF)
    return bool(flags & FAKE_LISTED)


def fake_state_path() -> str:
    """The simulated GPUs' memory-state file (docs/design/interfaces.md gives the rule)."""
    explicit = os.environ.get("KREX_FAKE_STATE")
    if explicit:
        return explicit
    timeline = os.environ.get("KREX_FAKE_TIMELINE")
    if timeline:
        return timeline + ".state"
    return f"/dev/shm/krex-fakecuda-{os.getuid()}.v3"  # the format version: no clash


class FakeStateSource:
    """The simulated GPUs' shared memory accounting, for ``--fake-gpus``.

    Reads the ``rexfksv3`` state file (docs/design/interfaces.md) afresh on
    every :meth:`read`; ``path`` defaults to :func:`fake_state_path`.
    """

    name = "fake"

    def __init__(self, gpus: list[GpuInfo], path: str | None = None) -> None:
        self.path = path or fake_state_path()
        cap = os.environ.get("KREX_FAKE_MEM_BYTES")
        try:
            fake_total = parse_size(cap) if cap else None
        except ValueError:
            _log.warning("KREX_FAKE_MEM_BYTES=%s is not a size; using the inventory's", cap)
            fake_total = None
        self._totals = {
            g.index: fake_total if fake_total is not None else g.total_mem_bytes for g in gpus
        }

    def _snapshot(self) -> bytes | None:
        try:
            with (
                open(self.path, "rb") as f,
                mmap.mmap(f.fileno(), FAKE_RECORDS_BYTES, prot=mmap.PROT_READ) as m,
            ):
                return bytes(m)
        except (OSError, ValueError):
            return None  # no fake-driver process has run yet

    def read(self) -> dict[int, DeviceMemory]:
        """GPU index -> the simulated GPU's usage, by live process."""
        snap = self._snapshot()
        if snap is None or struct.unpack_from("<Q", snap, 0)[0] != FAKE_MAGIC:
            return {i: DeviceMemory(t, 0, {}, self.name) for i, t in self._totals.items()}
        per_gpu: dict[int, dict[int, int]] = {i: {} for i in self._totals}
        for p in range(FAKE_PROCS):
            off = FAKE_PROCS_OFF + p * FAKE_PROC_BYTES
            (pid,) = struct.unpack_from("<i", snap, off)
            if pid <= 0 or not _listed(snap, off) or not pid_alive(pid):
                continue
            used = struct.unpack_from(f"<{FAKE_MAX_GPUS}Q", snap, off + 16)
            for i, by_pid in per_gpu.items():
                if i < FAKE_MAX_GPUS:  # 0 too: the driver knows the process
                    by_pid[pid] = by_pid.get(pid, 0) + used[i]
        return {
            i: DeviceMemory(self._totals[i], sum(per_gpu[i].values()), per_gpu[i], self.name)
            for i in self._totals
        }

    def users(self, gpu: int) -> set[int] | None:
        """Live pids whose context mask has ``gpu`` (an empty set before any process ran)."""
        snap = self._snapshot()
        if snap is None or struct.unpack_from("<Q", snap, 0)[0] != FAKE_MAGIC:
            return set()
        if not 0 <= gpu < FAKE_MAX_GPUS:
            return None
        out: set[int] = set()
        for p in range(FAKE_PROCS):
            off = FAKE_PROCS_OFF + p * FAKE_PROC_BYTES
            pid, mask = struct.unpack_from("<iI", snap, off)
            if pid > 0 and mask & (1 << gpu) and _listed(snap, off) and pid_alive(pid):
                out.add(pid)
        return out

    def close(self) -> None:
        """Nothing held between reads."""
