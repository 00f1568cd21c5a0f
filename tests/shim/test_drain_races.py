"""The drainer's races with the command's own threads, made deterministic with pause points.

The sibling is ``cu_tenant`` under the test variant of the shim
(``libkrex_shim_test.so``, built with ``-DKREX_TEST_HOOKS``): one of its
threads stops at a named point (``libkrex_shim/gate/testhook.h``) while the
test makes the competing call on another, then goes on.

* ``drain_ctx_claimed``: the drainer holds a context for its
  synchronization; ``cuStreamCreate`` on the command's thread must not wait
  for it (no lock the command needs is held), ``cuCtxDestroy`` of that very
  context must (the driver never synchronizes a freed handle).
* ``drain_stream_claimed``: the same for a stream, while a capture is open.
* ``capture_checked``: a launch into a capturing stream found it capturing
  while the gate is closed (it passes uncounted); the capture's end must
  wait until the launch returned, or the launch would run on the device
  inside the region (the capture lock, ``libkrex_shim/tenant/track.c``).

Also: the L2 flush buffers of more than 16 contexts are one per context,
reused, and go with their context.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from krexd.gate import Gate
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild, tenant_env

from .procs import CuTenant, wait_for

HOLDER = 1
KERNEL_NS = 300_000_000


class Paused:
    """A cu_tenant under the test shim that stops at ``point`` (first arrival)."""

    def __init__(self, build: ShimBuild, fc: FakeCuda, gate: Gate, point: str, tmp: Path):
        self.flag = tmp / f"pause-{point}"
        env = fc.env(
            LD_PRELOAD=str(build.shim_test),
            KREX_TEST_PAUSE=point,
            KREX_TEST_PAUSE_FILE=str(self.flag),
            **tenant_env(gate, 2),
        )
        self.t = CuTenant(build, env)

    def wait_paused(self) -> None:
        wait_for(self.flag.exists, what=f"pause at {self.flag.name}")

    def release(self) -> None:
        self.flag.unlink()


@pytest.fixture
def drained(gate: Gate) -> Iterator[dict[str, object]]:
    """Runs gate.close + drain for the holder in a thread (``start()``); reopens at the end."""
    state: dict[str, object] = {}

    def start(epoch: int) -> None:
        gate.close(HOLDER, epoch)
        state["epoch"] = epoch

        def run() -> None:
            try:
                gate.drain(HOLDER, epoch, 20.0)
                state["drained"] = time.monotonic()
            except Exception as exc:  # reported by the test
                state["error"] = exc

        th = threading.Thread(target=run, daemon=True)
        th.start()
        state["thread"] = th

    state["start"] = start
    yield state
    if "epoch" in state:
        th = state["thread"]
        assert isinstance(th, threading.Thread)
        th.join(30)
        gate.reopen(HOLDER, int(state["epoch"]))  # type: ignore[call-overload]


def assert_pending(t: CuTenant, for_s: float = 0.3) -> None:
    time.sleep(for_s)
    assert t.pending(), "the call did not wait"


def test_ctx_destroy_waits_for_the_drain_syncing_it(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path, drained: dict[str, object]
) -> None:
    """cuCtxDestroy is gated: it parks while the gate is closed, then waits for the claim."""
    p = Paused(shim_build, fc, gate, "drain_ctx_claimed", tmp_path)
    try:
        p.t.run("init ctx")
        p.t.run(f"launch 0 1 {KERNEL_NS}")
        drained["start"](1)  # type: ignore[operator]
        p.wait_paused()  # the drainer claimed the context, about to synchronize it
        r = p.t.run("stream 2")  # the tracking lock is not held across the drain
        assert (r["t1"] - r["t0"]) / 1e6 < 50
        p.t.send("ctxdestroy 0")
        assert_pending(p.t)  # parked at the closed gate
        gate.reopen(HOLDER, 1)  # as a drain timeout would: the destroy passes the gate ...
        drained.pop("epoch")
        assert_pending(p.t)  # ... and waits until the drain lets go of its context
        p.release()
        assert p.t.reply(20)["rc"] == 0
    finally:
        p.t.close()


def test_stream_destroy_waits_for_the_drain_syncing_it(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path, drained: dict[str, object]
) -> None:
    p = Paused(shim_build, fc, gate, "drain_stream_claimed", tmp_path)
    try:
        p.t.run("init")
        p.t.run("stream 1")
        p.t.run("stream 2")
        p.t.run("begin 2 relaxed")  # a capture is open: the drain goes stream by stream
        p.t.run(f"launch 1 1 {KERNEL_NS}")
        drained["start"](2)  # type: ignore[operator]
        p.wait_paused()
        r = p.t.run("stream 3")
        assert (r["t1"] - r["t0"]) / 1e6 < 50
        p.t.send("streamdestroy 1")
        assert_pending(p.t)
        p.release()
        assert p.t.reply(20)["rc"] == 0
        th = drained["thread"]
        assert isinstance(th, threading.Thread)
        th.join(20)
        assert "error" not in drained and "drained" in drained
    finally:
        p.t.close()


def test_capture_end_waits_for_an_uncounted_launch(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path, drained: dict[str, object]
) -> None:
    """Check and launch are one step for the end of the capture: nothing runs in the region."""
    p = Paused(shim_build, fc, gate, "capture_checked", tmp_path)
    try:
        p.t.run("init")
        p.t.run("stream 1")
        p.t.run("bgstart")  # a worker with the context current, made while the gate is open
        p.t.run("begin 1 relaxed")
        drained["start"](3)  # type: ignore[operator]
        wait_for(lambda: "drained" in drained, what="drain")
        closed_at = time.monotonic_ns()
        p.t.send(f"bgrun 1 1 {KERNEL_NS}")  # finds stream 1 capturing: passes uncounted
        p.wait_paused()
        p.t.send("end 1")
        assert_pending(p.t)  # the capture cannot end under the launch
        p.release()
        got = {r["cmd"]: r["rc"] for r in (p.t.reply(20), p.t.reply(20))}
        assert got == {"bglaunch": 0, "end": 0}, got  # captured, then the capture ended
        time.sleep(0.1)
        ran = [r for r in fc.records() if r.pid == p.t.pid and r.end_ns > closed_at]
        assert ran == [], "the launch ran on the device while the gate was closed"
    finally:
        p.t.close()


def test_flush_buffers_of_many_contexts_are_reused_and_go_with_them(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate
) -> None:
    t = CuTenant(shim_build, fc.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, 2)))
    try:
        t.run("init ctx")  # context 0 stays
        base = t.run("meminfo")
        ctxs = [t.run("newctx")["ctx"] for _ in range(20)]
        gate.close(2, 1)  # its own region
        for _ in range(2):  # a second region in each context reuses its buffer
            for c in ctxs:
                t.run(f"usectx {c}")
                assert t.run("region_begin 1 1")["flushed"] == 1
                t.run("region_end")
        gate.reopen(2, 1)
        used = base["free"] - t.run("meminfo")["free"]
        l2 = 50 << 20  # the fake device's L2 (tests/fakecuda/devinfo.c)
        assert used == 20 * l2, used / l2
        for c in ctxs:
            t.run(f"ctxdestroy {c}")
        t.run("usectx 0")
        assert t.run("meminfo")["free"] == base["free"]
    finally:
        t.close()
