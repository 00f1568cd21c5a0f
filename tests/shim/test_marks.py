"""Thread marks (``libkrex_shim/tenant/marks.h``): a call counted only in its thread's mark is
still drained, in a fork child and at exit too.

A call admitted on the fast path counts in its thread's mark, not in the
slot's shared count that krexd reads.  Each test stops such a call between
its admission and the driver (pause point ``mark_admitted`` of the test
shim, armed once the tenant is set up) and checks on the fake device
timeline that no kernel of it runs inside the region that follows:

* the drainer waits for the mark before it acknowledges;
* a fork child does not wait for a mark its parent's other thread held;
* the exit path waits for the mark before the slot turns EXITING (which
  krexd counts as drained whenever the shared count is zero).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from krexd.gate import Gate, GateTimeout
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild, tenant_env

from .procs import CuTenant, wait_for

HOLDER = 1
KERNEL_NS = 300_000_000


class Armed:
    """A tenant environment under the test shim that stops at ``mark_admitted`` once armed."""

    def __init__(self, build: ShimBuild, fc: FakeCuda, gate: Gate, tmp: Path, skip: int) -> None:
        self.flag = tmp / "paused"
        self.arm_file = tmp / "armed"
        self.env = fc.env(
            LD_PRELOAD=str(build.shim_test),
            KREX_TEST_PAUSE="mark_admitted",
            KREX_TEST_PAUSE_FILE=str(self.flag),
            KREX_TEST_PAUSE_ARM=str(self.arm_file),
            KREX_TEST_PAUSE_SKIP=str(skip),
            **tenant_env(gate, 2),
        )

    def arm(self) -> None:
        self.arm_file.touch()

    def wait_paused(self) -> None:
        wait_for(self.flag.exists, what="a call paused at mark_admitted")

    def release(self) -> None:
        self.flag.unlink()


class Drain:
    """gate.close + gate.drain for the holder in a thread; ``done_ns`` once drained."""

    def __init__(self, gate: Gate, epoch: int, timeout_s: float = 20.0) -> None:
        self.gate, self.epoch = gate, epoch
        self.done_ns: int | None = None
        self.error: BaseException | None = None
        gate.close(HOLDER, epoch)
        self.thread = threading.Thread(target=self._run, args=(timeout_s,), daemon=True)
        self.thread.start()

    def _run(self, timeout_s: float) -> None:
        try:
            self.gate.drain(HOLDER, self.epoch, timeout_s)
            self.done_ns = time.monotonic_ns()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def join(self) -> int:
        self.thread.join(30)
        assert self.error is None, self.error
        assert self.done_ns is not None
        return self.done_ns


@pytest.fixture
def armed(shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path) -> Iterator[Armed]:
    """Pauses the second armed call: ``bglaunchctx``'s launch (its cuCtxSetCurrent passes)."""
    yield Armed(shim_build, fc, gate, tmp_path, skip=1)


def kernels_of(fc: FakeCuda, pid: int) -> list[tuple[int, int]]:
    return [(r.start_ns, r.end_ns) for r in fc.records() if r.pid == pid]


def launch_paused(t: CuTenant, armed: Armed) -> None:
    """A new thread of ``t`` whose launch is admitted on its mark, paused before the driver."""
    t.run("init")
    t.run("stream 1")
    armed.arm()
    t.send(f"bglaunchctx 1 1 {KERNEL_NS}")  # its cuCtxSetCurrent passes (skip 1)
    armed.wait_paused()


def assert_ran_before(fc: FakeCuda, pid: int, drained_ns: int) -> None:
    """The paused launch reached the device and ended before the drain returned."""
    time.sleep(0.05)
    ran = kernels_of(fc, pid)
    assert ran, "the launch never reached the device"
    assert all(end <= drained_ns for _, end in ran), "the kernel ran inside the region"


def test_the_drain_waits_for_a_call_counted_in_its_mark(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, armed: Armed
) -> None:
    t = CuTenant(shim_build, armed.env)
    try:
        launch_paused(t, armed)
        d = Drain(gate, 1)
        time.sleep(0.3)
        assert d.done_ns is None and d.error is None, "drained over a call in flight"
        armed.release()
        assert t.reply(20)["rc"] == 0
        assert_ran_before(fc, t.pid, d.join())
        gate.reopen(HOLDER, 1)
    finally:
        t.close()


FORK_CODE = r"""
import ctypes, os, sys, threading, time
arm, paused = sys.argv[1], sys.argv[2]
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0  # registers (the slot's count)
assert cu.cuInit(0) == 0  # counted in the main thread's mark
open(arm, "w").close()
threading.Thread(target=cu.cuInit, args=(0,), daemon=True).start()  # pauses, its mark set
while not os.path.exists(paused):
    time.sleep(0.001)
os.remove(arm)
pid = os.fork()
if pid == 0:
    cu.cuInit(0)  # the child registers (the driver refuses a forked child) ...
    cu.cuInit(0)  # ... then calls on its own mark
    os.write(1, b"%d\n" % os.getpid())
    time.sleep(60)
    os._exit(0)
os.write(1, b"%d\n" % os.getpid())
time.sleep(60)
"""


def test_a_fork_child_does_not_wait_for_its_parents_marks(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path
) -> None:
    armed = Armed(shim_build, fc, gate, tmp_path, skip=0)
    p = subprocess.Popen(
        [sys.executable, "-c", FORK_CODE, str(armed.arm_file), str(armed.flag)],
        env=armed.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = 0
    try:
        assert p.stdout is not None
        pids = {int(p.stdout.readline()), int(p.stdout.readline())}
        child = (pids - {p.pid}).pop()
        wait_for(
            lambda: {s.pid for s in gate.registrations() if s.state == "active"} >= pids,
            what="parent and child slots",
        )
        gate.close(HOLDER, 2)
        with pytest.raises(GateTimeout) as exc:
            gate.drain(HOLDER, 2, 1.5)
        pending = {s.pid for s in exc.value.pending}
        assert p.pid in pending, "the parent's paused call was not waited for"
        assert child not in pending, "the child waited for a mark of its parent's thread"
        armed.release()
        gate.drain(HOLDER, 2, 10.0)
        gate.reopen(HOLDER, 2)
    finally:
        if child:
            subprocess.run(["kill", "-9", str(child)], check=False)
        p.kill()
        p.wait()


def test_the_exit_path_waits_for_a_call_counted_in_its_mark(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, armed: Armed
) -> None:
    t = CuTenant(shim_build, armed.env)
    try:
        launch_paused(t, armed)
        d = Drain(gate, 3)
        t.send("quit")  # exit begins while the marked call is in flight
        time.sleep(0.3)
        states = {s.state for s in gate.registrations() if s.pid == t.pid}
        assert "exiting" not in states, "EXITING with a marked call in flight"
        assert d.done_ns is None and d.error is None, "drained over a call in flight"
        armed.release()
        assert_ran_before(fc, t.pid, d.join())
        gate.reopen(HOLDER, 3)
    finally:
        t.close()
