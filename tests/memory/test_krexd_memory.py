"""GPU memory through the whole stack: krexd, krex run, the shim, the fake driver (1 GiB).

Real krexd (``--fake-gpus 1``, reading the fake driver's memory state), real
cgroups, tenants started by ``krex run`` with the shim preloaded, running
``progs/allocator.py``, which exits 1 on any allocation error as a benchmark
would on ``torch.OutOfMemoryError``.  Checked here:

* ``krexctl status`` shows the GPU's memory and each tenant's usage;
* a declared need (``--mem``) that does not fit waits in the queue; one no
  GPU can hold is refused at once;
* a GPU with an allocation waiting for co-tenants admits nothing meanwhile;
* a command failing on co-tenants' memory exits 75 with one line saying so,
  its own out-of-memory error keeps its exit code;
* a holder whose expected memory does not fit beside its sibling's waits
  with the gate open and the sibling running, and enters once it frees;
* many tenants allocating beyond the card's capacity while a holder runs
  regions: none sees an error its co-tenants caused, nothing deadlocks, the
  holder's own in-region error comes at once, and a command too large for
  the card fails fast with its own error.

The tests taking ``gpu_api`` run over the fake CUDA driver and over the fake HIP
runtime (tests.support.GpuApi): admission, and the shim's out-of-memory wait and
retry (hipMalloc's over HIP, its error hipErrorOutOfMemory).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import GPU_APIS, GpuApi, wait_for
from tests.support.krexd import Krexd

from .conftest import ALLOCATOR, Proc

pytestmark = [pytest.mark.root]

M = 1 << 20


@dataclass
class Stack:
    """A krexd over one fake GPU of 1 GiB, and the environment of its tenants."""

    k: Krexd
    state: Path
    api: GpuApi = GPU_APIS["cuda"]  # the fake its tenants drive

    def env(self) -> dict[str, str]:
        return dict(
            self.api.env(self.k.env, self.k.workdir),
            KREX_FAKE_STATE=str(self.state),
            KREX_FAKE_MEM_BYTES="1G",
        )

    def run(self, *steps: str, mem: str | None = None) -> Proc:
        """``krex run [--mem MEM] -- allocator.py STEPS`` in the background."""
        opts = ["--mem", mem] if mem else []
        return Proc(
            subprocess.Popen(
                [*self.k.krex, "run", *opts, "--", sys.executable, str(ALLOCATOR), *steps],
                env=self.env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )

    def gpu(self) -> dict[str, Any]:
        return dict(self.k.status()["gpus"][0])

    def tenants(self) -> list[dict[str, Any]]:
        return list(self.k.status()["tenants"])


@pytest.fixture
def stack(krexd_factory: Callable[..., Krexd], built: None, tmp_path: Path) -> Callable[..., Stack]:
    def start(slots: int = 4, api: GpuApi = GPU_APIS["cuda"], **memory: Any) -> Stack:
        state = tmp_path / "fakestate"
        k = krexd_factory(
            slots=slots,
            config={"memory": {"refresh_ms": 20, **memory}},
            env={"KREX_FAKE_STATE": str(state), "KREX_FAKE_MEM_BYTES": "1G"},
            args=list(api.krexd_args),
        )
        return Stack(k, state, api)

    return start


# Admission by memory is krexd's (the device's memory read, per process): the same over
# HIP.
def test_status_shows_gpu_memory_and_tenant_usage(
    stack: Callable[..., Stack], gpu_api: GpuApi
) -> None:
    s = stack(headroom="100M", default_need="100M", api=gpu_api)
    p = s.run("alloc=300M", "wait", "free")
    assert p.next(20)["op"] == "start" and p.next()["rc"] == gpu_api.success
    wait_for(lambda: s.gpu()["memory"]["used_bytes"] == 300 * M, 5, "krexd sees 300 MiB used")
    mem = s.gpu()["memory"]
    assert (mem["source"], mem["total_bytes"], mem["free_bytes"]) == ("fake", 1 << 30, 724 * M)
    assert mem["reserved_bytes"] == 100 * M and mem["available_bytes"] == (1024 - 100 - 300) * M
    (t,) = s.tenants()
    assert t["memory"]["used_bytes"] == 300 * M and t["memory"]["used_source"] == "fake"
    assert t["memory"]["exceeded"] and t["memory"]["need_source"] == "default"
    text = subprocess.run(
        [*s.k.krexctl, "status"], env=s.k.env, capture_output=True, text=True, check=True
    ).stdout
    assert "MEMORY GiB" in text and "0.3/1.0 (avail 0.6)" in text
    assert "300 MiB/100 MiB over" in text and "memory (fake): admission on" in text
    p.go()
    assert p.finish()[0] == 0


def test_declared_need_waits_for_memory_and_impossible_need_is_refused(
    stack: Callable[..., Stack], gpu_api: GpuApi
) -> None:
    s = stack(headroom="0", api=gpu_api)
    first = s.run("alloc=600M", "wait", mem="700M")
    assert first.next(20)["op"] == "start"
    second = s.run("alloc=400M", mem="500M")
    wait_for(lambda: s.k.status()["queue"]["parked"] == 1, 10, "the second command parks")
    row = s.k.status()["queue"]["queue"][0]
    assert (row["waiting_for"], row["mem_bytes"], row["mem_gpu"]) == ("memory", 500 * M, 0)
    time.sleep(0.3)
    assert second.popen.poll() is None and second.quiet()
    first.go()
    assert first.finish()[0] == 0
    assert second.next(20)["op"] == "start" and second.next()["rc"] == gpu_api.success
    assert second.finish()[0] == 0
    t0 = time.monotonic()
    refused = s.run("alloc=1M", mem="2G")
    code, err = refused.finish()
    assert code == 65 and "never fits" in err and time.monotonic() - t0 < 10


# The shim's out-of-memory wait and retry (memory.c): the same judgement over HIP, whose
# hipMalloc waits for the co-tenant's memory and whose error is hipErrorOutOfMemory.
def test_an_allocation_waiting_for_cotenants_stops_admission(
    stack: Callable[..., Stack], gpu_api: GpuApi
) -> None:
    s = stack(admission=False, oom_wait_s=20, api=gpu_api)
    hog = s.run("alloc=700M", "wait", "free", "wait")
    assert hog.next(20)["op"] == "start" and hog.next()["rc"] == gpu_api.success
    victim = s.run("alloc=500M", "lasterror")
    assert victim.next(20)["op"] == "start"
    wait_for(lambda: bool(s.gpu()["memory"]["waiting"]), 10, "krexd sees the wait")
    mem = s.gpu()["memory"]
    assert mem["blocked"] is True
    late = s.run("alloc=10M")
    wait_for(lambda: s.k.status()["queue"]["parked"] == 1, 10, "the late command parks")
    time.sleep(0.3)
    assert late.quiet(), "nothing is admitted while an allocation waits for memory"
    hog.go()
    assert victim.next(10)["rc"] == gpu_api.success
    # The attempts that failed while it waited are not the program's last error.
    assert victim.next(10) == {"op": "lasterror", "rc": gpu_api.success}
    assert victim.finish()[0] == 0
    assert late.next(20)["op"] == "start" and late.finish()[0] == 0
    hog.go()
    assert hog.finish()[0] == 0


def test_cotenant_failure_exits_75_own_failure_keeps_its_code(
    stack: Callable[..., Stack], gpu_api: GpuApi
) -> None:
    s = stack(admission=False, oom_wait_s=1, api=gpu_api)
    hog = s.run("alloc=700M", "wait")
    assert hog.next(20)["op"] == "start" and hog.next()["rc"] == gpu_api.success
    victim = s.run("alloc=500M")
    code, err = victim.finish(30)
    lines = [ln for ln in err.splitlines() if ln.startswith("krex:")]
    assert code == 75, err
    assert len(lines) == 1 and "caused by co-tenants" in lines[0] and "exit 75" in lines[0]
    assert "oom_wait_s" in lines[0]
    (failed,) = [x for x in victim.drain() if x["op"] == "alloc"]
    assert failed["rc"] == gpu_api.out_of_memory and failed["ms"] >= 1000
    t0 = time.monotonic()
    own = s.run("alloc=2G")
    code, err = own.finish(30)
    assert code == 1 and "exit 75" not in err
    assert time.monotonic() - t0 < 10
    hog.go()
    assert hog.finish()[0] == 0


@pytest.mark.slow
def test_many_tenants_beyond_capacity_with_a_region_active(stack: Callable[..., Stack]) -> None:
    s = stack(slots=12, admission=False, oom_wait_s=60)
    # The holder maps its L2 flush buffer in a first region, then holds 100 MiB.
    holder = s.run(
        "region=launch=1",
        "alloc=100M",
        "wait",
        *["region=launch=2"] * 15,
        "region=alloc=600M,tolerate,launch=1",
        *["region=launch=2"] * 15,
        "free",
    )
    assert holder.next(20)["op"] == "start"
    assert [holder.next(20)["op"] for _ in range(2)] == ["launch", "region"]
    assert holder.next()["rc"] == "CUDA_SUCCESS"
    assert holder.next()["op"] == "wait"
    cycle = ["alloc=300M", "launch=3", "hold=0.15", "free"]
    siblings = [s.run(*cycle * 3) for _ in range(8)]  # 8 x 300 MiB on a 1 GiB card
    wait_for(lambda: bool(s.gpu()["memory"]["waiting"]), 30, "siblings wait for memory")
    holder.go()  # regions while siblings allocate, wait and free
    too_large = s.run("alloc=1200M")
    code, err = too_large.finish(120)
    assert code == 1 and "exit 75" not in err, err
    (own,) = [x for x in too_large.drain() if x["op"] == "alloc"]
    assert own["rc"] == "CUDA_ERROR_OUT_OF_MEMORY" and own["ms"] < 1000, "its own error, at once"
    waits: list[float] = []
    for sib in siblings:
        code, err = sib.finish(120)
        assert code == 0, err  # no sibling saw an out-of-memory error
        allocs = [x for x in sib.drain() if x["op"] == "alloc"]
        assert len(allocs) == 3 and all(x["rc"] == "CUDA_SUCCESS" for x in allocs)
        waits += [x["ms"] for x in allocs]
    assert max(waits) > 100, "capacity was exceeded: some allocation must have waited"
    code, err = holder.finish(120)
    assert code == 0, err
    lines = holder.drain()
    assert sum(1 for x in lines if x["op"] == "region") == 32  # no region deadlocked
    (in_region,) = [x for x in lines if x["op"] == "alloc" and x["bytes"] == 600 * M]
    assert in_region["ms"] < 1000, "a holder never waits on its frozen siblings"


def test_a_holder_whose_memory_does_not_fit_waits_with_its_sibling_running(
    stack: Callable[..., Stack],
) -> None:
    # The holder's peak (500 MiB, held long enough for krexd to read it) is its
    # expected need; its sibling holds 600 MiB of the 1 GiB card.  The first attempt
    # (gate closed, the drained sibling frozen) is undone: the holder waits with the
    # gate open and its sibling running (its gated launches pass), which frees; the
    # holder enters.
    s = stack(admission=False, region_wait_s=60)
    holder = s.run("alloc=500M", "hold=0.5", "free", "wait", "region=launch=1")
    assert holder.next(20)["op"] == "start" and holder.next()["rc"] == "CUDA_SUCCESS"
    assert [holder.next()["op"] for _ in range(2)] == ["free", "wait"]
    sib = s.run("alloc=600M", "wait", "launch=2", "free", "wait")
    assert sib.next(20)["op"] == "start" and sib.next()["rc"] == "CUDA_SUCCESS"
    assert sib.next()["op"] == "wait"
    holder.go()
    wait_for(lambda: s.gpu()["region"]["memory_waits"] == 1, 20, "the holder waits for memory")
    region = s.gpu()["region"]
    assert region["holder"] is None and region["memory_wait"] is not None
    assert region["regions"]["failed"] == 0
    assert [t["state"] for t in s.tenants()] == ["running", "running"], "nothing left frozen"
    sib.go()  # runs kernels (it is not frozen), then frees
    assert sib.next(20)["op"] == "launch" and sib.next(20)["op"] == "free"
    assert holder.next(20)["op"] == "launch" and holder.next(20)["op"] == "region"
    assert holder.finish()[0] == 0
    region = s.gpu()["region"]
    assert (region["regions"]["granted"], region["regions"]["failed"]) == (1, 0)
    assert region["memory_wait"] is None and region["memory_waits"] == 1
    assert sib.next(20)["op"] == "wait"
    sib.go()
    assert sib.finish()[0] == 0
