"""A full state directory: a live krexd is never taken for a dead one.

krexd's state directory is a small tmpfs, filled up once the commands run.
The heartbeat is written in place and needs no new blocks, so the watchdog
(``freeze_bound_s = 3``) does not thaw the siblings of a region held for
three times as long; the state that can no longer be saved is logged once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from tests.fakecuda import timeline
from tests.restarts.test_kill_steps import FAKEGPU, HOLDER, frozen_tenants
from tests.support import fake_driver_env, wait_for
from tests.support.krexd import Krexd

pytestmark = [pytest.mark.root]
Factory = Callable[..., Krexd]
BOUND_S = 3.0


@pytest.fixture
def small_fs() -> Iterator[str]:
    """A 2 MiB tmpfs, unmounted after the test."""
    d = tempfile.mkdtemp(prefix="krex-full-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", d], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], check=False)
        os.rmdir(d)


def fill(path: str) -> None:
    """Write to ``path/fill`` until the file system says ENOSPC."""
    with open(os.path.join(path, "fill"), "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    with pytest.raises(OSError), open(os.path.join(path, "probe"), "wb") as f:
        f.write(b"x" * 8192)
        f.flush()


def test_a_full_state_directory_does_not_thaw_a_live_region(
    krexd_factory: Factory, small_fs: str, built: None
) -> None:
    k = krexd_factory(
        slots=4, config={"daemon": {"freeze_bound_s": BOUND_S, "state_dir": small_fs}}
    )
    env = fake_driver_env(k.env, k.workdir)
    sibs = [
        subprocess.Popen(
            [*k.krex, "run", "--", sys.executable, FAKEGPU, "--seconds", "14"]
            + ["--kernel-ns", "100000", "--sync-every", "4"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    procs = list(sibs)
    try:
        wait_for(lambda: len(k.status()["tenants"]) == 2, what="two siblings")
        time.sleep(1.0)  # the siblings reach the GPU
        fill(small_fs)
        holder = subprocess.Popen(
            [*k.krex, "run", "--", sys.executable, HOLDER, "1", str(BOUND_S * 3000)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        procs.append(holder)
        wait_for(lambda: k.status()["gpus"][0]["holder"] is not None, what="the region")
        held_until = time.monotonic() + BOUND_S * 2.5
        while time.monotonic() < held_until and k.status()["gpus"][0]["holder"] is not None:
            assert len(frozen_tenants(k)) == 2, "a sibling was thawed inside the region"
            time.sleep(0.1)
        assert time.monotonic() >= held_until, "the region ended early"
        codes = [p.wait(60) for p in procs]
        errs = [(p.stderr.read() or b"").decode()[-1500:] for p in procs]
        assert codes == [0, 0, 0], errs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    log = k.log()
    assert "no heartbeat from krexd" not in log  # the watchdog never thawed
    assert "cannot be written" not in log  # the heartbeat never failed
    assert log.count("cannot save state") <= 1  # a failing save is logged once
    out = json.loads((holder.stdout.read() if holder.stdout else b"").decode().splitlines()[-1])
    records = timeline.read(os.path.join(k.workdir, "timeline"))
    inside = sum(
        len(timeline.overlapping(records, s, e, exclude_pid=out["pid"])) for s, e in out["regions"]
    )
    assert inside == 0, f"{inside} sibling kernel(s) inside the region"
    os.unlink(os.path.join(small_fs, "fill"))
    k.stop()
