"""Gated calls abandoned by their thread (docs/design/shim.md "Abandoned calls").

A C benchmark's SIGALRM watchdog that siglongjmps out of a driver call, or a
thread cancelled inside one, never reaches the call's leave: its count (the
thread's mark, or the slot's shared count) would stay taken, every later
drain would time out, and the thread's later calls would pass the closed gate
as "nested".  The shim finds the abandoned frame at the thread's next call
(its frame lies at or above the abandoned one) and at thread exit.

Each test: the abandoned call is a synchronous copy waiting in the fake
driver for a kernel; a drain then starts and the thread calls again (or has
ended).  The drain must finish and no kernel of the sibling may run inside
the region.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from krexd.gate import Gate
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild, tenant_env

from .procs import CuTenant
from .test_marks import HOLDER, Drain, kernels_of

KERNEL_NS = 400_000_000


def sibling(build: ShimBuild, fc: FakeCuda, gate: Gate, marks: str) -> CuTenant:
    env = fc.env(LD_PRELOAD=str(build.shim), KREX_SHIM_THREAD_MARKS=marks, **tenant_env(gate, 2))
    t = CuTenant(build, env)
    t.run("init")
    return t


@pytest.mark.parametrize("marks", ["1", "0"])
def test_a_longjmp_out_of_a_driver_call_does_not_leave_the_thread_counted(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path, marks: str
) -> None:
    t = sibling(shim_build, fc, gate, marks)
    try:
        assert t.run("jmpcopy 50000000")["rc"] == 0  # registered; copy completes
        t.send(f"jmpcopy {KERNEL_NS}")
        r = t.reply(5)
        assert r["rc"] == 1, f"the watchdog did not jump out of the copy: {r}"
        time.sleep(KERNEL_NS / 1e9)  # the kernel it waited for is done
        d = Drain(gate, 1, timeout_s=3.0)
        t.send("launch 0 1 1000000")  # the same thread calls again: parks at the closed gate
        drained = d.join()
        time.sleep(0.2)
        reopened = time.monotonic_ns()
        gate.reopen(HOLDER, 1)
        assert t.reply(5)["rc"] == 0
        time.sleep(0.05)
        inside = [k for k in kernels_of(fc, t.pid) if k[1] > drained and k[0] < reopened]
        assert not inside, f"a kernel ran inside the region: {inside}"
    finally:
        t.close()


def test_a_thread_cancelled_inside_a_driver_call_does_not_hold_the_drain(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path
) -> None:
    t = sibling(shim_build, fc, gate, "1")
    try:
        t.send(f"cancelcopy {KERNEL_NS}")
        r = t.reply(5)
        assert r["rc"] == 1, f"the copy thread was not cancelled: {r}"
        time.sleep(KERNEL_NS / 1e9)
        gate.close(HOLDER, 2)
        try:
            gate.drain(HOLDER, 2, 3.0)
        finally:
            gate.reopen(HOLDER, 2)
    finally:
        t.close()
