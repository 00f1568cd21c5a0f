"""The drainer against the fake device timeline: it never keeps the command's
own threads waiting behind the device, and an exiting process never
acknowledges a drain it did not synchronize.

Each test runs a sibling (``cu_tenant`` under the shim, tenant 2) with
kernels queued on the fake driver, plays the coordinator with krexd.gate
(holder 1), treats the span from the drain's return to the reopen as the
region, and asserts on the timeline that no sibling kernel ran inside it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from krexd.gate import Gate
from tests.fakecuda import timeline
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild, tenant_env

from .procs import CuTenant, wait_for

HOLDER = 1
KERNEL_NS = 1_500_000_000


@pytest.fixture
def sibling(shim_build: ShimBuild, fc: FakeCuda, gate: Gate) -> Iterator[Callable[[], CuTenant]]:
    started: list[CuTenant] = []

    def start() -> CuTenant:
        env = fc.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, 2))
        t = CuTenant(shim_build, env)
        started.append(t)
        return t

    yield start
    for t in started:
        t.close()


def inside(records: list[timeline.Record], start_ns: int, end_ns: int) -> list[timeline.Record]:
    """The records whose execution overlaps [start_ns, end_ns)."""
    return [r for r in records if r.start_ns < end_ns and r.end_ns > start_ns]


def region(gate: Gate, epoch: int, timeout_s: float = 15.0) -> tuple[int, int]:
    """Close, drain, hold 0.3 s, reopen: the region's (start, end) in monotonic ns."""
    gate.close(HOLDER, epoch)
    gate.drain(HOLDER, epoch, timeout_s)
    start = time.monotonic_ns()
    time.sleep(0.3)
    end = time.monotonic_ns()
    gate.reopen(HOLDER, epoch)
    return start, end


def test_stream_create_does_not_wait_for_a_drain(
    fc: FakeCuda, gate: Gate, sibling: Callable[[], CuTenant]
) -> None:
    """cuStreamCreate on the command's thread takes microseconds while a drain syncs."""
    t = sibling()
    t.run("init")
    t.run(f"launch 0 1 {KERNEL_NS}")
    result: dict[str, tuple[int, int]] = {}
    th = threading.Thread(target=lambda: result.update(r=region(gate, 1)))
    th.start()
    wait_for(lambda: gate.slots()[0].ack_epoch != 1 and gate.word is not None, what="closure")
    time.sleep(0.2)  # the drainer is inside its synchronization now
    r = t.run("stream 1")
    took_ms = (r["t1"] - r["t0"]) / 1e6
    th.join()
    assert took_ms < 50, f"cuStreamCreate took {took_ms:.1f} ms behind the drain"
    start, end = result["r"]
    assert inside(fc.records(), start, end) == []


def test_exit_without_sync_is_not_acknowledged(
    fc: FakeCuda, gate: Gate, sibling: Callable[[], CuTenant], tmp_path: Path
) -> None:
    """A sibling exiting with a kernel queued, its stdio still flushing, is drained.

    Its exit blocks in the final flush of a FIFO until the test reads it; a
    drain during that exit must not be acknowledged before the kernel ended.
    """
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        t = sibling()
        t.run("init")
        t.run(f"launch 0 1 {KERNEL_NS}")
        t.send(f"exitflush {fifo}")
        time.sleep(0.2)  # exiting: past the shim's exit path, or in it
        assert t.proc.poll() is None
        result: dict[str, tuple[int, int]] = {}
        th = threading.Thread(target=lambda: result.update(r=region(gate, 1)))
        th.start()
        th.join(KERNEL_NS / 1e9 + 1.0)
        # Let the exit finish: read what it flushes.
        while t.proc.poll() is None:
            try:
                os.read(reader, 1 << 16)
            except BlockingIOError:
                time.sleep(0.01)
        th.join(10)
        assert not th.is_alive()
        start, end = result["r"]
        kernels = [r for r in fc.records() if r.pid == t.pid]
        assert kernels, "the sibling's kernel is on the timeline"
        assert inside(kernels, start, end) == [], "a sibling kernel ran inside the region"
    finally:
        os.close(reader)
