"""A restarted krexd maps the same gate file again (adoption, krexd/restarts/adopt.py).

Tenants map the gate read-only and keep their mapping of that very file, so
a restarted krexd must write the same file: ``Gate.open`` maps it
read-write (only a file krexd made: root's, written by nobody else, this
layout and GPU), the tenants' slot memories are attached again and the
epoch is seeded so that none repeats.  The tenant here is a real
``gate_tenant`` process registered before the "restart".
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from krexd.gate import Gate, GateError, keep_path
from tests.support import ShimBuild, forget_gate

from .procs import Tenant, alive_judge, slot_of

HOLDER = 1


def _make(tmp_path: Path) -> Gate:
    path = str(tmp_path / "gpu0.gate")
    os.makedirs(os.path.dirname(keep_path(path)), mode=0o700)
    return Gate.create(path, 0, keep=keep_path(path), judge=alive_judge)


@pytest.mark.root  # makes a gate the shim maps (root-owned only)
def test_restarted_krexd_drains_through_the_same_gate(
    shim_build: ShimBuild, tmp_path: Path
) -> None:
    old = _make(tmp_path)
    t = Tenant.start(shim_build, old, 2, tmp_path, "--threads", "2", "--call-us", "50")
    new: Gate | None = None
    try:
        t.wait_ready(calls=100)
        for epoch in (1, 2, 3):
            old.close(HOLDER, epoch)
            old.drain(HOLDER, epoch, 5.0)
            old.reopen(HOLDER, epoch)
        fds = old.__dict__.pop("_test_slot_fds")
        old.unmap()  # krexd is gone; the tenant keeps running on its mapping
        new = Gate.open(old.path, 0, keep_path(old.path), judge=alive_judge)
        new.__dict__["_test_slot_fds"] = fds
        assert new.registrations() == [], "nothing attached yet"
        # The gate is open (word 0), yet its header keeps the last epoch closed:
        # without a seed, the new krexd continues from it (layout 9).
        assert new.epoch == 3
        new.attach(2, fds[2])
        assert new.audit() == [], "acknowledgements of epochs 1-3 are honest"
        new.set_epoch(3)
        slot = t.stats()["slot"]
        assert slot_of(new, 2, slot).ack_epoch == 3
        # The tenant parks on the gate it mapped before the restart.
        new.close(HOLDER, 4)
        acked = new.wait_drained(HOLDER, 4, 5.0)
        assert [s.index for s in acked] == [slot]
        s1 = t.stats()
        assert s1["started"] == s1["finished"]
        time.sleep(0.2)
        assert t.stats()["started"] == s1["started"], "a call passed the closed gate"
        new.reopen(HOLDER, 4)
    finally:
        t.kill()
        for g in (old, new):
            if g is not None:
                g.unmap()
                forget_gate(g)


def test_open_refuses_a_gate_krexd_did_not_make(shim_build: ShimBuild, tmp_path: Path) -> None:
    g = _make(tmp_path)
    g.unmap()
    with pytest.raises(GateError) as wrong_gpu:
        Gate.open(g.path, 1, keep_path(g.path))
    assert wrong_gpu.value.errno == errno.EPROTO
    os.chmod(keep_path(g.path), 0o666)  # the same inode: both names
    with pytest.raises(GateError) as writable:
        Gate.open(g.path, 0, keep_path(g.path))
    assert writable.value.errno == errno.EPERM
