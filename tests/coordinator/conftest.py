"""In-process coordinator fixture: real cgroups, real sleeping tenant processes, a real gate.

``one_gpu(n)`` builds a cgroup tree for one fake GPU, ``n`` running tenants
(each a ``sleep`` process in its own tenant cgroup, not yet in the
registry: call ``.admit(t)``), the gate when ``libkrex_gate.so`` is built,
and tears it all down after the test.  Tests drive ``Coordinator`` directly
so that races can be forced in a chosen order.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from krexd.cgroups import CgroupBackend
from krexd.config.config import CgroupConfig, CpuConfig, RegionConfig
from krexd.coordinator import Coordinator
from krexd.coordinator.isolation import AffinityPinner, CgroupControl
from krexd.hardware import inventory
from krexd.hardware.slices import CpuSlice, compute_slices
from krexd.system import paths
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant, TenantRegistry

_names = itertools.count()


@dataclass
class OneGpu:
    """A GPU's cgroups, tenants and gate for an in-process coordinator."""

    backend: CgroupBackend
    cpu_slice: CpuSlice
    registry: TenantRegistry
    gate: Any
    tenants: list[Tenant] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def admit(self, *tenants: Tenant) -> None:
        """Put tenants in the registry (what admission does)."""
        for t in tenants:
            self.registry.add(t)

    def coordinator(self) -> Coordinator:
        return Coordinator(
            0,
            self.gate,
            self.cpu_slice,
            self.registry,
            RegionConfig(),
            CgroupControl(),
            AffinityPinner(),
        )

    def pid(self, t: Tenant) -> int:
        return min(t.pids)


@pytest.fixture
def one_gpu(tmp_path: Any) -> Iterator[Callable[[int], OneGpu]]:
    built: list[OneGpu] = []

    def build(n: int) -> OneGpu:
        backend = CgroupBackend.open(CgroupConfig(name=f"krexco{os.getpid()}n{next(_names)}"))
        slices = compute_slices(inventory.discover(1), CpuConfig(allow_shared=True))
        backend.prepare(slices)
        gate = None
        if paths.gate_library() is not None:
            from krexd.gate import Gate

            gate = Gate.create(os.path.join(str(tmp_path), f"gpu0-{len(built)}.gate"), 0)
        g = OneGpu(backend, slices[0], TenantRegistry(), gate)
        built.append(g)
        for _ in range(n):
            tid = g.registry.new_id()
            cg = backend.create_tenant(0, tid)
            proc = subprocess.Popen(["sleep", "60"])
            cg.add_pid(proc.pid)
            g.procs.append(proc)
            t = Tenant(tid, g.registry.new_token(), 0, ["sleep"], os.getpid(), cg)
            t.pids.add(proc.pid)
            states.change_state(t, states.RUNNING)
            g.tenants.append(t)
        return g

    yield build
    for g in built:
        for p in g.procs:
            p.kill()
            p.wait()
        asyncio.run(g.backend.teardown())
        if g.gate is not None:
            g.gate.unlink()
