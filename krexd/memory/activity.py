"""Which processes ran GPU work on a GPU during a window, from the fake driver's records.

The model of NVML's per-process utilization for ``--fake-gpus``: the fake
driver (its ``activity.c``) keeps, in its shared state file, a ring
of each process's last 256 operation intervals (kernels, memsets, copies,
graph launches; never work captured into a graph) with the simulated GPU
each ran on.  The layout is declared in docs/design/interfaces.md
("Simulated GPU memory state"); :mod:`krexd.memory.sources` holds the
record constants this module shares.  Nothing here needs the fake driver
built: a missing file or one of another format reads as no activity.
"""

from __future__ import annotations

import os
import struct
import time

from krexd.hardware.inventory import GpuInfo
from krexd.memory.sources import (
    FAKE_MAGIC,
    FAKE_PROC_BYTES,
    FAKE_PROCS,
    FAKE_PROCS_OFF,
    FAKE_RECORDS_BYTES,
    fake_state_path,
)

RING_OPS = 256  # intervals kept per process
RING_ENTRY_BYTES = 32  # uint64 seq, start_ns, end_ns; uint32 gpu; 4 reserved
RINGS_OFF = FAKE_RECORDS_BYTES  # ring i belongs to process record i
FILE_BYTES = RINGS_OFF + FAKE_PROCS * RING_OPS * RING_ENTRY_BYTES
OPS_OFF = 176  # in a record: uint64 operations recorded so far
_ENTRY = struct.Struct("<QQQI4x")


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of half-open intervals (ns)."""
    total, cur_start, cur_end = 0, -1, -1
    for start, end in sorted(intervals):
        if start > cur_end:
            total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + cur_end - cur_start


class FakeActivitySource:
    """Per-process GPU activity of the simulated GPUs.

    ``path``: the fake driver's state file, default
    :func:`krexd.memory.sources.fake_state_path`.  Reads the file afresh on
    every call; holds nothing open.
    """

    #: Exact: every operation interval is recorded (the witness ends offenders).
    exact = True

    def __init__(self, path: str | None = None) -> None:
        self.path = path or fake_state_path()

    def busy(self, gpu_index: int, t0_ns: int, t1_ns: int) -> dict[int, int]:
        """Processes whose operations on ``gpu_index`` overlap ``(t0_ns, t1_ns)``.

        Times are CLOCK_MONOTONIC ns (``time.monotonic_ns()``), the window
        and each operation half-open, as the fake driver's timeline reader has them.
        Returns pid -> ns of the window covered by that pid's operations
        (the union, so overlapping streams count once; a zero-length
        operation inside the window lists the pid with 0).  Processes that
        died are included: their enqueued work still ran.  Exact for a pid
        whose oldest kept operation (of its last 256) started before
        ``t0_ns``; otherwise its figure is a lower bound.  An absent or
        foreign-format file gives ``{}``; ``t1_ns <= t0_ns`` gives ``{}``.
        """
        if t1_ns <= t0_ns:
            return {}
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return {}  # no fake-driver process has run yet
        try:
            head = os.pread(fd, FAKE_RECORDS_BYTES, 0)
            if len(head) < FAKE_RECORDS_BYTES or struct.unpack_from("<Q", head, 0)[0] != FAKE_MAGIC:
                return {}  # another format
            return self._scan(fd, head, gpu_index, t0_ns, t1_ns)
        finally:
            os.close(fd)

    def _scan(self, fd: int, head: bytes, gpu: int, t0: int, t1: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for p in range(FAKE_PROCS):
            off = FAKE_PROCS_OFF + p * FAKE_PROC_BYTES
            (pid,) = struct.unpack_from("<i", head, off)
            if pid <= 0 or struct.unpack_from("<Q", head, off + OPS_OFF)[0] == 0:
                continue
            hits = self._ring(fd, p, off, gpu, t0, t1)
            if hits:
                out[pid] = out.get(pid, 0) + _union_ns(hits)
        return out

    @staticmethod
    def _ring(fd: int, p: int, off: int, gpu: int, t0: int, t1: int) -> list[tuple[int, int]]:
        """The record's kept operations on ``gpu`` overlapping the window, clipped."""
        size = RING_OPS * RING_ENTRY_BYTES
        ring = os.pread(fd, size, RINGS_OFF + p * size)
        # Read after the ring: an entry rewritten during the copy has a sequence
        # number at most ops - RING_OPS by now, so it is dropped (interfaces.md).
        ops_bytes = os.pread(fd, 8, off + OPS_OFF)
        if len(ring) < size or len(ops_bytes) < 8:
            return []  # a file cut short
        (ops,) = struct.unpack("<Q", ops_bytes)
        hits: list[tuple[int, int]] = []
        for i in range(RING_OPS):
            seq, start, end, g = _ENTRY.unpack_from(ring, i * RING_ENTRY_BYTES)
            if not (ops - RING_OPS < seq <= ops and (seq - 1) % RING_OPS == i):
                continue
            if g == gpu and start < t1 and end > t0:
                hits.append((max(start, t0), min(end, t1)))
        return hits


class NvmlActivitySource:
    """Per-process GPU activity of real GPUs: NVML's per-process utilization samples.

    ``nvmlDeviceGetProcessUtilization(handle, since_us)`` returns, per
    process, samples (wall-clock µs) of its SM utilization (%).  The driver
    samples on its own period, so a window shorter than that period may
    show nothing and a sample may straddle the window's edge: the source is
    not exact (``exact = False``): the witness flags what it saw and ends
    nobody on it (docs/design/driver-lock.md gives the measured period).
    ``uuids``: GPU index -> its UUID (``krexd.hardware.inventory.GpuInfo.uuid``); NVML is
    initialized and each handle looked up on first use.
    """

    exact = False

    def __init__(self, uuids: dict[int, str]) -> None:
        self._uuids = uuids
        self._handles: dict[int, object] = {}

    def _handle(self, gpu_index: int) -> object | None:
        import pynvml

        if gpu_index not in self._handles and gpu_index in self._uuids:
            pynvml.nvmlInit()
            self._handles[gpu_index] = pynvml.nvmlDeviceGetHandleByUUID(self._uuids[gpu_index])
        return self._handles.get(gpu_index)

    def busy(self, gpu_index: int, t0_ns: int, t1_ns: int) -> dict[int, int]:
        """pid -> an estimate of its SM-busy ns inside the window (CLOCK_MONOTONIC ns).

        Each sample of a process whose time falls inside the window counts
        its SM utilization times the sampling period it covers (the time
        since that process's previous sample, at most the window).
        Raises ``OSError`` when NVML fails.
        """
        import pynvml

        try:
            handle = self._handle(gpu_index)
        except pynvml.NVMLError as exc:
            raise OSError(f"NVML: {exc}") from None
        if handle is None:
            return {}
        offset_ns = time.time_ns() - time.monotonic_ns()
        w0, w1 = (t0_ns + offset_ns) // 1000, (t1_ns + offset_ns) // 1000
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, w0)
        except pynvml.NVMLError as exc:
            if "Not Found" in str(exc):
                return {}  # no sample since w0
            raise OSError(f"NVML process utilization: {exc}") from None
        out: dict[int, int] = {}
        last: dict[int, int] = {}
        for s in sorted(samples, key=lambda s: int(s.timeStamp)):
            ts, pid = int(s.timeStamp), int(s.pid)
            if w0 <= ts <= w1 and int(s.smUtil) > 0:
                span_us = min(ts - last.get(pid, w0), w1 - w0) or 1
                out[pid] = out.get(pid, 0) + int(s.smUtil) * span_us * 10  # % of µs -> ns
            last[pid] = ts
        return out


def activity_source(infos: list[GpuInfo], fake_gpus: int) -> FakeActivitySource | None:
    """The region witness's exact source: the fake driver's records for simulated GPUs.

    None for real GPUs: NVML's per-process samples average about a second
    each (measured: a 200 ms burst read as 13 %, a 10 ms one as 1 %, one
    sample per query), too coarse to attribute work to a millisecond region;
    the witness then reports the driver lock's coverage instead
    (``krexd.coordinator.witness``).  ``NvmlActivitySource`` stays for
    regions long enough to be sampled.
    """
    del infos
    return FakeActivitySource() if fake_gpus else None
