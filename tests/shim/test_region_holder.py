"""``krex_shim_region_begin`` does device work (the L2 flush) only in the gate's holder.

The holder-side entry is exported: a sibling can call it too, while another
tenant's region runs or with the gate open.  It must then refuse
(CUDA_ERROR_NOT_PERMITTED) and put nothing on the device.  Over both fakes
(``gpu_api``): a HIP process's flush is a HIP memset, under the same rule.
"""

from __future__ import annotations

from collections.abc import Callable

from krexd.gate import Gate
from tests.fakecuda import timeline
from tests.fakehip.harness import FakeHip

from .procs import RegionTenant
from .test_interpose import HOLDER, records_of

NOT_PERMITTED = 800


def test_region_begin_refuses_outside_the_holder(
    fh: FakeHip, gate: Gate, region_tenants: Callable[..., RegionTenant]
) -> None:
    sib = region_tenants(2)
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
    assert not [x for x in records_of(fh, sib.pid) if x.kind == timeline.MEMSET]
    gate.close(2, 5)  # its own region: the flush runs
    gate.wait_drained(2, 5, 5.0)
    assert sib.run("region_begin 5 1")["flushed"] == 1
    sib.run("region_end")
    gate.reopen(2, 5)
    assert len([x for x in records_of(fh, sib.pid) if x.kind == timeline.MEMSET]) == 1


def test_an_unenforced_region_begins_while_the_gate_is_open(
    region_tenants: Callable[..., RegionTenant],
) -> None:
    # [region] enforce = false or --exclusive: krexd grants epoch 0 and closes nothing.
    t = region_tenants(2)
    t.run("init")
    assert t.run("region_begin 0 1")["flushed"] == 1
    t.run("region_end")
