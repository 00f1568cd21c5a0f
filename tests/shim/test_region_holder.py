"""``krex_shim_region_begin`` does device work (the L2 flush) only in the gate's holder.

The holder-side entry is exported: a sibling can call it too, while another
tenant's region runs or with the gate open.  It must then refuse
(CUDA_ERROR_NOT_PERMITTED) and put nothing on the device.
"""

from __future__ import annotations

from collections.abc import Callable

from krexd.gate import Gate
from tests.fakecuda import timeline
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild

from .procs import CuTenant
from .test_interpose import HOLDER, records_of, shim_env, tenants  # noqa: F401

NOT_PERMITTED = 800


def test_region_begin_refuses_outside_the_holder(
    shim_build: ShimBuild,
    fc: FakeCuda,
    gate: Gate,
    tenants: Callable[[dict[str, str]], CuTenant],  # noqa: F811
) -> None:
    sib = tenants(shim_env(fc, shim_build, gate, tenant=2))
    sib.run("init")
    sib.send("region_begin 1 1")  # gate open: nobody holds a region
    r = sib.reply()
    assert r["rc"] == NOT_PERMITTED and r["flushed"] == 0, r
    gate.close(HOLDER, 4)
    gate.wait_drained(HOLDER, 4, 5.0)
    sib.send("region_begin 4 1")  # tenant 1's region, tenant 2 calls
    r = sib.reply()
    sib.send("region_begin 0 1")  # an unenforced region's epoch, during tenant 1's
    r0 = sib.reply()
    gate.reopen(HOLDER, 4)
    assert r["rc"] == NOT_PERMITTED and r["flushed"] == 0, r
    assert r0["rc"] == NOT_PERMITTED and r0["flushed"] == 0, r0
    assert not [x for x in records_of(fc, sib.pid) if x.kind == timeline.MEMSET]
    gate.close(2, 5)  # its own region: the flush runs
    gate.wait_drained(2, 5, 5.0)
    assert sib.run("region_begin 5 1")["flushed"] == 1
    sib.run("region_end")
    gate.reopen(2, 5)


def test_an_unenforced_region_begins_while_the_gate_is_open(
    shim_build: ShimBuild,
    fc: FakeCuda,
    gate: Gate,
    tenants: Callable[[dict[str, str]], CuTenant],  # noqa: F811
) -> None:
    # [region] enforce = false or --exclusive: krexd grants epoch 0 and closes nothing.
    t = tenants(shim_env(fc, shim_build, gate, tenant=2))
    t.run("init")
    assert t.run("region_begin 0 1")["flushed"] == 1
    t.run("region_end")
