"""Fixtures: ``gate``, an open gate in the test's temporary directory; ``spawn``,
``gate_tenant`` processes on it; ``fh``, the fake HIP runtime (tests/fakehip) on
this test's own simulated GPU; ``region_tenants``, shimmed tenants of that GPU
and that gate over the fake of ``gpu_api`` (procs.RegionTenant).

Its ``judge`` (krexd's verdict on registrations still pending in a drain)
checks pid and start time only: these tests run no cgroups.

``shim_build`` (tests/conftest.py) builds the shim, the gate library and
the C programs of ``tests/shim/c`` once and points :mod:`krexd.gate` at
that library.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from krexd.gate import Gate
from tests.fakecuda.harness import Build
from tests.fakehip.harness import FakeHip, HipBuild
from tests.support import GpuApi, ShimBuild, forget_gate, make, tenant_env

from .procs import RegionTenant, Tenant, alive_judge


@pytest.fixture
def gate(shim_build: ShimBuild, tmp_path: Path) -> Iterator[Gate]:
    """A fresh gate for GPU 0 in this test's directory."""
    # krexd's judge of pending registrations, without cgroups: pid and start time.
    g = Gate.create(str(tmp_path / "gpu0.gate"), 0, judge=alive_judge)
    yield g
    g.unmap()
    forget_gate(g)


@pytest.fixture
def spawn(shim_build: ShimBuild, gate: Gate, tmp_path: Path) -> Iterator[Callable[..., Tenant]]:
    """Start gate_tenant processes on ``gate``; all are killed at the end."""
    started: list[Tenant] = []

    def start(tenant: int, *args: str) -> Tenant:
        t = Tenant.start(shim_build, gate, tenant, tmp_path, *args)
        started.append(t)
        return t

    yield start
    for t in started:
        t.kill()


@pytest.fixture(scope="session")
def hip_build() -> HipBuild:
    """The fake HIP runtime and hipbench, built once."""
    make("fakehip")
    return HipBuild.default()


@pytest.fixture
def fh(hip_build: HipBuild, fakecuda_build: Build, tmp_path: Path) -> FakeHip:
    """The fake HIP runtime over a simulated GPU that belongs to this test only."""
    return FakeHip(fakecuda_build, tmp_path, hip_build)


@pytest.fixture
def region_tenants(
    gpu_api: GpuApi, shim_build: ShimBuild, fh: FakeHip, gate: Gate
) -> Iterator[Callable[..., RegionTenant]]:
    """``start(tenant, **env)``: a shimmed tenant ``tenant`` of ``gate`` on ``fh``'s
    simulated GPU (``env`` added to its environment), driving ``gpu_api``'s runtime; all
    are closed at the end."""
    started: list[RegionTenant] = []

    def start(tenant: int, **extra: str) -> RegionTenant:
        env = fh.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, tenant), **extra)
        t = RegionTenant(gpu_api, shim_build, env)
        started.append(t)
        return t

    yield start
    for t in started:
        t.close()
