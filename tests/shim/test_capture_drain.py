"""A capture begun on a stream with work still queued: the drain waits for that work.

"Warm up on stream s, then cuStreamBeginCapture(s)" without a synchronize in
between leaves the warm-up queued on a stream the drain cannot synchronize
(a stream synchronize of a capturing stream would invalidate the capture).
The shim records an event on the stream just before the capture begins and
the drainer synchronizes it (in relaxed capture mode, which never breaks a
capture: tests/fakecuda/README.md).  The capture must still end cleanly.
"""

from __future__ import annotations

import time

import pytest

from krexd.gate import Gate
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild, tenant_env

from .procs import CuTenant
from .test_marks import HOLDER, Drain, kernels_of

WARMUP_NS = 400_000_000


@pytest.mark.parametrize("mode", ["global", "thread", "relaxed"])
def test_the_drain_waits_for_work_queued_before_a_capture_began(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, mode: str
) -> None:
    t = CuTenant(shim_build, fc.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, 2)))
    try:
        t.run("init")
        t.run("stream 1")
        t.run(f"launch 1 1 {WARMUP_NS}")  # the warm-up, still running
        t.run(f"begin 1 {mode}")  # no synchronize in between
        t.run("launch 1 3 1000")  # captured
        d = Drain(gate, 1, timeout_s=5.0)
        drained = d.join()
        reopened = time.monotonic_ns()
        gate.reopen(HOLDER, 1)
        ran = kernels_of(fc, t.pid)
        assert ran, "the warm-up never ran"
        inside = [k for k in ran if k[1] > drained and k[0] < reopened]
        assert not inside, f"the warm-up ran inside the region: {inside}"
        t.run("end 1")  # 901 if the drain had invalidated the capture
    finally:
        t.close()
