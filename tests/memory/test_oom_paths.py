"""Every out-of-memory path of the driver is handled like an allocation
(``libkrex_shim/tenant/memory.c``).

A full simulated GPU makes the fake driver fail, besides allocations, every
call that needs device memory of its own: launches, module and library
loads, context and stream creation, graph instantiation, upload and launch,
``cuMemCreate``/``cuMemMap``, pool allocations and page-locked host memory
(tests/fakecuda/README.md, ``KREX_FAKE_CALL_BYTES``).  With the shim, such a
failure caused by a co-tenant's memory:

* waits outside the tenant's region until the co-tenant frees, and the
  program never sees the error (the slot records one absorbed wait);
* inside the tenant's own region returns at once, recorded as caused by
  co-tenants (``in_region``): ``krex run`` then exits 75;
* with no co-tenant on the GPU is the tenant's own error (``alone``).
"""

from __future__ import annotations

import time

import pytest

from .conftest import FAKECALL, SharedGpu

CALLS = [
    "launch",
    "launchex",
    "module",
    "library",
    "stream",
    "graphinst",
    "graphparams",
    "graphupload",
    "graphlaunch",
    "memcreate",
    "memmap",
    "alloc",
    "allocasync",
    "allocpool",
    "hostalloc",
    "allochost",
    "hostregister",
]


def _prepared(gpu: SharedGpu, tenant: int, *steps: str):  # type: ignore[no-untyped-def]
    p = gpu.start(tenant, "prepare", "wait", *steps, prog=FAKECALL)
    assert p.next()["rc"] == 0 and p.next()["op"] == "wait"
    return p


def _fill(gpu: SharedGpu, tenant: int | None):  # type: ignore[no-untyped-def]
    hog = gpu.start(tenant, "fill", "wait", "free=all", "wait")
    got = hog.next()
    assert got["op"] == "alloc" and got["rc"] == 0, got
    assert hog.next()["op"] == "wait"
    return hog


def _wait_until_waiting(gpu: SharedGpu, pid: int) -> None:
    deadline = time.monotonic() + 10
    while not any(s.pid == pid and s.oom.waiting for s in gpu.gate.registrations()):
        assert time.monotonic() < deadline, "the call never waited for co-tenants' memory"
        time.sleep(0.01)


@pytest.mark.parametrize("call", CALLS)
def test_a_call_failing_for_a_cotenant_waits_then_succeeds(
    shared_gpu: SharedGpu, call: str
) -> None:
    victim = _prepared(shared_gpu, 2, f"call={call}")
    hog = _fill(shared_gpu, 1)
    victim.go()
    _wait_until_waiting(shared_gpu, victim.pid)
    time.sleep(0.2)
    assert victim.quiet(), "the call must wait while the co-tenant holds the memory"
    hog.go()  # the co-tenant frees everything
    got = victim.next()
    assert (got["call"], got["name"]) == (call, "CUDA_SUCCESS")
    assert got["ms"] >= 200
    assert victim.finish()[0] == 0
    rec = shared_gpu.slot(victim.pid).oom
    assert (rec.waited, rec.failed, rec.own, rec.waiting) == (1, 0, 0, False)


@pytest.mark.parametrize("call", ["ctx", "primary"])
def test_context_creation_waits_for_a_cotenant(shared_gpu: SharedGpu, call: str) -> None:
    hog = _fill(shared_gpu, 1)
    victim = shared_gpu.start(2, f"call={call}", prog=FAKECALL)
    _wait_until_waiting(shared_gpu, victim.pid)
    hog.go()
    got = victim.next()
    assert (got["call"], got["name"]) == (call, "CUDA_SUCCESS")
    assert victim.finish()[0] == 0
    assert shared_gpu.slot(victim.pid).oom.waited == 1


@pytest.mark.parametrize("call", ["launch", "module", "graphlaunch", "memmap", "hostalloc"])
def test_inside_its_region_the_error_returns_at_once_as_the_cotenants(
    shared_gpu: SharedGpu, call: str
) -> None:
    victim = _prepared(shared_gpu, 2, f"call={call}")
    _fill(shared_gpu, 1)
    shared_gpu.gate.close(2, 1)  # tenant 2 holds the region: its siblings would be frozen
    try:
        t0 = time.monotonic()
        victim.go()
        got = victim.next()
        assert got["name"] == "CUDA_ERROR_OUT_OF_MEMORY"
        assert time.monotonic() - t0 < 5.0
    finally:
        shared_gpu.gate.reopen(2, 1)
    code, err = victim.finish()
    assert code == 0
    rec = shared_gpu.slot(victim.pid).oom
    assert (rec.failed, rec.own, rec.last) == (1, 0, "in_region")
    assert "caused by co-tenants" in err


@pytest.mark.parametrize("call", ["launch", "stream", "graphupload", "allocpool"])
def test_without_a_cotenant_the_error_is_its_own(shared_gpu: SharedGpu, call: str) -> None:
    victim = _prepared(shared_gpu, 2, f"call={call}")
    _fill(shared_gpu, None)  # memory held by a process krex does not run
    victim.go()
    got = victim.next()
    assert got["name"] == "CUDA_ERROR_OUT_OF_MEMORY" and got["ms"] < 5000
    victim.finish()
    rec = shared_gpu.slot(victim.pid).oom
    assert (rec.own, rec.failed, rec.last) == (1, 0, "alone")
