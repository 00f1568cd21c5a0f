"""An early fail-closed check never looks at a sibling the kernel has not reported frozen.

Real cgroups and processes (``one_gpu``), the real ``CgroupControl``; the
drain is ``HeldDrain`` (tests/coordinator/test_early_check.py), held with
one sibling pending until the other sibling's check was seen.  The guard
reads each checked sibling's ``cgroup.events`` itself at the moment of the
check.  The early sibling runs many processes, so that its freeze takes
the kernel a while after the write.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from krexd.config import RegionConfig
from krexd.coordinator import Coordinator
from krexd.isolation import AffinityPinner, CgroupControl
from krexd.registrations import Suspect, Unprotected
from krexd.tenants import Tenant
from tests.fakes import Events

from .conftest import OneGpu
from .test_early_check import HeldDrain

pytestmark = [pytest.mark.root]

EXTRA_PROCS = 40
ENTRIES = 5


def _kernel_frozen(t: Tenant) -> bool:
    with open(os.path.join(t.cgroup.freezer_dir, "cgroup.events")) as f:
        return any(line.split() == ["frozen", "1"] for line in f)


class KernelWitness:
    """``GpuUseCheck`` that finds nothing, logging ``("unverified", ids, kernel frozen)``."""

    def __init__(self, events: Events) -> None:
        self.events = events

    def users(self) -> set[int] | None:
        return set()

    def unverified(self, siblings: list[Tenant]) -> list[Suspect]:
        frozen = tuple(_kernel_frozen(t) for t in siblings)
        self.events.add("unverified", tuple(t.id for t in siblings), frozen)
        return []

    def unprotected_among(self, suspects: list[Suspect], epoch: int) -> list[Unprotected]:
        return []


def test_an_early_check_sees_its_sibling_frozen_by_the_kernel(
    one_gpu: Callable[[int], OneGpu],
) -> None:
    g = one_gpu(3)
    holder, early, slow = g.tenants
    for _ in range(EXTRA_PROCS):  # many tasks for the kernel to freeze
        p = subprocess.Popen(["sleep", "60"])
        g.procs.append(p)
        early.cgroup.add_pid(p.pid)
    g.admit(*g.tenants)
    events = Events()
    gate = HeldDrain(events, {slow.id})
    events.on("unverified", gate.release.set)  # the drain goes on once a check was made
    coord: Any = Coordinator(
        0,
        gate,
        g.cpu_slice,
        g.registry,
        RegionConfig(),
        CgroupControl(),
        AffinityPinner(),
        guard=KernelWitness(events),
    )

    async def scenario() -> None:
        pid = g.pid(holder)
        for _ in range(ENTRIES):
            del events.log[:]
            gate.release.clear()
            grant = await coord.enter(holder, pid, pid)
            checks = [e for e in events.log if e[0] == "unverified"]
            assert checks == [
                ("unverified", (early.id,), (True,)),  # early, during the drain
                ("unverified", (slow.id,), (True,)),  # after step 4
            ], events.log
            assert "drain_held_out" not in events.names()
            assert events.names().index("unverified") < events.names().index("drained")
            await coord.exit(holder, grant["epoch"], 0.0, 0)

    asyncio.run(asyncio.wait_for(scenario(), 60))
