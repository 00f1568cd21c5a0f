"""The drainer against the fake device timeline: it never keeps the command's
own threads waiting behind the device, an exiting process never
acknowledges a drain it did not synchronize, and an exiting process's
teardown never stalls a drain longer than its own queued work.

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

from krexd.gate import Gate, RegistrationInfo
from tests.fakecuda import timeline
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild, tenant_env

from .procs import CuTenant, alive_judge, wait_for

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
    wait_for(
        lambda: gate.registrations()[0].ack_epoch != 1 and gate.word is not None, what="closure"
    )
    time.sleep(0.2)  # the drainer is inside its synchronization now
    r = t.run("stream 1")
    took_ms = (r["t1"] - r["t0"]) / 1e6
    th.join()
    assert took_ms < 200, f"cuStreamCreate took {took_ms:.1f} ms behind the drain"  # ~1,500 if so
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


# -- an exiting sibling's teardown ---------------------------------------------
#
# cu_tenant's "teardown" exits; an atexit handler it registered before cuInit
# (so it runs after the shim's exit handler, like a library's teardown) then
# makes gated calls when told "go NS": a kernel of NS ns, an allocation and
# its free, a module unload.

TEARDOWN_KERNEL_NS = 200_000_000


def slot_of(gate: Gate, pid: int) -> RegistrationInfo:
    """The slot that ``pid`` owns (any state but free)."""
    mine = [s for s in gate.registrations() if s.pid == pid and s.state != "free"]
    assert len(mine) == 1, f"slots of {pid}: {mine}"
    return mine[0]


def start_teardown(t: CuTenant) -> None:
    """Let ``t`` exit and wait until its teardown handler runs (the shim's has)."""
    t.run("init")
    t.send("teardown")
    assert t.reply()["cmd"] == "teardown"


def test_teardown_calls_park_without_stalling_the_drain(
    fc: FakeCuda, gate: Gate, sibling: Callable[[], CuTenant]
) -> None:
    """Teardown calls after the shim's exit handler park at the closed gate; the drain goes on.

    The exiting sibling has nothing queued: the drain must not wait for it
    (it used to wait for an acknowledgement that its stopped drainer never
    gave while its teardown parked at the gate, until the drain timed out),
    and the teardown's kernel runs after the region.
    """
    t = sibling()
    start_teardown(t)
    assert slot_of(gate, t.pid).state == "exiting"
    gate.close(HOLDER, 1)
    t.send(f"go {TEARDOWN_KERNEL_NS}")
    t0 = time.monotonic()
    gate.drain(HOLDER, 1, 5.0)
    drain_s = time.monotonic() - t0
    start = time.monotonic_ns()
    wait_for(lambda: slot_of(gate, t.pid).blocked_calls >= 1, what="the teardown parked")
    time.sleep(0.3)
    assert t.pending(), "a teardown call passed the closed gate"
    end = time.monotonic_ns()
    gate.reopen(HOLDER, 1)
    r = t.reply()
    assert (r["cmd"], r["rc"]) == ("go", 0), r
    assert t.proc.wait(5) == 0
    assert drain_s < 1.0, f"the drain waited {drain_s:.2f} s for an exiting sibling"
    kernels = [k for k in fc.records() if k.pid == t.pid]
    assert kernels, "the teardown's kernel is on the timeline"
    assert inside(kernels, start, end) == [], "a sibling kernel ran inside the region"


def test_teardown_kernel_in_flight_delays_the_grant_until_it_ends(
    fc: FakeCuda, gate: Gate, sibling: Callable[[], CuTenant]
) -> None:
    """A kernel launched in teardown, before the closure, is waited for, and only it.

    The launch synchronizes before its count drops, so the drain ends when
    the kernel does (not at a drain timeout), and the teardown's later calls
    park until the reopen.
    """
    t = sibling()
    start_teardown(t)
    t.send(f"go {KERNEL_NS}")
    wait_for(lambda: slot_of(gate, t.pid).inflight == 1, what="the teardown launch in flight")
    t0 = time.monotonic_ns()
    start, end = region(gate, 1, timeout_s=5.0)
    drain_s = (start - t0) / 1e9
    r = t.reply()
    assert (r["cmd"], r["rc"]) == ("go", 0), r
    assert t.proc.wait(5) == 0
    kernels = [k for k in fc.records() if k.pid == t.pid]
    assert kernels, "the teardown's kernel is on the timeline"
    assert inside(kernels, start, end) == [], "a sibling kernel ran inside the region"
    assert drain_s < KERNEL_NS / 1e9 + 1.0, f"the drain took {drain_s:.2f} s"
    assert r["t1"] > end, "the teardown's later calls ran inside the region"


def test_sibling_killed_in_teardown_frees_its_slot(
    gate: Gate, sibling: Callable[[], CuTenant]
) -> None:
    """An exiting sibling killed while parked in teardown: krexd judges it gone, as from ACTIVE.

    krexd cannot write the slot (its tenant's sealed memory); it ignores the
    EXITING owner once judged dead, and the next drain does not wait for it.
    """
    t = sibling()
    start_teardown(t)
    gate.close(HOLDER, 1)
    t.send(f"go {TEARDOWN_KERNEL_NS}")
    gate.drain(HOLDER, 1, 5.0)
    wait_for(lambda: slot_of(gate, t.pid).blocked_calls >= 1, what="the teardown parked")
    pid = t.pid
    t.proc.kill()
    t.proc.wait()
    info = slot_of(gate, pid)
    assert info.state == "exiting" and not alive_judge(info), info
    gate.ignore(info)  # krexd's sweep (krexd.orchestration.gatewatch) does this every 100 ms
    info = slot_of(gate, pid)
    assert info.state == "dead" and info.ignored, info
    gate.reopen(HOLDER, 1)
    gate.close(HOLDER, 2)
    gate.drain(HOLDER, 2, 1.0)  # the ignored owner is not waited for
    gate.reopen(HOLDER, 2)
