"""libkrex_shim's out-of-memory handling (libkrex_shim/tenant/memory.c) over the fake driver.

Real processes with the shim preloaded share one simulated GPU of 1 GiB and
one gate; the gate slots are read as krexd reads them.  What is checked:

* a co-tenant's memory makes an allocation wait, and it succeeds once the
  co-tenant frees: the program never sees the error;
* an allocation too large for the card, one with no co-tenant, and one
  inside the tenant's own region fail at once, each recorded with its
  reason; a wait that runs out returns the error after ``oom_wait_s``;
* two tenants each waiting for the other: the later one gives up at once;
* ``mem_mib`` follows allocations and frees, whichever call took the memory.

The tests taking ``gpu_api`` run over the fake CUDA driver and over the fake HIP
runtime (``progs/allocator.py``: over HIP hipMalloc, hipMallocAsync, hipMemCreate,
hipMalloc3D and the arrays): the same judgement, the same wait, the runtime's own
error, the same count.
"""

from __future__ import annotations

import time

import pytest

from tests.support import GpuApi

from .conftest import SharedGpu

# Each runtime's ways to take device memory (allocator.py's via=): CUDA's allocation and
# physical allocation (the virtual-memory API); HIP's, its pitched 3D allocation and its
# arrays (four ways to make one, two to free it).
ALLOCATIONS = [
    ("cuda", "malloc"),
    ("cuda", "memcreate"),
    ("hip", "malloc"),
    ("hip", "memcreate"),
    ("hip", "malloc3d"),
    ("hip", "mallocarray"),
    ("hip", "malloc3darray"),
    ("hip", "arraycreate"),
    ("hip", "array3dcreate"),
]


@pytest.mark.parametrize(
    ("gpu_api", "via"), ALLOCATIONS, indirect=["gpu_api"], ids=[f"{a}-{v}" for a, v in ALLOCATIONS]
)
def test_mem_mib_follows_allocations_and_frees(
    shared_gpu: SharedGpu, gpu_api: GpuApi, via: str
) -> None:
    """The slot's mem_mib is the device memory the process holds: the simulated GPU's use
    (a pitched allocation's padded rows included)."""
    steps = [f"via={via}", "alloc=300M", "alloc=100M", "info", "wait", "free=0", "wait", "free"]
    p = shared_gpu.run_allocator(1, *steps, api=gpu_api)
    assert p.next()["op"] == "start"
    assert [p.next()["rc"] for _ in range(2)] == [gpu_api.success] * 2
    assert p.next() == {"op": "info", "used": 400 << 20}
    assert p.next()["op"] == "wait"
    s = shared_gpu.slot(p.pid)
    assert (s.state, s.tenant, s.mem_mib) == ("active", 1, 400)
    p.go()
    assert p.next()["op"] == "free" and p.next()["op"] == "wait"
    assert shared_gpu.slot(p.pid).mem_mib == 100
    p.go()
    assert p.next()["op"] == "free"
    assert p.finish()[0] == 0
    assert shared_gpu.slot(p.pid).mem_mib == 0


def test_cotenant_oom_waits_until_the_cotenant_frees(shared_gpu: SharedGpu) -> None:
    hog = shared_gpu.start(1, "alloc=700M", "wait", "free=all", "wait")
    assert hog.next()["rc"] == 0 and hog.next()["op"] == "wait"
    t0 = time.monotonic()
    victim = shared_gpu.start(2, "alloc=500M")
    time.sleep(0.4)
    assert victim.popen.poll() is None, "the allocation must wait, not fail"
    assert shared_gpu.slot(victim.pid).oom.waiting
    hog.go()
    got = victim.next()
    waited = time.monotonic() - t0
    assert got["rc"] == 0 and got["name"] == "CUDA_SUCCESS"
    assert 0.4 <= waited < 5.0
    code, err = victim.finish()
    assert code == 0
    rec = shared_gpu.slot(victim.pid).oom
    assert (rec.waited, rec.failed, rec.own, rec.waiting) == (1, 0, 0, False)
    assert "waiting up to 30.0 s" in err and "allocated after waiting" in err


def test_too_large_for_the_card_fails_at_once_as_its_own(shared_gpu: SharedGpu) -> None:
    hog = shared_gpu.start(1, "alloc=300M", "wait")
    assert hog.next()["rc"] == 0
    t0 = time.monotonic()
    big = shared_gpu.start(2, "alloc=300M", "alloc=800M")
    assert big.next()["rc"] == 0
    line = big.next()
    assert line["name"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert time.monotonic() - t0 < 5.0, "an own error must not wait (the wait bound is 30 s)"
    assert big.finish()[0] == 0
    rec = shared_gpu.slot(big.pid).oom
    assert (rec.waited, rec.failed, rec.own, rec.last) == (0, 0, 1, "too_large")


def test_no_cotenant_means_its_own_error(shared_gpu: SharedGpu) -> None:
    outsider = shared_gpu.start(None, "alloc=700M", "wait")  # not a krex tenant
    assert outsider.next()["rc"] == 0
    t0 = time.monotonic()
    p = shared_gpu.start(1, "alloc=500M")
    assert p.next()["name"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert time.monotonic() - t0 < 5.0
    p.finish()
    rec = shared_gpu.slot(p.pid).oom
    assert (rec.own, rec.last) == (1, "alone")


def test_wait_runs_out_then_later_errors_return_at_once(
    shared_gpu: SharedGpu, gpu_api: GpuApi
) -> None:
    hog = shared_gpu.run_allocator(1, "alloc=700M", "wait", api=gpu_api)
    assert hog.next()["op"] == "start" and hog.next()["rc"] == gpu_api.success
    steps = ["alloc=500M", "tolerate", "alloc=400M", "tolerate", "alloc=100M"]
    p = shared_gpu.run_allocator(2, *steps, "alloc=400M", "tolerate", oom_wait_s=1, api=gpu_api)
    code, err = p.finish(30)
    assert code == 0, err
    allocs = [x for x in p.drain() if x["op"] == "alloc"]  # times taken in the process
    oom = gpu_api.out_of_memory
    assert [x["rc"] for x in allocs] == [oom, oom, gpu_api.success, oom]
    assert allocs[0]["ms"] >= 1000, "the first one waited oom_wait_s"
    assert allocs[1]["ms"] < 500, "after a timeout the next one fails at once"
    assert allocs[3]["ms"] >= 1000, "a success in between: this one waited again"
    rec = shared_gpu.slot(p.pid).oom
    assert (rec.waited, rec.failed, rec.own, rec.last) == (0, 3, 0, "timeout")
    assert f"returning {oom}, caused by co-tenants" in err


def test_inside_its_own_region_the_error_returns_at_once(shared_gpu: SharedGpu) -> None:
    hog = shared_gpu.start(1, "alloc=700M", "wait")
    assert hog.next()["rc"] == 0
    shared_gpu.gate.close(2, 1)  # tenant 2 holds the region (its siblings would be frozen)
    try:
        t0 = time.monotonic()
        p = shared_gpu.start(2, "alloc=500M")
        assert p.next()["name"] == "CUDA_ERROR_OUT_OF_MEMORY"
        assert time.monotonic() - t0 < 5.0, "a holder must never wait on its siblings"
        p.finish()
    finally:
        shared_gpu.gate.reopen(2, 1)
    rec = shared_gpu.slot(p.pid).oom
    assert (rec.failed, rec.own, rec.last) == (1, 0, "in_region")


def test_mutual_wait_the_later_tenant_gives_up(shared_gpu: SharedGpu) -> None:
    a = shared_gpu.start(1, "alloc=500M", "wait", "alloc=400M", "wait")
    assert a.next()["rc"] == 0 and a.next()["op"] == "wait"
    b = shared_gpu.start(2, "alloc=400M", "wait", "alloc=300M", "free=all")
    assert b.next()["rc"] == 0 and b.next()["op"] == "wait"
    a.go()  # a waits for memory b holds
    time.sleep(0.3)
    assert shared_gpu.slot(a.pid).oom.waiting
    t0 = time.monotonic()
    b.go()  # b waits for memory a holds: a cycle; b, admitted later, gives up
    assert b.next()["name"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert time.monotonic() - t0 < 5.0
    assert b.next()["op"] == "free"
    assert a.next()["rc"] == 0  # b's free let a through
    assert shared_gpu.slot(b.pid).oom.last == "mutual"
    assert shared_gpu.slot(a.pid).oom.waited == 1


def test_a_wait_in_a_gated_allocation_does_not_stall_a_drain(
    shared_gpu: SharedGpu, gpu_api: GpuApi
) -> None:
    """cuMemAllocAsync (hipMallocAsync) is gated; its wait happens outside the gate, so a
    region can start."""
    hog = shared_gpu.run_allocator(1, "alloc=700M", "wait", "free", api=gpu_api)
    assert hog.next()["op"] == "start" and hog.next()["rc"] == gpu_api.success
    victim = shared_gpu.run_allocator(2, "allocasync=500M", api=gpu_api)
    assert victim.next()["op"] == "start"
    deadline = time.monotonic() + 10
    while not shared_gpu.slot(victim.pid).oom.waiting:
        assert time.monotonic() < deadline, "the allocation never waited"
        time.sleep(0.01)
    shared_gpu.gate.close(3, 1)  # tenant 3 enters a region: tenants 1 and 2 must drain
    try:
        drained = shared_gpu.gate.wait_drained(3, 1, 5.0)
        assert len(drained) == 2  # the waiting process acknowledged with nothing in flight
    finally:
        shared_gpu.gate.reopen(3, 1)
    time.sleep(0.2)
    assert shared_gpu.slot(victim.pid).oom.waiting  # still waiting after the region
    hog.go()
    got = victim.next()
    assert got["op"] == "alloc" and got["rc"] == gpu_api.success and got["ms"] > 200
    assert victim.finish()[0] == 0
